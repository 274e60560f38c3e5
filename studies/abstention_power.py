"""Power of the certified abstention threshold: ``method="betting"`` (every sample, prompt-level betting test,
fixed-sequence testing; as by default, and with the randomized Ville rule of ``randomize=True``) against
``method="bonferroni"`` (one sample per prompt, Clopper-Pearson, Bonferroni over the grid), on simulated benchmarks
where the TRUE precision and coverage of every threshold are known, and an upper bound on what ANY valid
prompt-level procedure can certify in the ``iid`` case::

    python -m studies.abstention_power                 # the tables of docs/metrics.md (200 repetitions per row)
    python -m studies.abstention_power --reps 20       # a quick look
    python -m studies.abstention_power --bound-only    # only the upper bound (about a minute)

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
coverage of the chosen threshold (0 when none); meeting target = the same mean counting only chosen thresholds whose
true precision reaches P (a violation counts 0); oracle = coverage of the lowest grid threshold whose true
precision reaches P; the last column is coverage / oracle.

Upper bound (``iid`` only, :func:`np_upper_bound`): for each grid threshold t the least favourable null Q*_t of the
per-prompt term (the Kullback-Leibler projection of the true law onto the null, E[x] <= P) and the Neyman-Pearson
power b_t of the best level-delta test of Q*_t against the truth on ALL n prompts; any valid procedure certifies a
threshold <= t with probability <= b_t, so its mean coverage from thresholds meeting the target is at most
sum_t (coverage_t - coverage_{t+1}) min(1, b_t). docs/metrics.md gives the argument.
"""

from __future__ import annotations

import argparse
import functools
import math
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


METHODS = {"bonferroni": dict(method="bonferroni"), "betting": dict(method="betting"),
           "betting, randomized": dict(method="betting", randomize=True)}  # row label -> calibrated_abstention keywords


def power_row(case: str, n_prompts: int, m: int, method: str, reps: int, *, target: float, delta: float,
              curves) -> dict:
    """Violation rate, certified rate and mean true coverage (all chosen thresholds, and only those meeting the
    target) of the ``METHODS[method]`` procedure over ``reps`` simulated benchmarks."""
    precision, coverage, tol = curves
    rng = np.random.default_rng(zlib.crc32(f"{case} {n_prompts} {m}".encode()))
    violations = certified = 0
    covered, covered_ok = [], []
    for r in range(reps):
        s, y, pids = draw(case, rng, n_prompts, m)
        t = M.calibrated_abstention(s, y, pids, target_precision=target, delta=delta, seed=r,
                                    **METHODS[method]).threshold
        if t is None:
            covered.append(0.0)
            covered_ok.append(0.0)
            continue
        g = int(np.argmin(np.abs(GRID - t)))
        certified += 1
        bad = bool(precision[g] < target - tol)
        violations += bad
        covered.append(coverage[g])
        covered_ok.append(0.0 if bad else coverage[g])
    return {"violation": violations / reps, "certified": certified / reps, "coverage": float(np.mean(covered)),
            "coverage_ok": float(np.mean(covered_ok))}


