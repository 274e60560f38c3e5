"""The end-of-run summary table: its marks are explained in words."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console


def _printed(log_history, **args):
    from calibrl.trl.progress import print_summary, summarize

    buffer = io.StringIO()
    trainer = SimpleNamespace(args=SimpleNamespace(advantage_estimator="grpo", output_dir="run", **args),
                              state=SimpleNamespace(global_step=len(log_history), log_history=log_history))
    print_summary(Console(file=buffer, width=200, force_terminal=False), summarize(log_history), trainer)
    return buffer.getvalue()


def test_a_cell_averaging_fewer_steps_is_explained():
    """AUROC undefined at one of two logged steps: its cell is marked (1) and a caption says what (1) means."""
    logs = [{"loss": 0.5, "reward": 0.2, "calibration/auroc": 0.6, "step": 1},
            {"loss": 0.4, "reward": 0.3, "step": 2}]
    out = _printed(logs)
    assert "last (mean of 2 logged steps)" in out and "0.6000 (1)" in out
    assert "(k): the metric was defined at only k of those 2 steps" in out
    # every metric logged at every step: no mark, no caption
    full = _printed([{**logs[0]}, {**logs[1], "calibration/auroc": 0.8}])
    assert "(1)" not in full and "(k)" not in full


def test_a_decision_run_shows_its_decision_metrics():
    """The decision term logs decision/* every step; calibration/decision_* only where a completion held a
    decision token. Both reach the table, and a run whose completions never held one says so."""
    none = [{"loss": 0.0, "reward": 0.0, "calibration/accuracy": 0.0, "decision/loss": 0.0,
             "decision/decision_ce": 0.0, "decision/frac_with_decision": 0.0, "step": s} for s in (1, 2)]
    out = _printed(none, decision_classes=["A", "B", "C", "D", "E"])
    assert re.search(r"share with a decision token\s+\S\s+0\.0000\s+\S\s+0\.0000", out), out
    assert "in none of the 2 logged step(s) did a completion hold a decision token (A, B, C, D, E)" in out

    found = [{"loss": 0.1, "reward": 0.5, "decision/frac_with_decision": 0.5, "decision/decision_ce": 1.2,
              "calibration/decision_ece": 0.25, "calibration/decision_frac_above_099": 0.0,
              "calibration/decision_prob_mean": 0.4, "step": 1},
             {"loss": 0.1, "reward": 0.5, "decision/frac_with_decision": 1.0, "decision/decision_ce": 0.8,
              "calibration/decision_ece": 0.15, "calibration/decision_frac_above_099": 0.5,
              "calibration/decision_prob_mean": 0.6, "step": 2}]
    out = _printed(found, decision_classes=["A", "B"])
    for label, first, last in (("share with a decision token", "0.5000", "0.7500"),
                               ("decision ECE", "0.2500", "0.2000"), ("decision p>0.99", "0.0000", "0.2500"),
                               ("decision prob (chosen)", "0.4000", "0.5000")):
        assert re.search(rf"{re.escape(label)}\s+\S\s+{first}\s+\S\s+{last}", out), (label, out)
    assert "decision token (" not in out
