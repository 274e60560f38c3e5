"""Selective prediction: answer only when confident enough, abstain otherwise.

Sort samples by confidence, highest first, and answer the most confident fraction (the *coverage*); the
*precision* is the accuracy on the answered samples and the *risk* is ``1 - precision``.

Ties: samples with equal confidence cannot be separated by any threshold, so :func:`precision_coverage` and
:func:`aurc` treat a run of tied samples as ONE threshold step (answered all together or not at all), which
makes every figure independent of the input order. :func:`precision_at_coverage` asks for an exact coverage
that may fall inside a tie run; it then counts the tied run at its mean accuracy -- the expected precision when
ties are broken at random.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from calibrl.metrics._arrays import as_correct, as_scores, check_same_length

__all__ = ["aurc", "precision_at_coverage", "precision_coverage", "DEFAULT_COVERAGES"]

DEFAULT_COVERAGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def _threshold_steps(confidence: Any, correct: Any):
    """One step per distinct confidence, highest first.

    Returns ``(answered [R], answered_correct [R], thresholds [R], N)``: step j answers every sample with
    confidence >= thresholds[j]. Uses value sorts (no argsort): the sorted scores give the tie runs, the sorted
    scores of the correct samples give the correct counts via ``searchsorted``.
    """
    s = as_scores(confidence)
    y = as_correct(correct)
    n = check_same_length(confidence=s, correct=y)
    asc = np.sort(s)
    asc_pos = np.sort(s[y])
    run_start = np.flatnonzero(np.concatenate(([True], asc[1:] != asc[:-1])))[::-1]  # highest value first
    thresholds = asc[run_start]
    answered = n - run_start
    answered_correct = asc_pos.size - np.searchsorted(asc_pos, thresholds, side="left")
    return answered.astype(np.float64), answered_correct.astype(np.float64), thresholds, n


def precision_coverage(confidence: Any, correct: Any, *, return_thresholds: bool = False):
    """Precision-coverage curve, one point per distinct confidence value.

    Point j answers every sample with ``confidence >= t_j`` (t_1 > t_2 > ... the distinct confidences):
    ``coverage_j = n_j / N`` and ``precision_j = (correct among them) / n_j``. Returns ``(coverage, precision)``
    with coverage increasing to 1 (``(coverage, precision, thresholds)`` with ``return_thresholds=True``).
    ``confidence`` may be any real score (log-probabilities work).
    """
    answered, answered_correct, thresholds, n = _threshold_steps(confidence, correct)
    coverage = answered / n
    precision = answered_correct / answered
    if return_thresholds:
        return coverage, precision, thresholds
    return coverage, precision


def aurc(confidence: Any, correct: Any) -> float:
    """Area under the risk-coverage curve (lower is better), risk = 1 - precision.

    ``AURC = sum_j (coverage_j - coverage_{j-1}) * risk_j`` over the threshold steps of
    :func:`precision_coverage` (``coverage_0 = 0``). Without ties this is exactly Geifman et al.'s
    ``(1/N) sum_{i=1}^{N} risk(top-i samples)``; a tie run contributes its width times the risk once it is
    answered.
    """
    coverage, precision = precision_coverage(confidence, correct)
    widths = np.diff(coverage, prepend=0.0)
    return float(np.sum(widths * (1.0 - precision)))


def precision_at_coverage(
    confidence: Any, correct: Any, coverages: Iterable[float] = DEFAULT_COVERAGES
) -> dict[float, float]:
    """Precision when answering the most confident fraction c of the samples, for each c in ``coverages``.

    Answers the top ``m = ceil(c * N)`` samples (at least 1). When the m-th sample sits inside a tie run, the
    part of the run that is answered counts at the run's mean accuracy (expected precision under random
    tie-breaking). Returns ``{c: precision}``.
    """
    cov = np.asarray(list(coverages), dtype=np.float64).reshape(-1)
    if cov.size == 0:
        return {}
    if np.isnan(cov).any() or cov.min() <= 0.0 or cov.max() > 1.0:
        raise ValueError(f"coverages must lie in (0, 1], got {cov.tolist()}")
    answered, answered_correct, _, n = _threshold_steps(confidence, correct)
    m = np.clip(np.ceil(cov * n - 1e-9), 1, n)  # number of samples answered
    r = np.searchsorted(answered, m, side="left")  # first step answering at least m: its tie run holds the m-th
    before_n = np.where(r > 0, answered[np.maximum(r - 1, 0)], 0.0)
    before_c = np.where(r > 0, answered_correct[np.maximum(r - 1, 0)], 0.0)
    run_acc = (answered_correct[r] - before_c) / (answered[r] - before_n)
    precision = (before_c + (m - before_n) * run_acc) / m
    return {float(c): float(p) for c, p in zip(cov, precision)}
