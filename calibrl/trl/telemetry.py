"""Calibration telemetry for training: pure functions from a :class:`~calibrl.batch.RolloutBatch` to scalars.

The TRL trainer (:mod:`calibrl.trl`) calls :func:`calibration_metrics` on every generation batch (train and
eval) and logs each value as ``calibration/<key>`` through TRL's metrics, so TensorBoard / W&B show calibration
next to the reward. With ``logging_steps = k`` a logged value is TRL's mean of the k batches' values since the last
log: rollouts of the policies before each of those k updates, on training prompts, not the policy after the last. Everything here is framework-free and cheap (numpy on at most a few thousand rows).

Keys (all floats; ``nan`` when undefined, left out of the logs by ``CalibratedGRPOTrainer.log``):
    accuracy                 mean@k: the mean over prompts of the fraction of correct completions (``correct``,
                             else reward > threshold)
    auroc                    pooled AUROC of the sequence confidence (mean token log-prob) vs correctness
    auroc_per_prompt         mean over prompts with both outcomes of the within-prompt AUROC
    auroc_n_prompts          number of prompts entering ``auroc_per_prompt``
    confidence_correct       mean exp(logprob_mean) of correct completions (1 / perplexity)
    confidence_wrong         the same for wrong completions
    confidence_gap           confidence_correct - confidence_wrong
    mixed_group_fraction     fraction of prompts whose group has both outcomes (the ones that carry signal)
    ref_perplexity_mean      mean exp(-ref_logprob_mean), when the reference was run
    advantage_mean / _std / _max / _min / _abs_mean
    estimator/<key>          every finite scalar the estimator reported (e.g. ``mask_fraction`` for CAPO)
    decision_ece             ECE (10 equal-count bins) of the decision-token probability vs correctness
    decision_prob_mean       mean probability of the chosen decision class
    decision_frac_above_099  fraction of decisions with probability > 0.99 (the RLVR overconfidence symptom)

The calibration keys are the metrics declared for the ``telemetry`` context (:mod:`calibrl.metrics.registry`),
a user's declared metrics included; the advantage, reference and estimator keys are training diagnostics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from calibrl.batch import RolloutBatch

__all__ = [
    "PendingTelemetry", "advantage_metrics", "calibration_metrics", "completion_columns", "decision_metrics",
    "overwrite_last", "valid_rows",
]


def _np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    return np.asarray(x)


def advantage_metrics(advantages: Any) -> dict[str, float]:
    """mean / std / max / min / mean |A| of the advantages (per-token advantages are reduced per row first)."""
    a = _np(advantages).astype(np.float64)
    if a.ndim > 1:
        a = a.reshape(a.shape[0], -1).mean(axis=1)
    if a.size == 0:
        return {}
    return {
        "advantage_mean": float(a.mean()),
        "advantage_std": float(a.std()),
        "advantage_max": float(a.max()),
        "advantage_min": float(a.min()),
        "advantage_abs_mean": float(np.abs(a).mean()),
    }


def decision_metrics(decision_probs: Any, correct: Any, *, n_bins: int = 10) -> dict[str, float]:
    """The declared metrics of the decided class's probability (``decision_ece``: equal-count bins, as arXiv
    2601.13284 reports; ``decision_prob_mean``; ``decision_frac_above_099``); rows with NaN probability (no
    decision token) are ignored, NaN when no row has one."""
    from calibrl.metrics.registry import metric

    inputs = {"decision_prob": _np(decision_probs).astype(np.float64).reshape(-1),
              "correct": _np(correct).astype(bool).reshape(-1)}
    return {k: metric(k).compute(inputs, n_bins=n_bins)
            for k in ("decision_ece", "decision_prob_mean", "decision_frac_above_099")}


def calibration_metrics(
    batch: RolloutBatch,
    *,
    advantages: Any | None = None,
    info: dict[str, Any] | None = None,
    decision_probs: Any | None = None,
    decision_correct: Any | None = None,
    threshold: float = 0.5,
    correct: Any | None = None,
    valid: Any | None = None,
) -> dict[str, float]:
    """Calibration metrics of one batch of rollouts (see the module docstring for the keys).

    Only the rows with tokens enter any metric: ``valid`` when given, else ``batch.lengths > 0`` when the batch has
    lengths (a completion TRL masked out, ``mask_truncated_completions``, has no tokens, and its mean log-prob of 0
    would read as confidence 1), else every row.

    Args:
        batch: the rollouts; confidence metrics need ``logprob_mean``.
        advantages: the advantages the trainer used ([N] or [N, T]); adds ``advantage_*``.
        info: the estimator's diagnostics; finite scalars are passed through as ``estimator/<key>``.
        decision_probs: [N] probability of the chosen decision class (NaN where none), for decision tasks.
        decision_correct: [N] bool correctness for ``decision_probs`` (default: the correctness below).
        threshold: a completion is correct when its reward exceeds this (used when ``correct`` is None).
        correct: [N] bool correctness, overriding ``batch.rewards > threshold``. The trainer passes it when the
            reward is a weighted sum of several functions: correctness is then one function's own value
            (``CalibratedGRPOConfig.correctness_reward``), not the total.
        valid: [N] bool, the rows to use (overrides ``batch.lengths > 0``).
    """
    from calibrl.metrics.registry import compute_metrics

    if correct is None:
        correct = _np(batch.rewards).astype(np.float64) > threshold
    else:
        correct = _np(correct).astype(bool).reshape(-1)
        if correct.shape[0] != len(batch):
            raise ValueError(f"calibration_metrics: correct has {correct.shape[0]} rows, the batch {len(batch)}")
    keep = valid_rows(batch, valid=valid)
    if not keep.any():
        return {}
    correct = correct[keep]
    groups = _np(batch.group_ids)[keep]
    inputs: dict[str, Any] = {"correct": correct, "prompt_index": np.unique(groups, return_inverse=True)[1]}
    if batch.logprob_mean is not None:
        lpm = _np(batch.logprob_mean).astype(np.float64)[keep]
        inputs.update(score=lpm, confidence=np.exp(lpm), logprob_mean=lpm)
    out: dict[str, float] = compute_metrics("telemetry", inputs)
    if batch.ref_logprob_mean is not None:
        out["ref_perplexity_mean"] = float(np.exp(-_np(batch.ref_logprob_mean).astype(np.float64)[keep]).mean())
    if advantages is not None:
        out.update(advantage_metrics(_np(advantages)[keep]))
    for key, value in (info or {}).items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
            if math.isfinite(float(value)):
                out[f"estimator/{key}"] = float(value)
    if decision_probs is not None:  # against their own correctness (decision_correct) when the trainer gives one
        d_correct = correct if decision_correct is None else _np(decision_correct).astype(bool).reshape(-1)[keep]
        decided = {"decision_prob": _np(decision_probs).astype(np.float64).reshape(-1)[keep], "correct": d_correct}
        out.update(compute_metrics("telemetry", decided, where=lambda m: "decision_prob" in m.needs))
    return out


def valid_rows(batch: RolloutBatch, *, valid: Any | None = None) -> np.ndarray:
    """[N] bool rows the telemetry reads: ``valid`` if given, else the rows with tokens (``batch.lengths > 0``),
    else all rows."""
    if valid is not None:
        keep = _np(valid).astype(bool).reshape(-1)
        if keep.shape[0] != len(batch):
            raise ValueError(f"calibration_metrics: valid has {keep.shape[0]} rows, the batch {len(batch)}")
        return keep
    if batch.lengths is not None:
        return _np(batch.lengths).reshape(-1) > 0
    return np.ones(len(batch), dtype=bool)


def completion_columns(*, n: int, logprob_mean: Any | None, correct: Any, lengths: Any | None = None,
                       decision_probs: Any | None = None, decision: bool = False) -> dict[str, list]:
    """The per-completion columns calibrl adds to TRL's completions table (``log_completions``), one value per row
    of the gathered batch in TRL's order:

    * ``logprob_mean`` (float): the rollout policy's mean token log-prob; NaN (null) while unknown (filled in once
      the loss pass supplied it) and for a row without tokens (``lengths == 0``: no confidence);
    * ``correct`` (bool): by the correctness reward;
    * ``decision_prob`` (decision tasks only, ``decision=True``): the probability of the chosen class, None where
      the completion has no decision token (or the probability was not computed).
    """
    lpm = np.full(n, np.nan) if logprob_mean is None else _np(logprob_mean).astype(np.float64).reshape(-1).copy()
    if lengths is not None:
        lpm[_np(lengths).reshape(-1) == 0] = np.nan
    columns: dict[str, list] = {
        "logprob_mean": [float(x) for x in lpm],
        "correct": [bool(x) for x in _np(correct).astype(bool).reshape(-1)],
    }
    if decision:
        probs = np.full(n, np.nan) if decision_probs is None else _np(decision_probs).astype(np.float64).reshape(-1)
        columns["decision_prob"] = [float(p) if np.isfinite(p) else None for p in probs]
    return columns


def overwrite_last(column, values: list) -> None:
    """Replace the last ``len(values)`` entries of ``column`` (a list or TRL's bounded deque of logged values) with
    ``values`` (only as many as it holds): how a value known after the row was logged is filled in."""
    k = min(len(values), len(column))
    for i in range(1, k + 1):
        column[-i] = values[-i]


@dataclass
class PendingTelemetry:
    """Telemetry of one generation batch whose ``logprob_mean`` is read from the loss passes TRL does anyway (no
    extra forward: until the optimizer steps, the loss pass's per-token log-probs are the rollout policy's).

    ``fields`` are the :class:`RolloutBatch` keyword arguments without ``logprob_mean``; ``lpm_local`` [n_local]
    holds this process's values, NaN until the row went through a loss pass.
    """

    fields: dict[str, Any]
    advantages: torch.Tensor
    info: dict[str, Any]
    correct: torch.Tensor
    mode: str
    lpm_local: torch.Tensor
    table_batch: int | None = None  # the trainer's completions-table batch count when these rows were logged

    def fill(self, rows: torch.Tensor, logprob_mean: torch.Tensor) -> bool:
        """Record ``logprob_mean`` [B] of local ``rows`` [B] (first value of a row wins); True once every row has one."""
        fresh = torch.isnan(self.lpm_local[rows])
        self.lpm_local[rows[fresh]] = logprob_mean[fresh]
        return not bool(torch.isnan(self.lpm_local).any())
