"""The compiled loop behind :class:`calibrl.metrics.rejection.PRRReplicates`: PRR and the pooled AUROC of bootstrap
replicates given as prompt counts, one pass over the samples sorted once.

Imported only when replicates are computed (numba's import and, on a machine's first call, its compilation: about
a second, then read from numba's cache: :mod:`calibrl._compiled`).
"""

from __future__ import annotations

import numpy as np

from calibrl._compiled import compiled


@compiled(nogil=True)
def prr_auroc_replicates(counts, run_start, pair_group, pair_size, pair_right, group_sizes, group_right, harmonic,
                         max_rejection):
    """(prr [b], auroc [b]) of replicates ``counts`` [b, G] int32 (replicate r holds every sample of prompt g
    ``counts[r, g]`` times).

    The samples sorted by decreasing score, in tie runs, each run's samples grouped by prompt into (run, prompt)
    pairs: ``run_start`` [T + 1] int64 the first pair of each run (and the end); per pair [E], its prompt
    ``pair_group``, its samples ``pair_size`` and correct samples ``pair_right`` (int32: the pass streams them, 12
    bytes a pair, and gathers the counts at random, so smaller is faster at a million samples); ``group_sizes`` /
    ``group_right`` [G] int64 each prompt's samples and correct samples; ``harmonic`` [M] float64 H_0 .. H_{M-1}, M
    above every replicate's sample count; ``max_rejection`` in (0, 1].

    One pass over the pairs per replicate. A run's samples w_t and correct samples r_t sum its pairs' counts
    times their sizes; K, R are their running sums, highest first. PRR: the area of
    :func:`calibrl.metrics.rejection._areas`, run by run: the levels k = K_{t-1} + 1 .. K_t kept (k > n - n_rej) add
    (R_{t-1} - K_{t-1} m_t)(H(K_t) - H(s_t)) + m_t (K_t - s_t), m_t = r_t / w_t, s_t = max(K_{t-1}, n - n_rej);
    the oracle and random as there. A run of one pair has m_t = that pair's accuracy (the same rational, so the
    same double, as r_t / w_t; no division for a pair of one sample) and adds nothing when the replicate does not
    hold its prompt (w_t = 0), so those runs, most of them, take no branch on the counts. AUROC: the Mann-Whitney
    count sum_t r_t (wrong below + (w_t - r_t) / 2) = P W - sum_t r_t (K_t - R_t) + sum_t r_t (w_t - r_t) / 2 over
    P right x W wrong, in int64 (exact). nan where a replicate has one class only (both figures) or no level (PRR).
    """
    b = counts.shape[0]
    n_runs = run_start.shape[0] - 1
    prr = np.empty(b)
    auroc = np.empty(b)
    for i in range(b):
        c = counts[i]
        n = 0
        p = 0
        for g in range(c.shape[0]):
            n += np.int64(c[g]) * group_sizes[g]
            p += np.int64(c[g]) * group_right[g]
        n_rej = np.floor(max_rejection * n)
        lo = n - int(n_rej)  # the levels keep k = lo + 1 .. n samples
        kept = 0
        kept_right = 0
        cross = 0  # sum_t r_t (K_t - R_t)
        within = 0  # sum_t r_t (w_t - r_t)
        area = 0.0
        h_prev = 0.0  # H(K_{t-1})
        for t in range(n_runs):
            first = run_start[t]
            last = run_start[t + 1]
            if last - first == 1:
                cg = np.int64(c[pair_group[first]])
                size = pair_size[first]
                right = pair_right[first]
                w = cg * size
                r = cg * right
                m = 1.0 * right if size == 1 else right / size
            else:
                w = 0
                r = 0
                for e in range(first, last):
                    cg = np.int64(c[pair_group[e]])
                    w += cg * pair_size[e]
                    r += cg * pair_right[e]
                if w == 0:
                    continue
                m = r / w
            prev_kept = kept
            prev_right = kept_right
            kept += w
            kept_right += r
            cross += r * (kept - kept_right)
            within += r * (w - r)
            h = harmonic[kept]
            if prev_kept >= lo:  # the whole run inside the kept levels
                area += (prev_right - prev_kept * m) * (h - h_prev) + m * w
            elif kept > lo:  # the run straddles the window's start
                area += (prev_right - prev_kept * m) * (h - harmonic[lo]) + m * (kept - lo)
            h_prev = h
        wrong = n - p
        den = p * wrong
        auroc[i] = ((2 * (p * wrong - cross) + within) / 2.0) / den if den > 0 else np.nan
        levels = max(n_rej, 1.0)
        oracle = (max(p - lo, 0) + p * (harmonic[n] - harmonic[max(p, lo)])) / levels
        random = p / max(n, 1)
        if oracle - random <= 0 or n_rej < 1:
            prr[i] = np.nan
        else:
            prr[i] = (area / levels - random) / (oracle - random)
    return prr, auroc
