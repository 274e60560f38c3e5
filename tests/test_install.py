"""What a core install (``pip install calibrl``, no extra) must do: the core modules import without the packages
of the extras, and each command that needs an extra says which one in one line (exit 2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
EXTRA_PACKAGES = ("transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "gguf")

# A stand-in for the two verl registries calibrl.verl writes into, so that importing the plugin runs without verl
# (whose own imports would bring transformers): the check is about calibrl's modules only.
_FAKE_VERL = """
import sys, types
core_algos = types.ModuleType("verl.trainer.ppo.core_algos")
core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.POLICY_LOSS_REGISTRY = {}, {}
def _registrar(registry):
    return lambda name: (lambda fn: registry.setdefault(name, fn))
core_algos.register_adv_est = _registrar(core_algos.ADV_ESTIMATOR_REGISTRY)
core_algos.register_policy_loss = _registrar(core_algos.POLICY_LOSS_REGISTRY)
for name in ("verl", "verl.trainer", "verl.trainer.ppo"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["verl.trainer.ppo"].core_algos = core_algos
sys.modules["verl.trainer.ppo.core_algos"] = core_algos
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def _loaded_extras(imports: str, prelude: str = "") -> list[str]:
    run = _run(f"""{prelude}
import sys
{imports}
print(sorted({{m.split(".")[0] for m in sys.modules}} & {set(EXTRA_PACKAGES)!r}))
""")
    assert run.returncode == 0, run.stderr[-3000:]
    return eval(run.stdout.strip().splitlines()[-1])  # noqa: S307 - our own subprocess's printed list


def test_the_core_modules_import_none_of_the_extras():
    core = """
import calibrl, calibrl.metrics, calibrl.selection, calibrl.posthoc, calibrl.tasks.rewards
from calibrl import RolloutBatch, compute_advantages, available_estimators
import calibrl.losses, calibrl.evaluation.samples, calibrl.evaluation.readers, calibrl.evaluation.pipeline
from calibrl.evaluation.readers import base, lm_eval, openai, trl, verl, vllm
import calibrl.cli
"""
    assert _loaded_extras(core) == []


def test_the_verl_plugin_imports_none_of_the_extras():
    assert _loaded_extras("import calibrl.verl\nassert 'capo' in calibrl.verl.registered_names()",
                          prelude=_FAKE_VERL) == []


def test_the_check_sees_an_extra_that_is_imported():
    """The check above is not blind: a module that loads transformers is reported."""
    pytest.importorskip("transformers")
    assert "transformers" in _loaded_extras("import calibrl.metrics, transformers")


@pytest.mark.parametrize(("argv", "hidden", "line"), [
    (["train", "tiny_cpu"], "trl", "error: calibrl train needs TRL: install calibrl's [trl] extra (from a clone: pip install '.[trl]')"),
    (["train", "--list"], "trl", "error: calibrl train needs TRL: install calibrl's [trl] extra (from a clone: pip install '.[trl]')"),
    (["demo", "--quick"], "trl", "error: calibrl demo needs TRL: install calibrl's [trl] extra (from a clone: pip install '.[trl]')"),
    (["generate", "-m", "builtin:tiny", "-d", "math500", "-o", "x.jsonl"], "transformers",
     "error: calibrl generate needs transformers: install calibrl's [generate] extra (from a clone: pip install '.[generate]')"),
])
def test_a_command_without_its_extra_says_which_in_one_line(argv, hidden, line):
    """The missing package is simulated by a None entry in sys.modules (what Python does for a blocked import);
    each hides the first package its extra's check looks for, so the line is the same in a core install."""
    run = _run(f"""
import sys
sys.modules[{hidden!r}] = None
sys.argv = ["calibrl", *{argv!r}]
from calibrl.cli import main
main()
""")
    assert run.returncode == 2, (run.stdout, run.stderr[-3000:])
    assert run.stderr.strip() == line and run.stdout == ""


def test_the_extra_checks_name_packages_the_extras_install():
    """Every module a command checks for is a requirement of the extra its message names (same names here)."""
    from calibrl.cli.app import EXTRA_MODULES

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def names(extra: str) -> set[str]:
        out = set()
        for spec in extras[extra]:
            req = Requirement(spec)
            out |= names(next(iter(req.extras))) if req.name == "calibrl" else {req.name}
        return out

    for extra, modules in EXTRA_MODULES.items():
        assert set(modules) <= names(extra), (extra, set(modules) - names(extra))
    core = {Requirement(spec).name for spec in project["dependencies"]}
    assert not core & set(EXTRA_PACKAGES), core & set(EXTRA_PACKAGES)
    assert names("all") >= names("trl") >= names("generate") and "trl" in names("all")
