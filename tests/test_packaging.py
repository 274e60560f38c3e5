"""What an installed calibrl needs: the TRL version it was written against, the ranges and extras of pyproject.toml,
verl's entry point, the shipped recipes and their data declared as package data, ``calibrl --version``,
``python -m calibrl`` and ``calibrl train --list``."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "calibrl"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _fake_trl(monkeypatch, version: str) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version if name == "trl" else real(name))


def test_import_rejects_an_older_trl(monkeypatch):
    import calibrl.trl

    _fake_trl(monkeypatch, "0.24.0")
    with pytest.raises(ImportError, match=r"TRL 0\.24\.0.*trl>=1\.16,<1\.17"):
        calibrl.trl._check_trl_version()
    monkeypatch.delitem(sys.modules, "calibrl.trl")
    with pytest.raises(ImportError, match="TRL 0.24.0"):
        importlib.import_module("calibrl.trl")


def test_import_warns_on_a_newer_trl_and_accepts_the_tested_one(monkeypatch):
    import calibrl.trl

    _fake_trl(monkeypatch, "1.17.0")
    with pytest.warns(UserWarning, match="TRL 1.17.0"):
        calibrl.trl._check_trl_version()
    _fake_trl(monkeypatch, "1.16.3")
    calibrl.trl._check_trl_version()  # silent


def test_pins_match_the_import_check():
    """TRL, behind the ``trl`` extra, is pinned to the minor release the trainer's overrides were written against
    (the import check's range); every other requirement has a floor (the oldest tested) and no ceiling."""
    import calibrl.trl
    from packaging.requirements import Requirement

    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    assert [d for d in extras["trl"] if Requirement(d).name == "trl"] == [
        f"trl>={calibrl.trl.TRL_TESTED[0]},<{calibrl.trl.TRL_TESTED[1]}"]
    pinned = {"trl", "vllm"}  # vllm: the range TRL 1.16 supports
    for dep in project["dependencies"] + [d for name, deps in extras.items() for d in deps]:
        req = Requirement(dep)
        if req.name == "calibrl":  # one extra naming another
            assert req.extras <= set(extras), dep
            continue
        assert any(s.operator == ">=" for s in req.specifier), f"{dep}: no floor"
        if req.name not in pinned:
            assert all(s.operator == ">=" for s in req.specifier), f"{dep}: a ceiling without a known break"


def test_verl_finds_calibrl_and_the_installs_bring_it_with_its_dependencies():
    """The verl.plugins entry point names the plugin module; `make setup` installs every extra (the README's two
    commands install what they did before the core was split); .venv-verl installs calibrl with its dependencies."""
    project = _pyproject()["project"]
    assert project["entry-points"]["verl.plugins"] == {"calibrl": "calibrl.verl"}
    assert (PACKAGE / "verl" / "__init__.py").exists()
    assert '-e ".[all,dev]"' in (ROOT / "Makefile").read_text()
    setup_verl = (ROOT / "scripts" / "setup_verl_env.sh").read_text()
    installs = [line for line in setup_verl.splitlines() if line.startswith('"${PIP[@]}"') and " -e " in line]
    assert installs == ['"${PIP[@]}" "$TORCH_SPEC" -e ".[dev]"'], installs


def test_license_is_an_spdx_string_with_the_file():
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    requires = _pyproject()["build-system"]["requires"]
    assert any(r.startswith("setuptools>=77") for r in requires), requires


def test_shipped_recipes_are_package_data_and_name_shipped_data():
    from calibrl.trl.recipes import RECIPES_DIR, load_recipe, shipped_recipes

    patterns = _pyproject()["tool"]["setuptools"]["package-data"]["calibrl"]
    declared = {p for pattern in patterns for p in PACKAGE.glob(pattern)}
    recipes = shipped_recipes()
    assert {"tiny_cpu", "tiny_cpu_decision", "capo_qwen2.5-math-1.5b_deepscaler"} <= set(recipes)
    assert RECIPES_DIR.resolve().is_relative_to(PACKAGE.resolve())
    for name, path in recipes.items():
        assert path.resolve() in {p.resolve() for p in declared}, f"{name} is not declared as package data"
        recipe = load_recipe(name)
        for spec in (recipe.dataset, recipe.eval_dataset):
            if spec is not None and spec.path is not None:
                data = Path(spec.path).resolve()
                assert data.is_relative_to(PACKAGE.resolve()), f"{name} reads {data} outside the package"
                assert data.exists() and data in {p.resolve() for p in declared}, f"{name}: {data} not shipped"


def test_version_list_and_module_entry_point():
    from calibrl.cli import app

    runner = CliRunner()
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and importlib.metadata.version("calibrl") in version.output
    listed = runner.invoke(app, ["train", "--list"])
    assert listed.exit_code == 0 and "tiny_cpu" in listed.output.split() and "tiny_cpu_decision" in listed.output
    unknown = runner.invoke(app, ["train", "tiny_cpuu"])
    assert unknown.exit_code == 2 and "tiny_cpu" in unknown.output and "Traceback" not in unknown.output
    module = subprocess.run([sys.executable, "-m", "calibrl", "--version"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert module.returncode == 0 and importlib.metadata.version("calibrl") in module.stdout, module.stderr


_NOT_SOURCES = {".git", "runs", "dist", "build", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def _source_copy(dest: Path) -> Path:
    """The working tree without the virtual environments, run outputs and build products (what an sdist is built
    from in a checkout)."""
    import shutil

    def ignore(folder, names):
        return [n for n in names if n in _NOT_SOURCES or n.startswith(".venv") or n.endswith((".egg-info", ".pyc"))]

    shutil.copytree(ROOT, dest, symlinks=True, ignore=ignore)
    return dest


@pytest.mark.slow
def test_sdist_ships_what_its_tests_read(tmp_path):
    """The sdist holds the test suite with its fixtures and scripts and every repository folder the tests read
    (docs/, studies/, examples/, scripts/, configs/), and the README's tests that read docs/ pass from the unpacked
    sdist; the cost benchmarks (bench/), which no test reads, are not shipped."""
    import tarfile

    src = _source_copy(tmp_path / "src")
    build = subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; "
                            f"print(b.build_sdist({str(tmp_path / 'dist')!r}))"],
                           cwd=src, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    archive = tmp_path / "dist" / build.stdout.strip().splitlines()[-1]
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "x", filter="data")
        top = tar.getnames()[0].split("/")[0]
    unpacked = tmp_path / "x" / top
    for folder in ("tests", "docs", "studies", "examples", "scripts", "configs"):
        wanted = {p.relative_to(src) for p in (src / folder).rglob("*") if p.is_file()}
        shipped = {p.relative_to(unpacked) for p in (unpacked / folder).rglob("*") if p.is_file()}
        assert wanted and wanted <= shipped, f"{folder}/ files missing from the sdist: {sorted(wanted - shipped)[:5]}"
    assert not (unpacked / "bench").exists()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_readme.py",
                          # what reads docs/ (links, tables, the page's size); the python blocks train, and train
                          # the same from the checkout
                          "-k", "not python_block_runs"],
                         cwd=unpacked, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(unpacked)})
    assert run.returncode == 0, run.stdout[-3000:]


