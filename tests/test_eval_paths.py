"""``calibrl eval`` refuses paths it cannot use before reading anything: one line naming the path, exit 2, no
traceback, nothing written."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibrl.cli import app

FIGURES = ["--bootstrap", "0", "--methods", "", "--no-math-verify"]
FAST = [*FIGURES, "--no-figures"]  # the tests that do not look at the figures skip drawing them


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
    result = CliRunner().invoke(app, ["eval", str(tex), str(undecodable), "--out", str(out), *FIGURES])
    assert result.exit_code == 0, result.output
    figures = json.loads((out / "metrics.json").read_text())["figures"]
    assert set(figures) == {"overall", "$x^{$", "a\ud800b", "\\bad$"}
    assert all((out / name).stat().st_size > 0 for names in figures.values() for name in names)
    report = (out / "report.md").read_text()
    assert "## $x^{$" in report and "## a\\ud800b" in report and "f\\udcff" in report


# ------------------------------------------------------------- faults while the report is written, and races


def _beside(out: Path) -> list[str]:
    """What a run left beside ``out``: its build folders and previous reports moved aside."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def _previous_report(tmp_path) -> tuple[Path, Path, dict[str, bytes]]:
    """(input, --out, its files' bytes) after a first successful run."""
    src = _samples(tmp_path / "s.jsonl")
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["eval", str(src), "--out", str(out), *FIGURES])
    assert result.exit_code == 0, result.output
    return src, out, {p.name: p.read_bytes() for p in out.iterdir()}


@pytest.mark.parametrize("code", [errno.EBUSY, errno.EPERM])
def test_out_that_cannot_be_renamed_is_refused_before_the_work(tmp_path, monkeypatch, code):
    """A mount point (EBUSY) or a folder in another user's sticky folder (EPERM) cannot be renamed aside."""
    src, out, before = _previous_report(tmp_path)
    rename = Path.rename

    def refuse(self, target):
        if Path(self) == out.resolve():
            raise OSError(code, os.strerror(code))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", refuse)
    monkeypatch.setattr("calibrl.evaluation.pipeline.write_eval_report",
                        lambda *a, **k: pytest.fail("the report is built although --out cannot be replaced"))
    result = CliRunner().invoke(app, ["eval", str(src), "--out", str(out), *FAST])
    _one_line_exit_2(result, f"--out {out.resolve()} cannot be replaced", os.strerror(code))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and _beside(out) == []


def test_a_full_disk_ends_in_one_line_and_keeps_the_previous_report(tmp_path, monkeypatch):
    src, out, before = _previous_report(tmp_path)

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("matplotlib.figure.Figure.savefig", full)
    result = CliRunner().invoke(app, ["eval", str(src), "--out", str(out), *FIGURES])
    _one_line_exit_2(result, f"--out {out}: cannot write the report (No space left on device)", "left as it was")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and _beside(out) == []


def test_a_second_eval_finishing_first_on_the_same_out_is_kept(tmp_path, monkeypatch):
    """Two evals on one --out: while this one swaps (its previous report moved aside), the other puts its report
    in place; this one's rename then fails. The other's report is kept, nothing is left beside it."""
    src, out, _ = _previous_report(tmp_path)
    rename = Path.rename

    def other_eval_lands(self, target):
        result = rename(self, target)
        if Path(self) == out.resolve() and any(".tmp-" in name for name in _beside(out)):  # moved aside to swap
            out.mkdir()
            (out / "metrics.json").write_text("the other run's")
        return result

    monkeypatch.setattr(Path, "rename", other_eval_lands)
    result = CliRunner().invoke(app, ["eval", str(src), "--out", str(out), *FAST])
    _one_line_exit_2(result, f"--out {out} was written by another calibrl eval while this one ran")
    assert [p.name for p in out.iterdir()] == ["metrics.json"] and (out / "metrics.json").read_text() == \
        "the other run's"
    assert _beside(out) == []


# The signal is sent to the main thread itself: os.kill(os.getpid(), ...) may be taken by another thread of the
# process and handled only after the next lines ran (the race that made this test flaky); the sleep is a margin.
_INTERRUPTED_RUN = """
import signal, sys, threading, time
import calibrl.evaluation.pipeline as pipeline

def interrupted(folder, *args, **kwargs):
    (folder / "overall_reliability.png").write_bytes(b"half")
    signal.pthread_kill(threading.get_ident(), getattr(signal, sys.argv[1]))
    time.sleep(30)
    raise AssertionError("not interrupted")

pipeline.write_eval_report = interrupted
# Ctrl-C as a terminal delivers it: a shell that started this suite in the background leaves SIGINT ignored, and
# Python then raises no KeyboardInterrupt
signal.signal(signal.SIGINT, signal.default_int_handler)
from calibrl.cli import app
app(sys.argv[2:], prog_name="calibrl")
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_an_interrupt_while_the_report_is_built_removes_its_folder(tmp_path, name):
    src, out, before = _previous_report(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get(
        "PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", _INTERRUPTED_RUN, name, "eval", str(src), "--out", str(out), *FAST],
                         capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1, (run.returncode, run.stdout, run.stderr)
    assert f"interrupted by {'SIGTERM' if name == 'SIGTERM' else 'Ctrl-C (SIGINT)'}" in lines[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and _beside(out) == []


def test_the_report_folder_has_the_permissions_of_a_new_folder(tmp_path):
    previous = os.umask(0o022)
    try:
        _previous_report(tmp_path)
    finally:
        os.umask(previous)
    assert (tmp_path / "report").stat().st_mode & 0o777 == 0o755
