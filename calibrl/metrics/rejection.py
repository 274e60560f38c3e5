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

from typing import Any, Iterable, NamedTuple

import numpy as np

from calibrl.metrics.abstention import (
    DEFAULT_COVERAGES,
    _aurc_from_steps,
    _check_coverages,
    _precision_at_coverage_from_steps,
    _threshold_steps,
)

__all__ = ["PRRReplicates", "RankingFigures", "prr", "prr_replicates", "ranking_figures"]


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


def _areas(run_kept: np.ndarray, run_right: np.ndarray, max_rejection: float, harmonic) -> np.ndarray:
    """PRR per row from the samples ``run_kept`` [b, T] and correct samples ``run_right`` [b, T] of each tie run,
    highest confidence first (integer-valued); ``harmonic(k)`` H at integer-valued k. Returns [b] (nan where
    undefined)."""
    kept = np.cumsum(run_kept, axis=1)
    right = np.cumsum(run_right, axis=1)
    n, p = kept[:, -1], right[:, -1]
    n_rej = np.floor(max_rejection * n)
    prev_k = kept - run_kept
    m = run_right / np.where(run_kept > 0, run_kept, 1.0)  # the run's accuracy (0 for an empty run)
    h_kept = harmonic(kept)
    if max_rejection < 1.0:  # levels keep k = n - n_rej + 1 .. n: a run's sum starts inside the window
        start = np.minimum(np.maximum(prev_k, (n - n_rej)[:, None]), kept)
        h_start = harmonic(start)
    else:  # every level: a run's sum starts where the previous run ended
        start = prev_k
        h_start = None
    # sum_{k=start+1}^{kept} C(k) / k with C(k) = C(prev_k) + (k - prev_k) m; zero when start = kept
    h_gap = np.diff(h_kept, axis=1, prepend=0.0) if h_start is None else h_kept - h_start
    gain = (right - run_right - prev_k * m) * h_gap + m * (kept - start)
    # summed column by column (Fortran order), the order the replicates were first summed in: the same values
    area = np.asfortranarray(gain).sum(axis=1) / np.maximum(n_rej, 1)
    # oracle: C(k) = min(k, P); sum_{k=lo+1}^{n} min(k, P) / k = #{k <= P} + P (H_n - H_max(P, lo))
    lo = n - n_rej
    oracle = (np.clip(p - lo, 0, None) + p * (harmonic(n) - harmonic(np.maximum(p, lo)))) / np.maximum(n_rej, 1)
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
    return _prr_from_steps(kept, right, n, mr)


def _prr_from_steps(kept: np.ndarray, right: np.ndarray, n: int, max_rejection: float) -> float:
    """:func:`prr` from :func:`_threshold_steps`' cumulative counts [R] (highest confidence first)."""
    harmonic = _harmonic_at if kept.size < n // 64 else _table_lookup(_harmonic(n))
    return float(_areas(np.diff(kept, prepend=0.0)[None, :], np.diff(right, prepend=0.0)[None, :], max_rejection,
                        harmonic)[0])


def _auroc_from_steps(kept: np.ndarray, right: np.ndarray) -> float:
    """Pooled AUROC from :func:`_threshold_steps`' cumulative counts [R]: sum over tie runs t of right_t x (wrong
    samples in lower runs + wrong_t / 2), over right x wrong. Integer-valued sums, so exactly the value of
    :func:`calibrl.metrics.auroc` (below 2^52 pairs)."""
    run_right = np.diff(right, prepend=0.0)
    run_wrong = np.diff(kept, prepend=0.0) - run_right
    n_right, n_wrong = right[-1], kept[-1] - right[-1]
    if n_right == 0 or n_wrong == 0:
        return float("nan")
    wrong_lower = n_wrong - np.cumsum(run_wrong)
    u = np.sum(run_right * wrong_lower) + 0.5 * np.sum(run_right * run_wrong)
    return float(u / (float(n_right) * float(n_wrong)))


class RankingFigures(NamedTuple):
    """The figures of one ranking of the samples (:func:`ranking_figures`), and its ``levels`` [R]: the distinct
    confidences, highest first (the figures depend only on how these split and order the samples)."""

    auroc: float
    aurc: float
    prr: float
    precision_at_coverage: dict[float, float]
    levels: np.ndarray


def ranking_figures(confidence: Any, correct: Any, *, coverages: Iterable[float] = DEFAULT_COVERAGES,
                    max_rejection: float = 1.0) -> RankingFigures:
    """AUROC, AURC, PRR and precision at ``coverages`` of ``confidence`` [N] (any real score) for ``correct`` [N]
    from one pass over the sorted scores: the values of :func:`calibrl.metrics.auroc`, :func:`~calibrl.metrics.aurc`,
    :func:`prr` and :func:`~calibrl.metrics.precision_at_coverage` called one by one (the same counts and the same
    arithmetic), at the cost of one of them."""
    mr = _check_max_rejection(max_rejection)
    cov = _check_coverages(coverages)
    kept, right, levels, n = _threshold_steps(confidence, correct)
    return RankingFigures(_auroc_from_steps(kept, right), _aurc_from_steps(kept, right, n),
                          _prr_from_steps(kept, right, n, mr), _precision_at_coverage_from_steps(kept, right, n, cov),
                          levels)


