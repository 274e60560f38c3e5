"""``calibrl eval`` refuses paths it cannot use before reading anything: one line naming the path, exit 2, no
traceback, nothing written."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibrl.cli import app

FAST = ["--bootstrap", "0", "--methods", "", "--no-math-verify"]


def _samples(path: Path) -> Path:
    rows = [{"prompt_id": f"q{p}", "correct": (p + j) % 2 == 0, "answer": str(j), "logprob_mean": -0.1 * (j + 1)}
            for p in range(4) for j in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _one_line_exit_2(result, *words: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, (SystemExit, type(None))), result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in words), result.output
    return lines[0]


def test_symlink_loop_input_is_refused(tmp_path):
    os.symlink(tmp_path / "b.jsonl", tmp_path / "a.jsonl")
    os.symlink(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["eval", str(tmp_path / "a.jsonl"), "--out", str(out), *FAST])
    _one_line_exit_2(result, "a.jsonl", "symlink loop")
    assert not out.exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_out_where_nothing_can_be_written_is_refused(tmp_path):
    src = _samples(tmp_path / "s.jsonl")
    result = CliRunner().invoke(app, ["eval", str(src), "--out", "/proc/x", *FAST])
    _one_line_exit_2(result, "--out /proc/x", "cannot write there")


def test_out_under_a_file_is_refused(tmp_path):
    src = _samples(tmp_path / "s.jsonl")
    (tmp_path / "plain").write_text("x")
    result = CliRunner().invoke(app, ["eval", str(src), "--out", str(tmp_path / "plain" / "report"), *FAST])
    _one_line_exit_2(result, "--out", "cannot write there")
    assert (tmp_path / "plain").read_text() == "x"


def test_tex_like_and_undecodable_names_are_drawn_as_plain_text(tmp_path):
    """File and benchmark names reach figure titles and legends: '$' or a lone surrogate must not stop the report
    after every metric was computed (matplotlib's TeX math parser, a font without the character)."""
    rows = [{"prompt_id": f"q{p}", "correct": (p + j) % 2 == 0, "logprob_mean": -0.1 * (j + 1), "benchmark": bench}
            for bench in ("$x^{$", "a\ud800b", "\\bad$") for p in range(4) for j in range(3)]
    tex = tmp_path / "x$\\bad$.jsonl"
    tex.write_text("".join(json.dumps(r) + "\n" for r in rows))  # JSON keeps the surrogate as its escape
    undecodable = _samples(tmp_path / os.fsdecode(b"f\xff.jsonl"))
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["eval", str(tex), str(undecodable), "--out", str(out), *FAST])
    assert result.exit_code == 0, result.output
    figures = json.loads((out / "metrics.json").read_text())["figures"]
    assert set(figures) == {"overall", "$x^{$", "a\ud800b", "\\bad$"}
    assert all((out / name).stat().st_size > 0 for names in figures.values() for name in names)
    report = (out / "report.md").read_text()
    assert "## $x^{$" in report and "## a\\ud800b" in report and "f\\udcff" in report
