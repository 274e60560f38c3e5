"""``CalibrationEvalConfig``: the settings of the held-out calibration callback
(:class:`calibrl.trl.callbacks.CalibrationEvalCallback`) and of a recipe's ``calibration_eval:`` section.

Kept apart from the callback, which needs transformers and torch, so a recipe is validated (``calibrl train``)
without importing either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["CalibrationEvalConfig"]

def watchable_metrics() -> list[str]:
    """What ``metric`` may watch: the declared ``callback`` metrics with a direction other than accuracy (the
    Pareto rule's other axis), a user's declared metrics included."""
    from calibrl.metrics.registry import metrics_for

    return [m.name for m in metrics_for("callback") if m.higher is not None and m.name != "accuracy"]


@dataclass
class CalibrationEvalConfig:
    """Settings of :class:`CalibrationEvalCallback` (the recipe key ``calibration_eval:`` holds these fields).

    Evaluation:
        every: evaluate every ``every`` optimizer steps (step % every == 0). Default 10.
        prompts: the first ``prompts`` prompts of the held-out set, the same at every evaluation. Default 32.
        k: completions sampled per prompt. Default 4.
        temperature: sampling temperature; None uses the trainer's ``temperature``. Default None.
        max_new_tokens: completion length limit; None uses the trainer's ``max_completion_length``. Default None.
        batch_size: prompts per ``generate`` call (each call samples ``batch_size * k`` completions). Default 8.
        seed: sampling seed, the same at every evaluation (a batch's seed depends only on it and the batch's prompt
            ids), so evaluations differ by the weights, not by the draw; the training RNG is left untouched.
            Default 0.
        at_start: also evaluate before the first step (the *start* that ``pareto="accuracy"`` and
            ``stop_reference="start"`` compare with; no checkpoint). Default True.
        at_end: also evaluate at the last step when it is not a multiple of ``every``. Default True.
        n_bins: bins of ``ece`` (equal width) and ``decision_ece`` (equal count, at most one per sample). Default 10.

    Checkpoint choice and early stopping:
        metric: the calibration metric the Pareto rule and early stopping watch: any metric the callback logs that
            has a direction (:func:`watchable_metrics`: ``auroc``, ``auroc_per_prompt``, ``ece``, ``smooth_ece``,
            ``prr``, ``aurc``, ``decision_ece``, ``decision_frac_above_099`` and a user's declared metrics), read
            in its declared direction (the ECEs and AURC are better when lower). Default ``"auroc"``.
        pareto: ``"accuracy"``: the best accuracy among the evaluations whose ``metric`` is within
            ``pareto_margin`` of the start; ``"calibration"``: the best ``metric`` among the evaluations whose
            accuracy is within ``pareto_margin`` of the best accuracy. Default ``"accuracy"``.
        pareto_margin: that margin, in the metric's units. Default 0.02.
        early_stop: stop training when ``metric`` is worse than its reference by more than ``stop_margin`` while
            accuracy has not risen for ``patience`` evaluations. Default False.
        stop_margin: that margin. Default 0.05.
        stop_reference: ``"best"`` (the best value so far) or ``"start"`` (the first evaluation). Default ``"best"``.
        patience: evaluations without a new accuracy high (by more than ``accuracy_min_delta``) before a stop.
            Default 3.
        accuracy_min_delta: a rise of accuracy by at most this is not a rise. Default 0.0.
    """

    every: int = 10
    prompts: int = 32
    k: int = 4
    temperature: float | None = None
    max_new_tokens: int | None = None
    batch_size: int = 8
    seed: int = 0
    at_start: bool = True
    at_end: bool = True
    n_bins: int = 10
    metric: str = "auroc"
    pareto: Literal["accuracy", "calibration"] = "accuracy"
    pareto_margin: float = 0.02
    early_stop: bool = False
    stop_margin: float = 0.05
    stop_reference: Literal["best", "start"] = "best"
    patience: int = 3
    accuracy_min_delta: float = 0.0

    def __post_init__(self) -> None:
        for name in ("every", "prompts", "k", "batch_size", "n_bins", "patience"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"calibration_eval.{name} must be an integer >= 1, got {value!r}")
        tokens, temperature = self.max_new_tokens, self.temperature
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise ValueError(f"calibration_eval.max_new_tokens must be an integer >= 1 or null, got {tokens!r}")
        if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"calibration_eval.temperature must be a finite number > 0 or null, got {temperature!r}")
        for name in ("pareto_margin", "stop_margin", "accuracy_min_delta"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"calibration_eval.{name} must be a finite number >= 0, got {value!r}")
        if self.pareto not in ("accuracy", "calibration"):
            raise ValueError(f"calibration_eval.pareto must be 'accuracy' or 'calibration', got {self.pareto!r}")
        if self.stop_reference not in ("best", "start"):
            raise ValueError(f"calibration_eval.stop_reference must be 'best' or 'start', got {self.stop_reference!r}")
        if self.metric not in watchable_metrics():
            raise ValueError(f"calibration_eval.metric must be a calibration metric, one of "
                             f"{', '.join(watchable_metrics())}; got {self.metric!r}")
