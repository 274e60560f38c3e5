"""Reports: PNG figures (:mod:`calibrl.evaluation.plots`), markdown (:mod:`calibrl.evaluation.report`) and the
computation behind ``calibrl eval`` (:mod:`calibrl.evaluation.scoring`)."""

from calibrl.evaluation.scoring import ScopeResult, evaluate_samples
from calibrl.evaluation.report import markdown_table, render_eval_report
from calibrl.evaluation.plots import (
    plot_precision_coverage,
    plot_reliability,
    plot_roc,
    plot_scaling_curves,
    plot_training_curves,
)

__all__ = [
    "ScopeResult",
    "evaluate_samples",
    "markdown_table",
    "plot_precision_coverage",
    "plot_reliability",
    "plot_roc",
    "plot_scaling_curves",
    "plot_training_curves",
    "render_eval_report",
]
