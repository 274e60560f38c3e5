"""Prediction-rejection ratio (PRR), LM-Polygraph's ``PredictionRejectionArea`` normalised between random and
oracle rejection (Malinin et al. 2017; Fadeeva et al. 2023; Vashurin et al., TACL 2025).

Samples are sorted by confidence, most confident first. Rejecting the j least confident of N samples keeps the
top k = N - j; the accuracy-rejection curve is acc(k) = C(k) / k with C(k) the correct samples among the top k.
With R = floor(max_rejection * N) rejection levels j = 0 .. R - 1 (LM-Polygraph's ``num_rej``):

    area(score)  = (1 / R) * sum_{k = N - R + 1}^{N} C(k) / k
    oracle       = area with the correct samples first:  C(k) = min(k, P),  P = number correct
    random       = P / N  (the expected area of a random order: every level's expected accuracy is P / N)
    PRR          = (area - random) / (oracle - random)

so random rejection scores 0, the oracle 1, and a confidence that rejects right answers first is negative. NaN when
every sample is right or every one wrong (oracle = random). Our readings: LM-Polygraph takes uncertainty (higher
= less sure) and sorts it with ``np.argsort``, breaking ties by the sort's order, and estimates ``random`` by 1000
shuffles; we take confidence (higher = surer; ranking it is ranking the negated uncertainty), count tied
confidences at the expectation over their orders (C(k) grows linearly across a run of ties, at the run's
accuracy), and use random's exact expectation. Without ties the area is LM-Polygraph's to float rounding.

Sums over k use C's piecewise-linear form: over a tie run holding ranks a + 1 .. b with a run accuracy m,
sum_{k=a+1}^{b} C(k) / k = (C(a) - a m) (H_b - H_a) + m (b - a) with H the harmonic numbers, so the area costs a
sort and O(N) after it, and bootstrap replicates (samples weighted by their prompt's draw count, a weight w being w
tied copies) the same per replicate with no gathering (:func:`prr_replicates`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calibrl.metrics.abstention import _threshold_steps

__all__ = ["prr", "prr_replicates"]

_BLOCK = 1 << 21  # replicate x tie-run entries per block (16 MB per float64 array)


def _check_max_rejection(max_rejection: float) -> float:
    if not 0.0 < float(max_rejection) <= 1.0:
        raise ValueError(f"max_rejection must be in (0, 1], got {max_rejection!r}")
    return float(max_rejection)


def _tie_runs(score: np.ndarray):
    """Samples sorted by decreasing score: ``order`` [N] and the end (exclusive) of each tie run in it [T]."""
    order = np.argsort(-score, kind="stable")
    s = score[order]
    ends = np.append(np.flatnonzero(s[1:] != s[:-1]) + 1, s.size)
    return order, ends


def _harmonic(n_max: int) -> np.ndarray:
    """H_0 .. H_{n_max}: H_k = sum_{j <= k} 1 / j."""
    out = np.zeros(n_max + 1)
    np.cumsum(1.0 / np.arange(1, n_max + 1), out=out[1:])
    return out


def _table_lookup(table: np.ndarray):
    """H at integer-valued k read from ``table`` (:func:`_harmonic`)."""
    return lambda k: table[k.astype(np.int64)]


def _harmonic_at(k: np.ndarray) -> np.ndarray:
    """H_k for integer-valued k >= 0 without a table: digamma(k + 1) + Euler's gamma (1e-15 relative)."""
    from scipy.special import digamma

    return digamma(k + 1.0) + np.euler_gamma


def _areas(kept: np.ndarray, right: np.ndarray, max_rejection: float, harmonic):
    """PRR per row from cumulative counts at the tie-run ends: ``kept`` [b, T] samples (integer-valued) and
    ``right`` [b, T] correct samples among the top runs; ``harmonic(k)`` H at integer-valued k. Returns [b] (nan
    where undefined)."""
    n = kept[:, -1]
    p = right[:, -1]
    n_rej = np.floor(max_rejection * n)
    lo = n - n_rej  # levels keep k = lo + 1 .. n
    prev_k = np.concatenate([np.zeros((len(kept), 1)), kept[:, :-1]], axis=1)
    prev_c = np.concatenate([np.zeros((len(kept), 1)), right[:, :-1]], axis=1)
    size = kept - prev_k
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where(size > 0, (right - prev_c) / np.where(size > 0, size, 1), 0.0)
    start = np.maximum(prev_k, lo[:, None])  # first level of the run inside the window, exclusive
    inside = kept > start
    start_i = np.where(inside, start, kept)
    gain = np.where(inside, (prev_c - prev_k * m) * (harmonic(kept) - harmonic(start_i)) + m * (kept - start), 0.0)
    area = gain.sum(axis=1) / np.maximum(n_rej, 1)
    # oracle: C(k) = min(k, P); sum_{k=lo+1}^{n} min(k, P) / k = #{k <= P} + P (H_n - H_max(P, lo))
    cut = np.maximum(p, lo)
    oracle = (np.clip(p - lo, 0, None) + p * (harmonic(n) - harmonic(cut))) / np.maximum(n_rej, 1)
    random = p / np.maximum(n, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (area - random) / (oracle - random)
    out[(oracle - random <= 0) | (n_rej < 1)] = np.nan
    return out


def prr(confidence: Any, correct: Any, *, max_rejection: float = 1.0) -> float:
    """Prediction-rejection ratio (module docstring) of ``confidence`` [N] (any real score, higher = surer) for
    ``correct`` [N], rejecting up to ``max_rejection`` of the samples: 1 = the oracle's order, 0 = random, higher
    is better; nan with one class only."""
    mr = _check_max_rejection(max_rejection)
    # the tie runs highest first, with the samples and correct samples at or above each (as the precision-coverage
    # curve counts them: two value sorts, no argsort)
    kept, right, _, n = _threshold_steps(confidence, correct)
    harmonic = _harmonic_at if kept.size < n // 64 else _table_lookup(_harmonic(n))
    return float(_areas(kept[None, :], right[None, :], mr, harmonic)[0])


def prr_replicates(confidence: np.ndarray, correct: np.ndarray, group: np.ndarray, counts: np.ndarray, *,
                   max_rejection: float = 1.0) -> np.ndarray:
    """PRR of bootstrap replicates [b] given as group counts ``counts`` [b, G] (replicate r holds the samples of
    group g ``counts[r, g]`` times; ``group`` [N] dense group index): equal to :func:`prr` on each replicate's
    gathered rows up to float rounding (copies of one sample are ties). Replicates go in blocks of at most
    2^21 replicate x sample entries."""
    mr = _check_max_rejection(max_rejection)
    s = np.asarray(confidence, dtype=np.float64)
    y = np.asarray(correct, dtype=bool)
    order, ends = _tie_runs(s)
    g_sorted, y_sorted = group[order], y[order]
    harmonic = _table_lookup(_harmonic(int((counts @ np.bincount(group, minlength=counts.shape[1])).max())))
    out = np.empty(len(counts))
    step = max(1, _BLOCK // max(1, s.size))
    for a in range(0, len(counts), step):
        w = np.take(counts[a:a + step], g_sorted, axis=1)  # [b, N] weight of each sorted sample
        kept = np.cumsum(w, axis=1)[:, ends - 1]
        right = np.cumsum(w * y_sorted, axis=1)[:, ends - 1]
        out[a:a + step] = _areas(kept, right, mr, harmonic)
    return out
