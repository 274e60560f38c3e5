"""Power of the certified abstention threshold: ``method="betting"`` (every sample, prompt-level betting test,
fixed-sequence testing) against ``method="bonferroni"`` (one sample per prompt, Clopper-Pearson, Bonferroni over
the grid), on simulated benchmarks where the TRUE precision and coverage of every threshold are known::

    python bench/abstention_power.py                 # the table of docs/metrics.md (200 repetitions per row)
    python bench/abstention_power.py --reps 20       # a quick look

Cases (confidence s, correctness y; target precision P = 0.9, delta = 0.1 unless told):

- ``iid``: every sample independent, perfectly calibrated: s ~ U(0, 1), y ~ Bernoulli(s). True precision of
  ``s >= t`` is (1 + t) / 2, coverage 1 - t.
- ``clustered``: each prompt has its own difficulty q ~ Beta(2, 1); each sample is right with probability q, with
  confidence sigmoid(2 logit(q) + 1.5 (y - 1/2) + N(0, 0.7^2)): samples of a prompt are correlated. True curves
  from a fresh draw of 1,000,000 prompts (one sample each: samples of a prompt are identically distributed).
- ``all-or-nothing``: a prompt has one confidence u ~ U(0, 1) and is solved with probability u; all its samples
  share u and the outcome. True precision (1 + t) / 2, coverage 1 - t, as in ``iid``, but m samples carry the
  information of one.

Columns: violation = fraction of repetitions whose chosen threshold has TRUE precision < P (must stay <= delta;
Monte-Carlo tolerance 0.002 for ``clustered``); certified = fraction choosing a threshold; coverage = mean TRUE
coverage of the chosen threshold (0 when none); oracle = coverage of the lowest grid threshold whose true precision
reaches P; the last column is their ratio.
"""

from __future__ import annotations

import argparse
import time
import zlib

import numpy as np

import calibrl.metrics as M

GRID = M.DEFAULT_THRESHOLD_GRID
SIZES = ((150, 4), (300, 4), (600, 4), (2000, 4), (150, 16), (300, 16), (600, 16), (2000, 16))


def draw(case: str, rng: np.random.Generator, n_prompts: int, m: int):
    """``(confidence [n m], correct [n m], prompt_ids [n m])`` of one simulated benchmark."""
    pids = np.repeat(np.arange(n_prompts), m)
    if case == "iid":
        s = rng.random(n_prompts * m)
        return s, rng.random(s.size) < s, pids
    if case == "all-or-nothing":
        u = rng.random(n_prompts)
        return u[pids], (rng.random(n_prompts) < u)[pids], pids
    if case == "clustered":
        q = np.clip(rng.beta(2.0, 1.0, n_prompts), 1e-6, 1 - 1e-6)[pids]
        y = rng.random(q.size) < q
        logit = np.log(q / (1 - q))
        return 1 / (1 + np.exp(-(2 * logit + 1.5 * (y - 0.5) + rng.normal(0, 0.7, q.size)))), y, pids
    raise ValueError(f"unknown case {case!r}")


def true_curves(case: str) -> tuple[np.ndarray, np.ndarray, float]:
    """``(precision [G], coverage [G], tolerance)`` of every grid threshold under the generating distribution."""
    if case in ("iid", "all-or-nothing"):
        return (1 + GRID) / 2, 1 - GRID, 1e-12
    s, y, _ = draw(case, np.random.default_rng(12345), 1_000_000, 1)
    asc, asc_y = np.sort(s), np.sort(s[y])
    answered = s.size - np.searchsorted(asc, GRID, side="left")
    correct = asc_y.size - np.searchsorted(asc_y, GRID, side="left")
    return correct / np.maximum(answered, 1), answered / s.size, 0.002


def power_row(case: str, n_prompts: int, m: int, method: str, reps: int, *, target: float, delta: float,
              curves) -> dict:
    """Violation rate, certified rate and mean true coverage of ``method`` over ``reps`` simulated benchmarks."""
    precision, coverage, tol = curves
    rng = np.random.default_rng(zlib.crc32(f"{case} {n_prompts} {m}".encode()))
    violations = certified = 0
    covered = []
    for r in range(reps):
        s, y, pids = draw(case, rng, n_prompts, m)
        t = M.calibrated_abstention(s, y, pids, target_precision=target, delta=delta, seed=r, method=method).threshold
        if t is None:
            covered.append(0.0)
            continue
        g = int(np.argmin(np.abs(GRID - t)))
        certified += 1
        violations += bool(precision[g] < target - tol)
        covered.append(coverage[g])
    return {"violation": violations / reps, "certified": certified / reps, "coverage": float(np.mean(covered))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=200, help="repetitions per row (default 200)")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--cases", default="iid,clustered,all-or-nothing")
    options = parser.parse_args()
    from tqdm import tqdm

    cases = [c.strip() for c in options.cases.split(",") if c.strip()]
    rows = [(c, n, m, meth) for c in cases for n, m in SIZES for meth in ("bonferroni", "betting")]
    curves = {c: true_curves(c) for c in cases}
    lines = [f"target precision {options.target:g}, delta {options.delta:g}, {options.reps} repetitions per row", "",
             "| case | prompts x samples | method | violation | certified | coverage | oracle | coverage / oracle |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    start = time.perf_counter()
    for case, n, m, method in tqdm(rows, desc="abstention power", unit="row"):
        precision, coverage, _ = curves[case]
        oracle = float(coverage[np.flatnonzero(precision >= options.target)[0]])
        row = power_row(case, n, m, method, options.reps, target=options.target, delta=options.delta,
                        curves=curves[case])
        lines.append(f"| {case} | {n} x {m} | {method} | {row['violation']:.3f} | {row['certified']:.2f} | "
                     f"{row['coverage']:.3f} | {oracle:.3f} | {row['coverage'] / oracle:.0%} |")
    print("\n".join(lines))
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
