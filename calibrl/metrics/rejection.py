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


def _areas(run_kept: np.ndarray, run_right: np.ndarray, max_rejection: float, harmonic, *,
           kept: np.ndarray | None = None, right: np.ndarray | None = None) -> np.ndarray:
    """PRR per row from the samples ``run_kept`` [b, T] and correct samples ``run_right`` [b, T] of each tie run,
    highest confidence first (integer-valued); ``harmonic(k)`` H at integer-valued k; ``kept`` / ``right`` their
    cumulative sums along the runs when the caller has them. Returns [b] (nan where undefined)."""
    kept = np.cumsum(run_kept, axis=1) if kept is None else kept
    right = np.cumsum(run_right, axis=1) if right is None else right
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
    is sorted again. A replicate's samples and correct samples per tie run are one sparse product, (per-(run, group)
    counts [T, G]) @ counts.T; then, with K_t and R_t the samples and correct samples in runs 1 .. t (highest
    first) and m_t = r_t / w_t the run's accuracy, the area's sum over every level k (``max_rejection`` 1) is

        sum_t (R_t - K_t m_t) (H(K_t) - H(K_{t-1})) + P

    (the module docstring's (C(a) - a m)(H_b - H_a) + m (b - a) with C(a) = R_t - r_t, a = K_t - w_t: the -r_t and
    +w_t m_t cancel), so a replicate costs the product, two cumulative sums and a few passes over its runs, in
    integers where it can (counts, K, R). A run of one sample has m_t = its correctness, so only runs of tied
    samples divide. ``max_rejection`` < 1 goes through :func:`_areas` (the window's start falls inside a run).
    Replicates go in blocks of at most 2^15 replicate x run entries (256 kB per array), so each pass stays in cache
    (at 177,000 runs, one replicate at a time was 2.3-2.5x faster than 11 at a time, docs/eval.md).
    """

    def __init__(self, confidence: np.ndarray, correct: np.ndarray, group: np.ndarray, n_groups: int, *,
                 max_rejection: float = 1.0):
        from scipy.sparse import csr_matrix

        self.max_rejection = _check_max_rejection(max_rejection)
        s = np.asarray(confidence, dtype=np.float64)
        y = np.asarray(correct, dtype=bool)
        order, ends = _tie_runs(s)
        sizes = np.diff(ends, prepend=0)
        run = np.repeat(np.arange(ends.size), sizes)  # run of each sorted sample
        g_sorted = np.asarray(group)[order]
        shape = (ends.size, int(n_groups))
        # per-(run, group) samples and correct samples: a run's counts in a replicate are one sparse product
        self.samples = csr_matrix((np.ones(s.size, dtype=np.int64), (run, g_sorted)), shape=shape)  # [T, G]
        self.right = csr_matrix((y[order].astype(np.int64), (run, g_sorted)), shape=shape)  # [T, G]
        self.tied = np.flatnonzero(sizes > 1)  # [T'] runs of two or more samples: their accuracy varies
        self.run_accuracy = y[order][ends - sizes].astype(np.float64)  # [T] m_t of a one-sample run
        self.group_sizes = np.bincount(group, minlength=n_groups).astype(np.int64)

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        return self.with_auroc(counts)[0]

    def _run_counts(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For ``counts`` [b, G] int64: the samples ``w`` and correct samples ``r`` of each tie run and their
        cumulative sums ``kept``, ``right`` along the runs, highest first, [b, T] int64 each."""
        c = np.ascontiguousarray(counts.T)  # [G, b]
        w, r = np.asarray(self.samples @ c).T, np.asarray(self.right @ c).T
        return w, r, np.cumsum(w, axis=1), np.cumsum(r, axis=1)

    def with_auroc(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(prr [b], auroc [b])`` of the replicates: the pooled AUROC from the same per-run counts, the
        Mann-Whitney count sum_t r_t (wrong samples in lower runs + (w_t - r_t) / 2) = P W - sum_t r_t (K_t - R_t)
        + sum_t r_t (w_t - r_t) / 2 over P right x W wrong, in int64 (:func:`calibrl.metrics.auroc` of the gathered
        rows exactly)."""
        counts = np.rint(np.asarray(counts, dtype=np.float64)).astype(np.int64)
        harmonic = _harmonic(int((counts @ self.group_sizes).max(initial=0)))
        prr_out, auroc_out = np.empty(len(counts)), np.empty(len(counts))
        step = max(1, _REPLICATE_BLOCK // max(1, self.samples.shape[0]))
        for a in range(0, len(counts), step):
            w, r, kept, right = self._run_counts(counts[a:a + step])  # [b, T]
            n, p = kept[:, -1], right[:, -1]
            wrong_total = n - p
            twice_u = 2 * p * wrong_total - 2 * _rowdot(r, kept - right) + _rowdot(r, w) - _rowdot(r, r)
            den = p * wrong_total
            with np.errstate(invalid="ignore", divide="ignore"):
                auroc_out[a:a + step] = np.where(den > 0, (twice_u / 2.0) / np.where(den > 0, den, 1), np.nan)
            if self.max_rejection < 1.0:
                prr_out[a:a + step] = _areas(w.astype(np.float64), r.astype(np.float64), self.max_rejection,
                                             _table_lookup(harmonic), kept=kept.astype(np.float64),
                                             right=right.astype(np.float64))
                continue
            m = np.broadcast_to(self.run_accuracy, w.shape)
            if self.tied.size:  # a tied run's accuracy in this replicate (0 for a run it does not hold)
                m = m.copy()
                wt, rt = w[:, self.tied], r[:, self.tied]
                m[:, self.tied] = rt / np.where(wt > 0, wt, 1)
            h_kept = harmonic[kept]
            h_gap = np.diff(h_kept, axis=1, prepend=0.0)  # H(K_t) - H(K_{t-1}), K_0 = 0
            area = (_rowdot(right - kept * m, h_gap) + p) / np.maximum(n, 1)
            oracle = (p + p * (harmonic[n] - harmonic[p])) / np.maximum(n, 1)  # min(k, P) / k summed over k
            random = p / np.maximum(n, 1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out = (area - random) / (oracle - random)
            out[(oracle - random <= 0) | (n < 1)] = np.nan
            prr_out[a:a + step] = out
        return prr_out, auroc_out


_REPLICATE_BLOCK = 1 << 15  # replicate x tie-run entries per block of PRRReplicates (256 kB per int64 array)


def _rowdot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """sum_j x[i, j] y[i, j] per row i, [b] (one pass, no product array kept)."""
    return np.einsum("ij,ij->i", x, y)


def prr_replicates(confidence: np.ndarray, correct: np.ndarray, group: np.ndarray, counts: np.ndarray, *,
                   max_rejection: float = 1.0) -> np.ndarray:
    """PRR of bootstrap replicates [b] given as group counts ``counts`` [b, G] (:class:`PRRReplicates`, for one
    chunk)."""
    return PRRReplicates(confidence, correct, group, counts.shape[1], max_rejection=max_rejection)(counts)
