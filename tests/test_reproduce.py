"""bench/reproduce.py rebuilds the results documents' tables from the committed data, and --check catches a
number that no longer matches its data."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _reproduce():
    spec = importlib.util.spec_from_file_location("bench_reproduce", ROOT / "bench" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_check_passes_on_the_committed_data(capsys):
    # testbed's rebuild is checked in tests/test_testbed_report.py; these two are fast
    assert _reproduce().main(["--check", "--only", "abstention,forms", "--no-figures"]) == 0
    out = capsys.readouterr().out
    assert "same as abstention.md" in out and "same as forms.md" in out and "README.md results table: same" in out


def test_check_fails_when_a_document_disagrees_with_its_data(tmp_path, monkeypatch, capsys):
    reproduce = _reproduce()
    results = tmp_path / "docs" / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    forms = results / "forms.md"
    row = next(line for line in forms.read_text().splitlines() if line.startswith("| GCPO"))
    changed = row.replace("0.0", "0.9", 1)
    assert changed != row
    forms.write_text(forms.read_text().replace(row, changed))
    monkeypatch.setattr(reproduce, "RESULTS", results)
    assert reproduce.main(["--check", "--only", "forms", "--no-figures"]) == 1
    assert "forms.md lacks 1 rebuilt row" in capsys.readouterr().out