# ------------------------------------------------------------------ upper bound for any valid procedure (iid)
@functools.lru_cache(maxsize=None)
def _count_vectors(m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """All vectors of k non-negative integers summing to m, [C(m + k - 1, k - 1), k], and their log multinomial
    coefficients log(m! / prod counts!)."""
    def rows(total, cells):
        if cells == 1:
            return [[total]]
        return [[first, *rest] for first in range(total + 1) for rest in rows(total - first, cells - 1)]

    counts = np.array(rows(m, k))
    return counts, math.lgamma(m + 1) - np.vectorize(math.lgamma)(counts + 1.0).sum(axis=1)


def iid_prompt_law(t: float, t_low: float, m: int, target: float):
    """Law of one prompt of the ``iid`` case at two thresholds t_low <= t: ``(prob [K], x_t [K], x_low [K])`` over
    the K count vectors of m samples in 5 cells (answered at t right / wrong, answered at t_low but not t right /
    wrong, not answered), x = (c - P a) / m + P the betting term. s ~ U(0, 1), y ~ Bernoulli(s):
    P(s >= t, right) = (1 - t^2) / 2, P(s >= t, wrong) = (1 - t)^2 / 2."""
    hi = np.array([(1 - t * t) / 2, (1 - t) ** 2 / 2])
    lo = np.array([(1 - t_low * t_low) / 2, (1 - t_low) ** 2 / 2]) - hi
    cells = np.concatenate([hi, lo, [1 - hi.sum() - lo.sum()]])
    counts, log_coef = _count_vectors(m, 5)
    with np.errstate(divide="ignore"):
        prob = np.exp(log_coef + (counts * np.log(np.maximum(cells, 1e-300))).sum(axis=1))
    prob = np.where((counts > 0) & (cells <= 0), 0.0, 1.0).prod(axis=1) * prob
    x_t = target + ((1 - target) * counts[:, 0] - target * counts[:, 1]) / m
    x_low = x_t + ((1 - target) * counts[:, 2] - target * counts[:, 3]) / m
    return prob, x_t, x_low


def kl_projection_bet(prob: np.ndarray, x: np.ndarray, target: float) -> float:
    """lambda* = argmax over [0, 1/P] of E log(1 + lambda (x - P)) (the dual of KL_inf, Honda & Takemura 2010):
    the law of mean <= P closest to ``prob`` in KL(prob || Q) is ``Q*(x) = prob(x) / (1 + lambda* (x - P))`` for
    x > 0 and the rest of the mass at x = 0. Solved in log(1 - lambda* P) (the optimum may sit at 1/P)."""
    from scipy.optimize import brentq

    def slope(log_u):
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.nansum(prob * (x - target) / (1 + (1 - np.exp(log_u)) / target * (x - target))))

    if slope(0.0) <= 0:
        return 0.0
    if slope(-700.0) >= 0:
        return 1.0 / target
    return (1 - np.exp(brentq(slope, -700.0, 0.0, xtol=1e-14))) / target


