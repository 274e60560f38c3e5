"""The compiled loop behind :class:`calibrl.metrics.rejection.PRRReplicates`: PRR and the pooled AUROC of bootstrap
replicates given as prompt counts, one pass over the samples sorted once.

Imported only when replicates are computed (numba's import and, on a machine's first call, its compilation: about
a second, then read from numba's cache: :mod:`calibrl._compiled`).
"""

from __future__ import annotations

import numpy as np

from calibrl._compiled import compiled

BLOCK = 8  # replicates that walk the runs together


@compiled(nogil=True)
def replicate_totals(counts, group_sizes, group_right):
    """(samples [b], correct samples [b]) int64 of replicates ``counts`` [b, G] of prompts with ``group_sizes`` /
    ``group_right`` [G] int64 samples / correct samples (the harmonic table's length is chosen from the first;
    numpy's integer product is not BLAS and took 8x as long)."""
    b, n_groups = counts.shape
    n = np.zeros(b, dtype=np.int64)
    p = np.zeros(b, dtype=np.int64)
    for i in range(b):
        samples = 0  # local sums: the compiler keeps them in registers
        right = 0
        for g in range(n_groups):
            c = np.int64(counts[i, g])
            samples += c * group_sizes[g]
            right += c * group_right[g]
        n[i] = samples
        p[i] = right
    return n, p


