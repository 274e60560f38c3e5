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


def _sorted_runs(confidence: Any, correct: Any):
    """Descending sort; returns (cum_correct [N], run_end [R] inclusive 0-based end of each tie run, N)."""
    s = as_scores(confidence)
    y = as_correct(correct)
    n = check_same_length(confidence=s, correct=y)
    order = np.argsort(-s, kind="stable")
    s_sorted = s[order]
    cum_correct = np.cumsum(y[order], dtype=np.float64)
    last_of_run = np.empty(n, dtype=bool)
    last_of_run[-1] = True
    np.not_equal(s_sorted[:-1], s_sorted[1:], out=last_of_run[:-1])
    return cum_correct, np.flatnonzero(last_of_run), n, s_sorted


def precision_coverage(confidence: Any, correct: Any, *, return_thresholds: bool = False):
    """Precision-coverage curve, one point per distinct confidence value.

    Point j answers every sample with ``confidence >= t_j`` (t_1 > t_2 > ... the distinct confidences):
    ``coverage_j = n_j / N`` and ``precision_j = (correct among them) / n_j``. Returns ``(coverage, precision)``
    with coverage increasing to 1 (``(coverage, precision, thresholds)`` with ``return_thresholds=True``).
    ``confidence`` may be any real score (log-probabilities work).
    """
    cum_correct, run_end, n, s_sorted = _sorted_runs(confidence, correct)
    answered = run_end + 1.0
    coverage = answered / n
    precision = cum_correct[run_end] / answered
    if return_thresholds:
        return coverage, precision, s_sorted[run_end]
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
    cum_correct, run_end, n, _ = _sorted_runs(confidence, correct)
    m = np.clip(np.ceil(cov * n - 1e-9), 1, n).astype(np.int64)  # number answered
    r = np.searchsorted(run_end, m - 1, side="left")  # tie run holding the m-th sample
    end = run_end[r]
    start = np.where(r > 0, run_end[np.maximum(r - 1, 0)] + 1, 0)
    before = np.where(start > 0, cum_correct[np.maximum(start - 1, 0)], 0.0)
    run_acc = (cum_correct[end] - before) / (end - start + 1)
    precision = (before + (m - start) * run_acc) / m
    return {float(c): float(p) for c, p in zip(cov, precision)}
