"""The end-of-run summary table: its marks are explained in words."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console


def _printed(log_history):
    from calibrl.trl.progress import print_summary, summarize

    buffer = io.StringIO()
    trainer = SimpleNamespace(args=SimpleNamespace(advantage_estimator="grpo", output_dir="run"),
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
