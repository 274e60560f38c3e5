"""Power calculation of the powered real-model study (docs/protocols/realmodel_powered.md): the 95% half-width of
the paired prompt-level bootstrap interval of an AUROC difference, as a function of held-out prompts x samples
per prompt.

No committed data hold the untrained SmolLM2's per-sample confidence and correctness (the baseline's jsonl files
and the study's evaluations were never committed), so the samples come from a model fitted to the documented
baseline figures (docs/results/realmodel.md, multiple_choice, chat-direct):

* prompt p has a difficulty u_p ~ N(0, sigma_u^2); a sample is right with probability sigmoid(mu + u_p);
* its confidence (the mean token log-prob, any monotone scale) is b_u * u_p + b_y * right + c_p + e, with a prompt
  offset c_p ~ N(0, sigma_c^2) (prompt length, wording) and e ~ N(0, 1): b_u makes the pooled AUROC reward knowing
  which prompts are hard, b_y separates right from wrong answers OF ONE PROMPT;
* fitted on 160,000 simulated samples: mu to the accuracy, sigma_u to pass@8 (a heterogeneity measure: samples
  of a prompt are correlated through u_p), b_y to the AUROC within prompts, b_u to the pooled AUROC;
* two evaluations on the same prompts (the study's matched pair: a method's evaluation and GRPO's of the same
  seed) share the prompts: their difficulties correlate rho (u_p^B = rho u_p^A + sqrt(1 - rho^2) v_p), so do
  their offsets; samples are drawn independently given the prompt. Both follow the same law, so the true
  difference is 0 (the half-width hardly depends on the difference at these sizes).

For each prompts x samples size, REPS simulated pairs; each gets the paired bootstrap interval
(:func:`calibrl.metrics.paired.paired_bootstrap_difference`, N_BOOT replicates) and, for comparison, the unpaired
one; "1.96 sd" is 1.96 x the spread of the point difference over the REPS pairs (what the half-width should be).
Then the same at the chosen size under other assumptions (accuracy 0.16 / 0.30, weaker or stronger clustering,
rho 0.5 / 1.0). Usage::

    python -m studies.realmodel_power                  # about 5 minutes on a busy 2-core machine
    python -m studies.realmodel_power --reps 20 --n-boot 300    # quicker, noisier
    python -m studies.realmodel_power --speed                    # seconds of the vectorised paired bootstrap
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace

import numpy as np

from calibrl import metrics as M
from calibrl.metrics.paired import paired_bootstrap_difference

# documented untrained-baseline figures (docs/results/realmodel.md): multiple_choice, chat-direct, 40 test prompts
# x 8; the study's start on levels 1-2 (48 validation prompts x 4) had accuracy 0.161 and AUROC 0.621
BASELINE = {"accuracy": 0.222, "pass_at_8": 0.825, "auroc": 0.572, "auroc_per_prompt": 0.546}


@dataclass(frozen=True)
class Assumptions:
    """Targets of the fit and the pairing: accuracy, pass@8, pooled and within-prompt AUROC, rho (the
    correlation of a prompt's difficulty and offset between the two evaluations), sigma_c (prompt offsets)."""

    accuracy: float = 0.222
    pass_at_8: float = 0.825
    sigma_u: float | None = None  # given: kept (not fitted to pass@8)
    auroc: float = 0.60
    auroc_per_prompt: float = 0.55
    rho: float = 0.8
    sigma_c: float = 0.5
    label: str = "base"


@dataclass(frozen=True)
class Fitted:
    mu: float
    sigma_u: float
    b_u: float
    b_y: float
    sigma_c: float
    rho: float


def _sample(fit: Fitted, rng: np.random.Generator, *, prompts: int, k: int, u=None, c=None):
    """One evaluation: prompt ids [P k], right [P k] bool, confidence [P k]; u, c [P] given or drawn."""
    u = rng.normal(scale=fit.sigma_u, size=prompts) if u is None else u
    c = rng.normal(scale=fit.sigma_c, size=prompts) if c is None else c
    g = np.repeat(np.arange(prompts), k)
    right = rng.random(g.size) < 1.0 / (1.0 + np.exp(-(fit.mu + u[g])))
    confidence = fit.b_u * u[g] + fit.b_y * right + c[g] + rng.normal(size=g.size)
    return g, right, confidence


def _figures(fit: Fitted, *, prompts: int = 20_000, k: int = 8, seed: int = 0) -> dict:
    g, right, conf = _sample(fit, np.random.default_rng(seed), prompts=prompts, k=k)
    solved = np.bincount(g, weights=right, minlength=prompts) > 0
    return {"accuracy": float(right.mean()), "pass_at_8": float(solved.mean()), "auroc": M.auroc(conf, right),
            "auroc_per_prompt": float(M.per_prompt_auroc(conf, right, g).mean)}


def _bisect(f, lo: float, hi: float, target: float, *, steps: int = 14) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (common random numbers keep f monotone)."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return 0.5 * (lo + hi)


def fit(a: Assumptions) -> Fitted:
    """mu, sigma_u (unless given), mu again, b_y, b_u by bisection on simulated figures (the same random numbers
    in every call), each with the others at their current values; two passes."""
    cur = Fitted(mu=-1.2, sigma_u=1.0 if a.sigma_u is None else a.sigma_u, b_u=0.5, b_y=0.2, sigma_c=a.sigma_c, rho=a.rho)
    for _ in range(2):
        cur = replace(cur, mu=_bisect(lambda x: _figures(replace(cur, mu=x))["accuracy"], -5, 2, a.accuracy))
        # pass@8 falls as the difficulty spreads (more prompts never solved): bisect on its negative
        if a.sigma_u is None:
            cur = replace(cur, sigma_u=_bisect(lambda x: -_figures(replace(cur, sigma_u=x))["pass_at_8"], 0.0, 4.0,
                                               -a.pass_at_8))
        cur = replace(cur, mu=_bisect(lambda x: _figures(replace(cur, mu=x))["accuracy"], -5, 2, a.accuracy))
        cur = replace(cur, b_y=_bisect(lambda x: _figures(replace(cur, b_y=x))["auroc_per_prompt"], 0.0, 3.0,
                                       a.auroc_per_prompt))
        cur = replace(cur, b_u=_bisect(lambda x: _figures(replace(cur, b_u=x))["auroc"], -1.0, 6.0, a.auroc))
    return cur


def simulate(fit_: Fitted, *, prompts: int, k: int, reps: int, n_boot: int, seed: int = 0) -> dict:
    """REPS pairs of evaluations of the same prompts: mean paired and unpaired bootstrap half-widths, 1.96 x the
    spread of the point difference, and how often the paired interval held the true difference 0."""
    rng = np.random.default_rng(seed)
    paired, unpaired, points, hits = [], [], [], []
    for r in range(reps):
        u = rng.normal(scale=fit_.sigma_u, size=prompts)
        c = rng.normal(scale=fit_.sigma_c, size=prompts)
        s = np.sqrt(max(0.0, 1.0 - fit_.rho ** 2))
        u_b = fit_.rho * u + s * rng.normal(scale=fit_.sigma_u, size=prompts)
        c_b = fit_.rho * c + s * rng.normal(scale=fit_.sigma_c, size=prompts)
        g, ya, ca = _sample(fit_, rng, prompts=prompts, k=k, u=u, c=c)
        _, yb, cb = _sample(fit_, rng, prompts=prompts, k=k, u=u_b, c=c_b)
        a, b = {"confidence": ca, "correct": ya}, {"confidence": cb, "correct": yb}
        out = paired_bootstrap_difference("auroc", a, b, prompt_ids_a=g, prompt_ids_b=g, n_boot=n_boot, seed=r)
        apart = paired_bootstrap_difference("auroc", a, b, prompt_ids_a=g, prompt_ids_b=g, n_boot=n_boot, seed=r,
                                            paired=False)
        paired.append((out.high - out.low) / 2)
        unpaired.append((apart.high - apart.low) / 2)
        points.append(out.point)
        hits.append(out.low <= 0.0 <= out.high)
    return {"paired": float(np.mean(paired)), "unpaired": float(np.mean(unpaired)),
            "sd": 1.96 * float(np.std(points, ddof=1)), "coverage": float(np.mean(hits))}


def speed() -> None:
    """Seconds of :func:`paired_bootstrap_difference` on the AUROC: 250,000 prompts x 4 (a million samples) with
    1,000 replicates, and the study's 500 x 4 with 2,000."""
    import os

    for prompts, n_boot in ((250_000, 1000), (500, 2000)):
        rng = np.random.default_rng(0)
        g = np.repeat(np.arange(prompts), 4)
        right = rng.random(g.size) < 0.25
        conf = rng.normal(size=g.size) + right
        a, b = {"confidence": conf, "correct": right}, {"confidence": conf[::-1].copy(), "correct": right}
        t0 = time.perf_counter()
        paired_bootstrap_difference("auroc", a, b, prompt_ids_a=g, prompt_ids_b=g, n_boot=n_boot)
        print(f"{g.size:,} samples ({prompts:,} prompts x 4), {n_boot:,} paired replicates of two AUROCs: "
              f"{time.perf_counter() - t0:.2f} s (load average {os.getloadavg()[0]:.1f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, nargs="+", default=[48, 125, 250, 500, 750])
    parser.add_argument("--k", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--chosen", type=int, nargs=2, default=[500, 4], metavar=("PROMPTS", "K"))
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--skip-variants", action="store_true", help="only the size table")
    parser.add_argument("--n-boot", type=int, default=400)
    parser.add_argument("--speed", action="store_true",
                        help="only time the vectorised paired bootstrap (a million samples; the study's size)")
    options = parser.parse_args()
    start = time.perf_counter()
    if options.speed:
        speed()
        return

    base = Assumptions()
    fitted = fit(base)
    got = _figures(fitted)
    print(f"fitted to accuracy {base.accuracy}, pass@8 {base.pass_at_8}, AUROC {base.auroc}, AUROC within prompts "
          f"{base.auroc_per_prompt} (documented baseline: " + ", ".join(f"{k} {v}" for k, v in BASELINE.items())
          + ")")
    print(f"  mu {fitted.mu:.3f}, sigma_u {fitted.sigma_u:.3f}, b_u {fitted.b_u:.3f}, b_y {fitted.b_y:.3f}, "
          f"sigma_c {fitted.sigma_c}, rho {fitted.rho}; simulated: "
          + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), flush=True)

    print(f"\n95% half-width of the AUROC difference of two evaluations of the same prompts ({options.reps} simulated "
          f"pairs per row, {options.n_boot} bootstrap replicates each)\n")
    print("| prompts | samples/prompt | samples | paired bootstrap | unpaired bootstrap | 1.96 sd of the difference "
          "| paired coverage of 0 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for prompts in options.prompts:
        for k in options.k:
            r = simulate(fitted, prompts=prompts, k=k, reps=options.reps, n_boot=options.n_boot)
            print(f"| {prompts} | {k} | {prompts * k} | {r['paired']:.3f} | {r['unpaired']:.3f} | {r['sd']:.3f} | "
                  f"{r['coverage']:.2f} |", flush=True)

    if options.skip_variants:
        print(f"\n{time.perf_counter() - start:.0f} s")
        return
    prompts, k = options.chosen
    print(f"\nThe same at {prompts} prompts x {k} samples under other assumptions\n")
    print("| assumptions | fitted mu, sigma_u, b_u, b_y | simulated accuracy / AUROC / within prompts | paired "
          "bootstrap | unpaired | 1.96 sd |")
    print("|---|---|---|---:|---:|---:|")
    s = fitted.sigma_u
    variants = [
        replace(base, accuracy=0.16, sigma_u=s, label="accuracy 0.16 (the study's start)"),
        replace(base, accuracy=0.30, sigma_u=s, label="accuracy 0.30 (GRPO's end)"),
        replace(base, sigma_u=2 * s, label=f"difficulty spread doubled (sigma_u {2 * s:.2f})"),
        replace(base, sigma_u=0.0, label="no difficulty spread (sigma_u 0)"),
        replace(base, auroc=0.70, label="pooled AUROC 0.70"),
        replace(base, rho=0.5, label="evaluations less alike (rho 0.5)"),
        replace(base, rho=1.0, label="evaluations share prompts fully (rho 1)"),
        replace(base, sigma_c=1.0, label="larger prompt offsets (sigma_c 1)"),
    ]
    for a in variants:
        f = fit(a)
        r = simulate(f, prompts=prompts, k=k, reps=options.reps, n_boot=options.n_boot)
        got = _figures(f)
        print(f"| {a.label} | {f.mu:.2f}, {f.sigma_u:.2f}, {f.b_u:.2f}, {f.b_y:.2f} | {got['accuracy']:.3f} / "
              f"{got['auroc']:.3f} / {got['auroc_per_prompt']:.3f} | {r['paired']:.3f} | "
              f"{r['unpaired']:.3f} | {r['sd']:.3f} |", flush=True)
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
