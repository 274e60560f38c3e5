"""docs/fidelity.md stays true: every estimator, selection method, confidence source, loss and post-hoc calibrator
calibrl registers has a row, and every test a row names exists (by its file and function name)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "fidelity.md"


def _rows() -> list[list[str]]:
    """The table rows of the page (the header and separator rows left out), cells stripped."""
    rows = []
    for line in PAGE.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("| method ") or line.startswith("|---"):
            continue
        rows.append([cell.strip() for cell in line.strip()[1:-1].split("|")])
    return rows


def _named_methods() -> set[str]:
    return {name for row in _rows() for name in re.findall(r"`([^`]+)`", row[0])}


def _test_functions(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}


def test_every_row_has_its_five_cells_and_names_at_least_one_test():
    rows = _rows()
    assert len(rows) >= 25
    for row in rows:
        assert len(row) == 5, row
        assert re.search(r"tests/\w+\.py::\w+", row[4]), f"{row[0]} names no test"


def test_every_test_the_page_names_exists():
    missing = []
    for row in _rows():
        for file, name in re.findall(r"(tests/\w+\.py)::(\w+)", row[4]):
            path = ROOT / file
            if not path.is_file() or name not in _test_functions(path):
                missing.append(f"{file}::{name}")
    assert not missing, missing


@pytest.mark.parametrize("kind", ["estimators", "selections", "confidence sources", "losses", "post-hoc"])
def test_everything_calibrl_ships_has_a_row(kind):
    from calibrl.advantages import estimator_specs
    from calibrl.metrics.registry import CONFIDENCE_SOURCES
    from calibrl.posthoc import available_posthoc
    from calibrl.selection.registry import ALL_METHODS
    from calibrl.trl.config import COV_LOSS_TYPES

    shipped = {
        "estimators": {s.name for s in estimator_specs() if s.fn.__module__.startswith("calibrl.advantages.")},
        "selections": set(ALL_METHODS) | {"deepconf_online"},
        "confidence sources": set(CONFIDENCE_SOURCES),
        "losses": {"ppo", "gspo", "simko", "decision", *COV_LOSS_TYPES},
        "post-hoc": set(available_posthoc()),
    }[kind]
    assert shipped <= _named_methods(), sorted(shipped - _named_methods())


def test_the_readme_method_list_links_the_page():
    assert "docs/fidelity.md" in (ROOT / "README.md").read_text()
