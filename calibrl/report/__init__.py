"""Reports: PNG figures (:mod:`calibrl.report.plots`), markdown (:mod:`calibrl.report.markdown`) and the
computation behind ``calibrl eval`` (:mod:`calibrl.report.evaluate`)."""

from calibrl.report.evaluate import ScopeResult, evaluate_samples
from calibrl.report.markdown import markdown_table, render_eval_report
from calibrl.report.plots import (
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
