"""verl finds calibrl by itself: pyproject.toml registers ``calibrl.verl`` in the ``verl.plugins`` entry-point group,
which verl 0.9 loads when it is imported (``VERL_USE_EXTERNAL_PLUGINS=auto``, its default). Runs in .venv-verl
(scripts/setup_verl_env.sh); the main .venv has no verl and skips this file.

The entry point is read from metadata built here from the checkout's pyproject.toml (put first on the path), so the
test checks what this tree declares, whichever calibrl the environment has installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parents[1]
ESTIMATORS = ("capo", "grpo_mask", "seed_grpo", "gcpo")


@pytest.fixture(scope="module")
def metadata_dir(tmp_path_factory) -> Path:
    """calibrl's dist-info as a wheel build would write it (entry_points.txt included), in a folder of its own."""
    out = tmp_path_factory.mktemp("calibrl-metadata")
    build = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta as b; b.prepare_metadata_for_build_wheel({str(out)!r})"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    return out


# what the plugin patches in verl once imported (checked in one of the runs below: each run imports verl, ~15 s)
PATCHES = """
import sys
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1 import trainer_base, utils
assert 'calibrl.verl' in sys.modules
assert ray_trainer.compute_advantage._calibrl_wrapped and ray_trainer.RayPPOTrainer._calibrl_patched
assert utils.compute_advantage is ray_trainer.compute_advantage
assert trainer_base.PPOTrainer._calibrl_patched and type(trainer_base.tq).__name__ == '_QueueProxy'
print('patched')
"""


def _verl_resolves(metadata_dir: Path, then: str = "", **env: str) -> subprocess.CompletedProcess:
    """``import verl`` in a fresh process, then verl's own lookup of each estimator; prints what resolved on its
    first line (then runs ``then``)."""
    code = f"""
    import verl
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    found = []
    for name in {ESTIMATORS!r}:
        try:
            fn = get_adv_estimator_fn(name)
        except ValueError:
            continue
        found.append(name if getattr(fn, "calibrl_estimator", None) == name else name + "?")
    print(" ".join(found))
    """
    code = textwrap.dedent(code) + then
    clean = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    clean["PYTHONPATH"] = os.pathsep.join([str(metadata_dir), str(ROOT)])
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], env={**clean, **env},
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_pyproject_declares_the_plugin(metadata_dir):
    (dist_info,) = metadata_dir.glob("calibrl-*.dist-info")
    text = (dist_info / "entry_points.txt").read_text()
    assert "[verl.plugins]" in text and "calibrl = calibrl.verl" in text, text


def test_import_verl_registers_calibrl_without_the_variable(metadata_dir):
    run = _verl_resolves(metadata_dir)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == list(ESTIMATORS), run.stdout


def test_the_variable_still_works_and_together_they_register_once(metadata_dir):
    alone = _verl_resolves(metadata_dir, VERL_USE_EXTERNAL_MODULES="calibrl.verl", VERL_USE_EXTERNAL_PLUGINS="none")
    both = _verl_resolves(metadata_dir, PATCHES, VERL_USE_EXTERNAL_MODULES="calibrl.verl")
    for run in (alone, both):
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.splitlines()[0].split() == list(ESTIMATORS), run.stdout
    assert both.stdout.splitlines()[1:] == ["patched"], both.stdout  # the advantage step and the trainers too


def test_without_either_verl_has_none_of_them(metadata_dir):
    """The control: with verl's plugin discovery off and no variable, the names do not resolve, so the passes
    above come from the entry point."""
    run = _verl_resolves(metadata_dir, VERL_USE_EXTERNAL_PLUGINS="none")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == [], run.stdout
