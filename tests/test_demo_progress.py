"""The demo's progress display when its output is not a terminal (a log file, a pipe): plain periodic lines."""

import io

from rich.console import Console

from calibrl.testbed.demo import ProgressDisplay, format_duration, run_note


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _display(clock, **kwargs):
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    return ProgressDisplay(console, clock=clock, **kwargs), out


def test_plain_lines_every_tenth_of_the_steps_with_elapsed_and_eta():
    clock = FakeClock()
    display, out = _display(clock, every_seconds=1e9)
    assert display.plain
    with display:
        display.add("warm start addition", 1000)
        for step in range(0, 1001, 10):
            clock.now = 0.15 * step  # 0.15 s per step
            display.update("warm start addition", step)
    lines = out.getvalue().splitlines()
    # one line per 10% of the steps (the last is the "done" line), nothing for step 0
    assert len(lines) == 10
    assert lines[2] == "warm start addition: step 300/1000, 45 s elapsed, ETA 1m45s"
    assert lines[-1] == "warm start addition: step 1000/1000, done in 2m30s"
    assert "\x1b" not in out.getvalue()  # no escape codes in a log file


def test_plain_lines_every_30_seconds_when_steps_are_slow_and_the_clock_starts_at_the_first_update():
    clock = FakeClock()
    display, out = _display(clock)
    with display:
        display.add("decision/grpo s0", 200)
        clock.now = 100.0  # queued for a worker meanwhile: not counted
        display.update("decision/grpo s0", 0, note="acc (expected) 0.52, AUROC 0.70, decision ECE 0.124")
        for step in range(1, 11):
            clock.now = 100.0 + 10 * step  # 10 s per step: 5% of the steps in 30 s
            display.update("decision/grpo s0", step)
    lines = out.getvalue().splitlines()
    assert lines == [
        "decision/grpo s0: step 3/200, 30 s elapsed, ETA 32m50s, acc (expected) 0.52, AUROC 0.70, decision ECE 0.124",
        "decision/grpo s0: step 6/200, 1m00s elapsed, ETA 32m20s, acc (expected) 0.52, AUROC 0.70, decision ECE 0.124",
        "decision/grpo s0: step 9/200, 1m30s elapsed, ETA 31m50s, acc (expected) 0.52, AUROC 0.70, decision ECE "
        "0.124",
    ]


def test_a_run_stopping_early_reports_done_once():
    clock = FakeClock()
    display, out = _display(clock)
    with display:
        clock.now = 1.0
        display.update("warm start decision (SFT, first run only)", 0, total=1500)
        clock.now = 21.0
        # the SFT run reached its target at step 400: the new total ends it
        display.update("warm start decision (SFT, first run only)", 400, total=400, note="greedy accuracy 0.97")
        display.update("warm start decision (SFT, first run only)", 400, total=400)
    assert out.getvalue().splitlines() == [
        "warm start decision (SFT, first run only): step 400/400, done in 20 s, greedy accuracy 0.97"]


def test_terminal_output_uses_bars_not_lines():
    out = io.StringIO()
    display = ProgressDisplay(Console(file=out, force_terminal=True, width=200))
    assert not display.plain
    with display:
        display.update("stochastic_reasoning/grpo s0", 5, total=10)
    text = out.getvalue()
    assert "5/10" in text and "ETA" in text and "elapsed" not in text


def test_short_fast_runs_print_at_most_every_few_seconds():
    clock = FakeClock()
    display, out = _display(clock, min_seconds=5.0)
    with display:
        for step in range(1, 11):  # 10 steps of 1.5 s: every step is another 10%
            clock.now = 1.5 * step
            display.update("stochastic_reasoning/grpo s0", step, total=10)
    steps = [line.split("step ")[1].split("/")[0] for line in out.getvalue().splitlines()]
    # the clock starts at step 1 (1.5 s): lines 6 s and 12 s later, then the done line
    assert steps == ["5", "9", "10"]


def test_format_duration_and_run_note():
    assert [format_duration(s) for s in (0.4, 45, 100, 3725)] == ["0 s", "45 s", "1m40s", "1h02m"]
    assert run_note({"expected_accuracy": 0.687, "accuracy": 0.72, "auroc": 0.81, "seq_ece": 0.0312}) == (
        "acc (expected) 0.69, AUROC 0.81, ECE 0.031")
