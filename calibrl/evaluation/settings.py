"""The settings of one ``calibrl eval``: built once from the command line (or by a caller of
:func:`calibrl.evaluation.pipeline.write_eval_report`), handed down as is to every scope's scoring and written as
is to ``metrics.json``'s ``settings`` and the report's settings line."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from calibrl.selection import METHODS

__all__ = ["EvalSettings"]


@dataclass(frozen=True)
class EvalSettings:
    """Every option of an evaluation.

    Args:
        n_bins: bins of the binned ECEs and the reliability diagrams (``--n-bins``). Default 10.
        bootstrap: prompt-level bootstrap resamples for the intervals, 0 for none (``--bootstrap``). Default 1000.
        alpha: the intervals are (1 - alpha) percentile intervals. Default 0.05.
        posthoc: also report this cross-validated post-hoc calibrator ("isotonic", "temperature", "platt";
            ``--posthoc``), or None. Default None.
        n_splits: folds (split by prompt) of the post-hoc calibration. Default 5.
        math_verify: cluster answers with math-verify as well as by normalised string (``--no-math-verify``: False).
            Default True.
        methods: answer-selection methods with scaling curves (``--methods``). Default: majority, weighted, pc, rpc,
            best_of_n.
        scaling_draws: random path subsets averaged per N on the scaling curves. Default 10.
        rpc_draws: draws per N of RPC's curve (one Weibull fit per prompt per draw). Default 2.
        seed: seed of the bootstrap, the folds, the abstention split and the scaling-curve draws. Default 0.
        abstain_precision: certify an abstention threshold with precision >= this (``--abstain-precision``), or
            None. Default None.
        abstain_delta: the probability the certificate may fail. Default 0.05.
        abstain_method: "betting" or "bonferroni" (``--abstain-method``). Default "betting".
        plugins: the modules or files imported before the evaluation (``--plugins``: a user's metrics). Default ().
        figures: draw the PNG figures (``--no-figures``: False, for metrics.json and report.md alone; drawing takes
            about 0.7 s a figure, up to 7 a scope, whatever the input's size). Default True.
    """

    n_bins: int = 10
    bootstrap: int = 1000
    alpha: float = 0.05
    posthoc: str | None = None
    n_splits: int = 5
    math_verify: bool = True
    methods: tuple[str, ...] = field(default=METHODS)
    scaling_draws: int = 10
    rpc_draws: int = 2
    seed: int = 0
    abstain_precision: float | None = None
    abstain_delta: float = 0.05
    abstain_method: str = "betting"
    plugins: tuple[str, ...] = ()
    figures: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(self.methods))
        object.__setattr__(self, "plugins", tuple(self.plugins))

    def to_dict(self) -> dict[str, Any]:
        """As written to metrics.json: every field, ``methods`` and ``plugins`` as lists."""
        out = asdict(self)
        out.update(methods=list(self.methods), plugins=list(self.plugins))
        return out