@compiled(nogil=True)
def prr_auroc_replicates(counts, n_samples, n_right, run_start, pair_group, pair_size, pair_right, harmonic,
                         max_rejection):
    """(prr [b], auroc [b]) of replicates ``counts`` [b, G] (replicate r holds every sample of prompt g
    ``counts[r, g]`` times; any unsigned or non-negative integer dtype: the narrowest that holds them is the fastest),
    ``n_samples`` / ``n_right`` [b] their samples and correct samples (:func:`replicate_totals`).

    The samples sorted by decreasing score, in tie runs, each run's samples grouped by prompt into (run, prompt)
    pairs: ``run_start`` [T + 1] int64 the first pair of each run (and the end); per pair [E], its prompt
    ``pair_group``, its samples ``pair_size`` and correct samples ``pair_right`` (int32: the pass streams them, 12
    bytes a pair); ``harmonic`` [M] float64 H_0 .. H_{M-1}, M above every replicate's sample count;
    ``max_rejection`` in (0, 1].

    ``BLOCK`` replicates walk the pairs together: their counts are copied prompt-major into a [G, BLOCK] block of
    ``counts``' dtype, so one run reads its pair once and its prompt's counts of every replicate from one cache
    line, and the replicates' running sums are independent chains the processor overlaps (uint8 counts: the
    block is 1 MB at 125,000 prompts and stays in cache; 2.1x faster than one replicate at a time at a million
    samples, 1.5x at 200,000, measured on 2026-11-30).

    Per replicate, a run's samples w_t and correct samples r_t sum its pairs' counts times their sizes; K, R are
    their running sums, highest first. PRR: the area of :func:`calibrl.metrics.rejection._areas`, run by run: the
    levels k = K_{t-1} + 1 .. K_t kept (k > n - n_rej) add (R_{t-1} - K_{t-1} m_t)(H(K_t) - H(s_t)) + m_t (K_t -
    s_t), m_t = r_t / w_t, s_t = max(K_{t-1}, n - n_rej); the oracle and random as there. A run of one pair has m_t
    = that pair's accuracy (the same rational, so the same double, as r_t / w_t; no division for a pair of one
    sample) and adds nothing when the replicate does not hold its prompt (w_t = 0), so those runs, most of them,
    take no branch on the counts. AUROC: the Mann-Whitney count sum_t r_t (wrong below + (w_t - r_t) / 2) = P W -
    sum_t r_t (K_t - R_t) + sum_t r_t (w_t - r_t) / 2 over P right x W wrong, in int64 (exact). nan where a
    replicate has one class only (both figures) or no level (PRR).
    """
    b, n_groups = counts.shape
    n_runs = run_start.shape[0] - 1
    prr = np.empty(b)
    auroc = np.empty(b)
    block = np.zeros((n_groups, BLOCK), dtype=counts.dtype)
    n = np.zeros(BLOCK, dtype=np.int64)
    p = np.zeros(BLOCK, dtype=np.int64)
    lo = np.zeros(BLOCK, dtype=np.int64)  # the levels keep k = lo + 1 .. n samples
    n_rej = np.zeros(BLOCK)
    kept = np.zeros(BLOCK, dtype=np.int64)
    kept_right = np.zeros(BLOCK, dtype=np.int64)
    cross = np.zeros(BLOCK, dtype=np.int64)  # sum_t r_t (K_t - R_t)
    within = np.zeros(BLOCK, dtype=np.int64)  # sum_t r_t (w_t - r_t)
    area = np.zeros(BLOCK)
    h_prev = np.zeros(BLOCK)  # H(K_{t-1})
    w = np.zeros(BLOCK, dtype=np.int64)
    r = np.zeros(BLOCK, dtype=np.int64)
    for first_row in range(0, b, BLOCK):
        rows = min(BLOCK, b - first_row)  # the last block's missing replicates hold nothing
        for g in range(n_groups):
            for j in range(BLOCK):
                block[g, j] = counts[first_row + j, g] if j < rows else 0
        for j in range(BLOCK):
            n[j] = n_samples[first_row + j] if j < rows else 0
            p[j] = n_right[first_row + j] if j < rows else 0
            n_rej[j] = np.floor(max_rejection * n[j])
            lo[j] = n[j] - np.int64(n_rej[j])
            kept[j] = 0
            kept_right[j] = 0
            cross[j] = 0
            within[j] = 0
            area[j] = 0.0
            h_prev[j] = 0.0
        whole = True  # every replicate's window keeps every level (max_rejection = 1, the default): lo = 0
        for j in range(BLOCK):
            whole = whole and lo[j] == 0
        for t in range(n_runs):
            first = run_start[t]
            last = run_start[t + 1]
            single = last - first == 1
            if single and whole:
                # the usual run (one pair) when every level is kept: the loop below without its branches (each one
                # known: the run's m is its pair's, and a run is always inside the kept levels), the same
                # arithmetic, which the compiler can interleave across the replicates (1.15x faster at 200,000
                # samples, 1.1x at a million, the same bits; measured on 2026-11-30)
                group = pair_group[first]
                size = pair_size[first]
                right = pair_right[first]
                m = 1.0 * right if size == 1 else right / size
                for j in range(BLOCK):
                    c = np.int64(block[group, j])
                    wj = c * size
                    rj = c * right
                    prev_kept = kept[j]
                    prev_right = kept_right[j]
                    now = prev_kept + wj
                    kept[j] = now
                    kept_right[j] = prev_right + rj
                    cross[j] += rj * (now - prev_right - rj)
                    within[j] += rj * (wj - rj)
                    h = harmonic[now]
                    area[j] += (prev_right - prev_kept * m) * (h - h_prev[j]) + m * wj
                    h_prev[j] = h
                continue
            m_single = 0.0
            if single:
                group = pair_group[first]
                size = pair_size[first]
                right = pair_right[first]
                m_single = 1.0 * right if size == 1 else right / size
                for j in range(BLOCK):
                    c = np.int64(block[group, j])
                    w[j] = c * size
                    r[j] = c * right
            else:
                for j in range(BLOCK):
                    w[j] = 0
                    r[j] = 0
                for e in range(first, last):
                    group = pair_group[e]
                    size = pair_size[e]
                    right = pair_right[e]
                    for j in range(BLOCK):
                        c = np.int64(block[group, j])
                        w[j] += c * size
                        r[j] += c * right
            for j in range(BLOCK):
                wj = w[j]
                rj = r[j]
                if single:
                    m = m_single
                elif wj == 0:
                    continue
                else:
                    m = rj / wj
                prev_kept = kept[j]
                prev_right = kept_right[j]
                now = prev_kept + wj
                kept[j] = now
                kept_right[j] = prev_right + rj
                cross[j] += rj * (now - prev_right - rj)
                within[j] += rj * (wj - rj)
                h = harmonic[now]
                if prev_kept >= lo[j]:  # the whole run inside the kept levels
                    area[j] += (prev_right - prev_kept * m) * (h - h_prev[j]) + m * wj
                elif now > lo[j]:  # the run straddles the window's start
                    area[j] += (prev_right - prev_kept * m) * (h - harmonic[lo[j]]) + m * (now - lo[j])
                h_prev[j] = h
        for j in range(rows):
            i = first_row + j
            wrong = n[j] - p[j]
            den = p[j] * wrong
            auroc[i] = ((2 * (p[j] * wrong - cross[j]) + within[j]) / 2.0) / den if den > 0 else np.nan
            levels = max(n_rej[j], 1.0)
            oracle = (max(p[j] - lo[j], 0) + p[j] * (harmonic[n[j]] - harmonic[max(p[j], lo[j])])) / levels
            random = p[j] / max(n[j], 1)
            if oracle - random <= 0 or n_rej[j] < 1:
                prr[i] = np.nan
            else:
                prr[i] = (area[j] / levels - random) / (oracle - random)
    return prr, auroc