class PRRReplicates:
    """PRR (and, sharing the pass, AUROC) of bootstrap replicates given as group counts, for many chunks of
    replicates of one data set, from one sort of the scores.

    ``confidence``, ``correct``, ``group`` [N] (dense group index), ``n_groups``. Calling it with ``counts`` [b, G]
    (replicate r holds the samples of group g ``counts[r, g]`` times, integer-valued) returns [b], equal to
    :func:`prr` on each replicate's gathered rows up to float rounding (copies of one sample are ties); no replicate
    is sorted again. A replicate is one compiled pass over the samples in score order
    (:func:`calibrl.metrics._replicate_kernel.prr_auroc_replicates`): each tie run's samples and correct samples are
    its samples' counts summed, then :func:`_areas`' sum for the run, with the running sums K and R in integers.
    Eight replicates walk the runs together, their counts in the narrowest dtype that holds them, and a run of one
    (prompt's) pair takes no branch when every level is kept (the default). At 200,000 samples in 177,307 tie
    runs: 0.6 ms a replicate here (0.7-0.8 ms with those branches, 1.0-1.3 ms for the pass that took one replicate
    at a time, until 2026-11-30), against 3.9 ms for the same sums as some fifteen numpy passes and 16-19 ms for
    gathering and sorting each replicate's rows; at a million, 3.1 ms against 3.4 ms with the branches and 6.4 ms
    one at a time (``bench/eval_bootstrap.py``, ``bench/eval_scale.py``; docs/eval.md).
    """

    def __init__(self, confidence: np.ndarray, correct: np.ndarray, group: np.ndarray, n_groups: int, *,
                 max_rejection: float = 1.0):
        self.max_rejection = _check_max_rejection(max_rejection)
        s = np.asarray(confidence, dtype=np.float64)
        y = np.asarray(correct, dtype=bool)
        g = np.asarray(group, dtype=np.int64)
        order, ends = _tie_runs(s)
        run = np.repeat(np.arange(ends.size, dtype=np.int64), np.diff(ends, prepend=0))  # [N] run of each sorted sample
        # the (run, prompt) pairs, runs highest first: a prompt's tied samples (one answer cluster's consistency,
        # say) are summed once per replicate, not once each
        pair, inverse, size = np.unique(run * n_groups + g[order], return_inverse=True, return_counts=True)
        self.pair_group = (pair % n_groups).astype(np.int32)  # [E]
        self.pair_size = size.astype(np.int32)  # [E] samples
        self.pair_right = np.bincount(inverse.reshape(-1), weights=y[order], minlength=pair.size).astype(np.int32)
        self.run_start = np.searchsorted(pair // n_groups, np.arange(ends.size + 1)).astype(np.int64)  # [T + 1]
        self.group_sizes = np.bincount(g, minlength=n_groups).astype(np.int64)  # [G]
        self.group_right = np.bincount(g, weights=y, minlength=n_groups).astype(np.int64)  # [G]
        self._harmonic = _harmonic(0)

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        return self.with_auroc(counts)[0]

    @staticmethod
    def narrow(counts: np.ndarray) -> np.ndarray:
        """``counts`` (whole numbers, any dtype) in the narrowest dtype that holds them, uint8 for a bootstrap's:
        the pass reads a prompt's counts of several replicates at once, and a smaller block of them stays in
        cache. Counts already narrowed are taken as they are (the eval narrows a chunk once for all its sources)."""
        counts = np.asarray(counts)
        if counts.dtype.kind not in "ui":
            counts = np.rint(np.asarray(counts, dtype=np.float64))
        if counts.size and not (0 <= counts.min() and counts.max() < 2 ** 31):
            raise ValueError(f"counts must be whole numbers in [0, 2^31), got {counts.min()} .. {counts.max()}")
        top = int(counts.max(initial=0))
        return counts.astype(np.uint8 if top < 2 ** 8 else np.uint16 if top < 2 ** 16 else np.int32, copy=False)

    def with_auroc(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(prr [b], auroc [b])`` of the replicates: the pooled AUROC from the same per-run counts, the
        Mann-Whitney count in int64 (:func:`calibrl.metrics.auroc` of the gathered rows exactly)."""
        from calibrl.metrics._replicate_kernel import prr_auroc_replicates, replicate_totals

        counts = np.ascontiguousarray(self.narrow(counts))
        if counts.ndim != 2 or counts.shape[1] != self.group_sizes.size:
            raise ValueError(f"counts must be [replicates, {self.group_sizes.size}], got {counts.shape}")
        # H_0 .. H_n for the largest replicate so far, kept for the next chunks (grown when a replicate outgrows it:
        # a prefix of a longer cumulative sum is the same bits)
        n_samples, n_right = replicate_totals(counts, self.group_sizes, self.group_right)
        n_max = int(n_samples.max(initial=0))
        if self._harmonic.size <= n_max:
            self._harmonic = _harmonic(max(n_max, 2 * self._harmonic.size))
        return prr_auroc_replicates(counts, n_samples, n_right, self.run_start,
                                    self.pair_group, self.pair_size, self.pair_right, self._harmonic,
                                    self.max_rejection)


def prr_replicates(confidence: np.ndarray, correct: np.ndarray, group: np.ndarray, counts: np.ndarray, *,
                   max_rejection: float = 1.0) -> np.ndarray:
    """PRR of bootstrap replicates [b] given as group counts ``counts`` [b, G] (:class:`PRRReplicates`, for one
    chunk)."""
    return PRRReplicates(confidence, correct, group, counts.shape[1], max_rejection=max_rejection)(counts)