def _null_member(prob: np.ndarray, x: np.ndarray, target: float, lam: float, k: int, m: int):
    """One null law of the per-prompt term at a threshold: the true prompts reweighted by 1 / (1 + lam (x - P))
    (where that is > 0), mixed with mass a of a prompt answering k of its m samples, all wrong (term
    v = P - P k / m), a chosen so that the mean is exactly P. Returns ``(q [K] over the entries of prob, a, v)``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = 1 + lam * (x - target)
        tilt = np.where(factor > 1e-12, prob / factor, 0.0)
    tilt /= tilt.sum()
    mean, v = float(np.sum(tilt * x)), target - target * k / m
    a = max(0.0, (mean - target) / (mean - v))
    q = (1 - a) * tilt
    q[int(np.argmin(np.abs(x - v)))] += a
    return q, a, v


def _np_power(p: np.ndarray, q: np.ndarray, n: int, delta: float, sims: int, rng) -> float:
    """Power under p of the level-delta Neyman-Pearson test of q against p on n i.i.d. draws (Monte-Carlo):
    reject when sum log(p / q) over the draws exceeds its (1 - delta) quantile under q (a draw where p = 0 never
    rejects)."""
    keep = p > 0
    llr = np.log(p[keep]) - np.log(np.maximum(q[keep], 1e-300))
    outside = max(0.0, 1.0 - float(q[keep].sum()))
    null = rng.multinomial(n, np.append(q[keep], outside) / (q[keep].sum() + outside), size=sims)
    s_null = np.where(null[:, -1] > 0, -np.inf, null[:, :-1] @ llr)
    s_true = rng.multinomial(n, p[keep] / p[keep].sum(), size=sims) @ llr
    return float(np.mean(s_true > np.quantile(s_null, 1 - delta)))


@functools.lru_cache(maxsize=None)
def _null_family(g: int, m: int, target: float):
    """The null laws tried at grid threshold g for prompts of m samples (``iid`` case): for lam in
    {0, 1/3, 2/3, 1} x lambda* and k in {1, 2, m/2, m}, :func:`_null_member` on the distinct term values, kept
    only when every grid threshold below GRID[g] is a null too (E[x_low] <= P: then certifying ANY threshold <= t_g
    is an error under it). Returns ``(p [V], [q [V], ...])``."""
    prob, x, _ = iid_prompt_law(GRID[g], GRID[g], m, target)
    values, where = np.unique(np.round(x, 12), return_inverse=True)
    p = np.bincount(where, prob)
    lam_star = kl_projection_bet(p, values, target)
    members = [(lam, k) for lam in sorted({0.0, lam_star / 3, 2 * lam_star / 3, lam_star})
               for k in sorted({1, 2, m // 2, m})]
    tilt_low = {}  # lam -> [g] tilted mean of x at each lower threshold
    for lam in {lam for lam, _ in members}:
        tilt_low[lam] = []
    for t_low in GRID[:g]:
        prob2, x_g, x_low = iid_prompt_law(GRID[g], t_low, m, target)
        for lam in tilt_low:
            with np.errstate(divide="ignore", invalid="ignore"):
                factor = 1 + lam * (x_g - target)
                w = np.where(factor > 1e-12, prob2 / factor, 0.0)
            tilt_low[lam].append(float(np.sum(w * x_low) / np.sum(w)))
    family = []
    for lam, k in members:
        q, a, v = _null_member(p, values, target, lam, k, m)
        # the added prompt's k samples have confidence 1: at every lower threshold its term is <= v
        if all((1 - a) * mean_low + a * v <= target + 1e-12 for mean_low in tilt_low[lam]):
            family.append(q)
    return p, family


def np_upper_bound(n_prompts: int, m: int, *, target: float, delta: float, sims: int = 50_000, seed: int = 0):
    """Upper bound on the mean true coverage, from thresholds meeting the target, of ANY procedure that is valid
    for every prompt law, on ``n_prompts`` prompts x m samples of the ``iid`` case (all prompts may calibrate).

    For grid threshold t_g and a null law Q under which every threshold <= t_g misses the target,
    ``1{certified threshold <= t_g}`` is a level-delta test of Q, so its probability under the truth is at most
    the Neyman-Pearson power of Q^n against the truth; b_g = the smallest over :func:`_null_family` (chosen on
    ``sims / 5`` draws, then measured on ``sims`` fresh ones), 1 where no member qualifies. At the oracle threshold
    the truth is itself the limit of nulls: b = delta. Returns ``(sum_g (coverage_g - coverage_{g+1}) min(1, b_g),
    b [G])`` over the thresholds meeting the target."""
    rng = np.random.default_rng(seed)
    precision, coverage = (1 + GRID) / 2, 1 - GRID
    oracle = int(np.flatnonzero(precision >= target)[0])
    b = np.ones(GRID.size)
    b[oracle] = delta
    for g in range(oracle + 1, GRID.size - 1):
        p, family = _null_family(g, m, target)
        if not family:
            continue
        trial = [_np_power(p, q, n_prompts, delta, max(sims // 5, 1000), rng) for q in family]
        b[g] = _np_power(p, family[int(np.argmin(trial))], n_prompts, delta, sims, rng)
    steps = coverage[oracle:-1] - coverage[oracle + 1:]
    return float(np.sum(steps * np.minimum(1.0, b[oracle:-1]))), b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=200, help="repetitions per row (default 200)")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--cases", default="iid,clustered,all-or-nothing")
    parser.add_argument("--bound-only", action="store_true", help="print only the upper bound for the iid case")
    options = parser.parse_args()
    from tqdm import tqdm

    start = time.perf_counter()
    lines = []
    if not options.bound_only:
        cases = [c.strip() for c in options.cases.split(",") if c.strip()]
        rows = [(c, n, m, meth) for c in cases for n, m in SIZES for meth in METHODS]
        curves = {c: true_curves(c) for c in cases}
        lines += [f"target precision {options.target:g}, delta {options.delta:g}, {options.reps} repetitions per row",
                  "", "| case | prompts x samples | method | violation | certified | coverage | meeting target | "
                  "oracle | coverage / oracle |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for case, n, m, method in tqdm(rows, desc="abstention power", unit="row"):
            precision, coverage, _ = curves[case]
            oracle = float(coverage[np.flatnonzero(precision >= options.target)[0]])
            row = power_row(case, n, m, method, options.reps, target=options.target, delta=options.delta,
                            curves=curves[case])
            lines.append(f"| {case} | {n} x {m} | {method} | {row['violation']:.3f} | {row['certified']:.2f} | "
                         f"{row['coverage']:.3f} | {row['coverage_ok']:.3f} | {oracle:.3f} | "
                         f"{row['coverage'] / oracle:.0%} |")
        lines.append("")
    oracle = float(1 - GRID[np.flatnonzero((1 + GRID) / 2 >= options.target)[0]])
    lines += ["Upper bound, iid case: mean coverage from thresholds meeting the target, any valid procedure on all "
              "prompts", "", "| prompts x samples | bound | oracle | bound / oracle |", "|---|---:|---:|---:|"]
    for n, m in tqdm(SIZES, desc="upper bound", unit="size"):
        bound, _ = np_upper_bound(n, m, target=options.target, delta=options.delta)
        lines.append(f"| {n} x {m} | {bound:.3f} | {oracle:.3f} | {bound / oracle:.0%} |")
    print("\n".join(lines))
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