def test_the_engines_and_the_evaluation_pipeline_never_import_the_testbed():
    """Layers: calibrl.models names every built-in model; the engines (trl, verl) and the evaluation pipeline sit
    below the testbed and never reach up into it."""
    import re

    root = Path(__file__).resolve().parents[1] / "calibrl"
    offenders = []
    for package in ("trl", "verl", "evaluation", "selection", "metrics", "advantages", "losses", "tasks"):
        for path in (root / package).rglob("*.py"):
            if re.search(r"^\s*(from|import)\s+calibrl\.testbed\b", path.read_text(), re.M):
                offenders.append(str(path.relative_to(root)))
    assert not offenders, offenders


def test_the_wheel_ships_calibrl_and_not_the_studies():
    """studies/ (the studies, their analysis and rebuild) and bench/ stay in the repository: the package list the
    wheel is built from holds calibrl's packages only."""

    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(ROOT), include=include)
    assert "calibrl" in packages and "calibrl.testbed" in packages
    assert not [p for p in packages if not p.startswith("calibrl")], packages
    assert (ROOT / "studies" / "__init__.py").exists()  # a package of the repository, importable from its root


def test_the_library_never_imports_the_studies():
    """calibrl (what the wheel ships) cannot reach studies/ (which the wheel does not ship): no import of it."""
    import re

    offenders = [str(path.relative_to(ROOT)) for path in (ROOT / "calibrl").rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+studies\b", path.read_text(), re.M)]
    assert not offenders, offenders


@pytest.mark.slow
def test_the_readmes_install_lines_install_calibrl(tmp_path):
    """No release is on PyPI: the README's install lines are a clone's (`pip install .`, `'.[trl]'`, ...) or the
    wheel built from it. Each is run here as pip reads it, without the network: the wheel is built
    (`pip wheel --no-deps -w dist .`, as the README says) and each line is resolved by `pip install --dry-run` with
    its dependencies left out; the wheel installs into a folder and its `calibrl` imports from there."""
    import re

    readme = (ROOT / "README.md").read_text()
    specs = re.findall(r"\| `pip install ((?:'[^']*')|\.)` \|", readme)
    assert specs == [".", "'.[generate]'", "'.[trl]'", "'.[all]'"], specs
    assert "pip wheel --no-deps -w dist ." in readme and "'dist/calibrl-0.1.0-py3-none-any.whl[trl]'" in readme
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    clone = _source_copy(tmp_path / "clone")  # a clone's files: building leaves build/ and egg-info there
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), "."],
                           cwd=clone, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("calibrl-*.whl")
    assert wheel.name == f"calibrl-{_pyproject()['project']['version']}-py3-none-any.whl"
    for spec in specs:
        target = spec.strip("'").replace(".", str(clone), 1)
        dry = subprocess.run([*pip, "install", "--dry-run", "--no-deps", "--no-build-isolation", "--no-index",
                              target], capture_output=True, text=True, timeout=300)
        assert dry.returncode == 0, (spec, dry.stderr[-3000:])
    installed = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(tmp_path / "site"),
                                f"{wheel}[trl]"], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    found = subprocess.run([sys.executable, "-c", "import calibrl; print(calibrl.__file__)"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, cwd=tmp_path)
    assert found.stdout.strip().startswith(str(tmp_path / "site")), found.stderr[-2000:]
