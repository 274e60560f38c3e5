"""What ``calibrl train`` prints: a line per logging step, the end summary's "last" column, and a plain note when
the rewards gave nothing to learn from."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console

from calibrl.trl.progress import format_step_line, print_summary, summarize


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=200, force_terminal=False), buffer


def test_step_line_shows_the_logged_metrics_in_order():
    logs = {"loss": 0.01234, "reward": 0.5, "calibration/accuracy": 0.25, "calibration/auroc": 0.625,
            "grad_norm": 1.0}
    assert format_step_line(logs, 3, 10) == "step  3/10  loss 0.0123  reward 0.500  accuracy 0.250  auroc 0.625"
    # a metric the step did not log (AUROC of a batch with one class) is left out, not printed as nan
    assert format_step_line({"loss": 0.0, "reward": 1.0, "calibration/auroc": float("nan")}, 1, 1) == \
        "step 1/1  loss 0.0000  reward 1.000"


def test_step_line_for_eval_logs_and_none_for_the_run_totals():
    line = format_step_line({"eval_loss": 0.5, "eval_reward": 0.75, "eval_calibration/auroc": 0.8}, 4, 10)
    assert line == "eval at step 4: loss 0.5000  reward 0.750  auroc 0.800"
    assert format_step_line({"train_runtime": 12.0, "train_loss": 0.1, "epoch": 1.0}, 10, 10) is None


def _trainer(log_history):
    return SimpleNamespace(args=SimpleNamespace(advantage_estimator="capo", output_dir="runs/x"),
                           state=SimpleNamespace(global_step=len(log_history), log_history=log_history))


def test_summary_column_says_how_many_steps_it_averages():
    history = [{"loss": 0.1 * i, "reward": float(i % 2), "frac_reward_zero_std": 0.5} for i in range(3)]
    summary = summarize(history)
    assert summary["reward"]["last"] == pytest.approx(1 / 3) and summary["reward"]["last_count"] == 3
    console, buffer = _console()
    print_summary(console, summary, _trainer(history))
    out = buffer.getvalue()
    assert "last (mean of 3 logged steps)" in out and "mean of 5" not in out
    assert "note:" not in out  # some groups had differing rewards


def test_summary_notes_a_run_whose_rewards_never_differ_within_a_group():
    history = [{"loss": 0.0, "reward": 0.0, "frac_reward_zero_std": 1.0} for _ in range(7)]
    console, buffer = _console()
    print_summary(console, summarize(history), _trainer(history))
    out = " ".join(buffer.getvalue().split())
    assert "last (mean of 5 logged steps)" in out
    assert "note: in none of the 7 logged step(s)" in out and "reward was 0" in out and "taught the model nothing" in out


def test_no_note_when_the_estimator_moved_though_the_rewards_did_not():
    """An estimator that reads a confidence gives equal rewards non-zero advantages (docs/custom-estimator.md's
    example): the run learned something, so no "every advantage was zero" note."""
    history = [{"loss": 0.0, "reward": 1.0, "frac_reward_zero_std": 1.0, "calibration/advantage_abs_mean": a}
               for a in (0.018, 0.016)]
    console, buffer = _console()
    print_summary(console, summarize(history), _trainer(history))
    assert "note:" not in buffer.getvalue()


@pytest.mark.slow
def test_train_prints_a_line_per_logging_step_when_output_is_not_a_terminal(tmp_path):
    from calibrl.trl.train import load_recipe, train

    console, buffer = _console()
    result = train(load_recipe("tiny_cpu"), overrides={"max_steps": 2, "output_dir": str(tmp_path / "run")},
                   console=console)
    lines = buffer.getvalue().splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/2", "2/2"]
    assert all("loss " in line and "reward " in line and "accuracy " in line for line in steps)
    assert result["summary"]["loss"]["last_count"] == 2
    assert any("last (mean of 2 logged steps)" in line for line in lines)


@pytest.mark.slow
def test_train_writes_its_result_apart_from_its_progress(tmp_path):
    """calibrl train: progress to stderr, the summary (the run's result) to stdout."""
    from calibrl.trl.train import load_recipe, train

    progress, progress_text = _console()
    result, result_text = _console()
    train(load_recipe("tiny_cpu"), overrides={"max_steps": 1, "output_dir": str(tmp_path / "run")},
          console=progress, result_console=result)
    assert "step 1/1" in progress_text.getvalue() and "calibrl train:" not in progress_text.getvalue()
    assert "calibrl train:" in result_text.getvalue() and "step 1/1" not in result_text.getvalue()


def test_heldout_calibration_and_trl_eval_are_named_apart():
    """The held-out calibration callback logs only eval_calibration/* keys; TRL's own evaluation logs the same
    telemetry keys beside eval_loss / eval_runtime. Lines and summary keep them apart."""
    heldout = {"eval_calibration/accuracy": 0.4, "eval_calibration/auroc": 0.7, "step": 2}
    trl_eval = {"eval_loss": 0.5, "eval_runtime": 1.0, "eval_calibration/accuracy": 0.9,
                "eval_calibration/auroc": 0.55, "step": 2}
    assert format_step_line(heldout, 2, 2) == "held-out calibration at step 2: accuracy 0.400  auroc 0.700"
    assert format_step_line(trl_eval, 2, 2).startswith("eval at step 2: loss 0.5000")
    history = [{"loss": 0.1, "reward": 0.5, "calibration/auroc": 0.6, "step": 1}, heldout, trl_eval]
    for order in (history, [history[0], trl_eval, heldout]):
        summary = summarize(order)
        assert summary["AUROC (pooled)"]["held-out"] == 0.7 and summary["AUROC (pooled)"]["eval"] == 0.55
    console, buffer = _console()
    print_summary(console, summarize(history), _trainer(history))
    header = next(line for line in buffer.getvalue().splitlines() if "metric" in line)
    assert "eval" in header and "held-out" in header
