"""The evaluation pipeline: model -> generate -> samples -> scoring -> report.

1. :mod:`~calibrl.evaluation.generate` (``calibrl generate``): a model and a registered dataset in, a samples
   JSONL out, one row per sampled completion (answer, ``correct``, ``logprob_mean``; class probabilities for
   decision tasks), resumable (``<out>.meta.json`` beside it). :mod:`~calibrl.evaluation.backends` holds the
   transformers and vLLM sampling and what is read off each completion.
2. :mod:`~calibrl.evaluation.samples`: a samples file (JSONL or Parquet, from ``calibrl generate`` or anywhere)
   in, validated, a :class:`Samples` out (numpy arrays, one entry per completion; :class:`SamplesError` names
   ``file:line`` otherwise).
3. :mod:`~calibrl.evaluation.scoring`: a :class:`Samples` (one input, one scope: overall or a benchmark) in, a
   :class:`ScopeResult` out: its metrics dict (calibration, abstention, bootstrap, post-hoc, answer selection
   and scaling curves from :mod:`calibrl.metrics`, :mod:`calibrl.posthoc`, :mod:`calibrl.selection`) and the
   arrays the figures need.
4. :mod:`~calibrl.evaluation.pipeline` (``calibrl eval``): every input's :class:`ScopeResult` per scope in,
   a folder out: the PNG figures (:mod:`~calibrl.evaluation.plots`), ``metrics.json`` (inputs, settings,
   ``{scope: {label: metrics}}``, figure names) and ``report.md`` (:mod:`~calibrl.evaluation.report`, inputs
   side by side).

The command lines (option parsing, the ``--out`` rules, progress) are :mod:`calibrl.cli.generate` and
:mod:`calibrl.cli.eval`. The names below are imported on first use, so importing this package loads neither
the model libraries nor matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "GenerateConfig",
    "GenerateError",
    "Samples",
    "SamplesError",
    "ScopeResult",
    "evaluate_samples",
    "load_samples",
    "markdown_table",
    "plot_precision_coverage",
    "plot_reliability",
    "plot_roc",
    "plot_scaling_curves",
    "plot_training_curves",
    "render_eval_report",
    "write_eval_report",
]

# (module, names it provides), in pipeline order. ``generate`` itself is not re-exported: the name is the module.
_EXPORTS = (
    ("calibrl.evaluation.generate", ("GenerateConfig", "GenerateError")),
    ("calibrl.evaluation.samples", ("Samples", "SamplesError", "load_samples")),
    ("calibrl.evaluation.scoring", ("ScopeResult", "evaluate_samples")),
    ("calibrl.evaluation.pipeline", ("write_eval_report",)),
    ("calibrl.evaluation.report", ("markdown_table", "render_eval_report")),
    ("calibrl.evaluation.plots", ("plot_precision_coverage", "plot_reliability", "plot_roc", "plot_scaling_curves",
                                  "plot_training_curves")),
)


def __getattr__(name: str) -> Any:
    """Import the module providing ``name`` on first access (PEP 562)."""
    for module, names in _EXPORTS:
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
