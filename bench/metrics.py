"""Benchmark calibrl.metrics on 1,000,000 samples (62,500 prompts x 16 samples).

Times every metric once on the same data and prints each beside scikit-learn's roc_auc_score on that data
(measured in the same run), plus the whole suite. Goal: whole suite <= 2 s on 2 CPU cores, and
smooth ECE with PRR adding at most 20% to the rest (printed as ratios, same run: one call per metric, and as
``calibrl eval`` computes them, AUROC, AURC, PRR and precision at coverage from one sort with
``ranking_figures``); per-prompt AUROC is
one vectorised pass (compare with a Python loop of roc_auc_score over a subset of prompts, extrapolated). Also the
certified abstention threshold: the Clopper-Pearson search over the 101-threshold grid on all samples, and the
whole calibrated_abstention (prompt split, one sample per calibration prompt, held-out figures); goal well under 1 s.

    python bench/metrics.py [--prompts 62500] [--per-prompt 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.metrics import roc_auc_score

import calibrl.metrics as M


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=62_500)
    ap.add_argument("--per-prompt", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--before", action="store_true", help="the suite without smooth_ece and prr")
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    n = args.prompts * args.per_prompt
    difficulty = rng.uniform(0.02, 0.98, args.prompts)
    prompt_ids = rng.permutation(np.repeat(np.arange(args.prompts), args.per_prompt))  # shuffled, as loaded
    q = difficulty[prompt_ids]
    correct = rng.random(n) < q
    # a confidence that knows the prompt's difficulty, a little about each sample, and is over-confident
    score = 1.5 * np.log(q / (1 - q)) + 0.8 * (correct - 0.5) + rng.normal(0, 1.0, n)
    conf = np.round(1 / (1 + np.exp(-score)), 4)  # rounded: many ties, as float16/bfloat16 confidences have

    t_sk, ref = best_of(lambda: roc_auc_score(correct, conf), args.repeats)
    suite = {
        "mean_at_k": lambda: M.mean_at_k(correct, prompt_ids),
        "pass_at_k (k=8)": lambda: M.pass_at_k(correct, prompt_ids, 8),
        "auroc (pooled)": lambda: M.auroc(conf, correct),
        "per_prompt_auroc": lambda: M.per_prompt_auroc(conf, correct, prompt_ids).mean,
        "ece (uniform, 10)": lambda: M.ece(conf, correct),
        "ece (quantile, 10)": lambda: M.ece(conf, correct, strategy="quantile"),
        "mce (uniform, 10)": lambda: M.mce(conf, correct),
        "brier": lambda: M.brier(conf, correct),
        "nll": lambda: M.nll(conf, correct),
        "aurc": lambda: M.aurc(conf, correct),
        "precision_at_coverage": lambda: M.precision_at_coverage(conf, correct)[0.5],
    }
    if not args.before:  # the figures added since (issue 43): the suite with them against the suite without
        suite["smooth_ece"] = lambda: M.smooth_ece(conf, correct)
        suite["prr"] = lambda: M.prr(conf, correct)
        suite["ranking_figures"] = lambda: M.ranking_figures(conf, correct).prr
    print(f"{n:,} samples = {args.prompts:,} prompts x {args.per_prompt}; best of {args.repeats} runs each")
    print(f"{'metric':<24}{'value':>10}{'time (s)':>11}{'x sklearn AUROC':>17}")
    print(f"{'sklearn roc_auc_score':<24}{ref:>10.4f}{t_sk:>11.4f}{1.0:>17.2f}")
    times = {}
    for name, fn in suite.items():
        t, value = best_of(fn, args.repeats)
        times[name] = t
        print(f"{name:<24}{float(value):>10.4f}{t:>11.4f}{t / t_sk:>17.2f}")
    t0 = time.perf_counter()
    for name, fn in suite.items():
        if name != "ranking_figures":
            fn()
    whole = time.perf_counter() - t0
    print(f"{'WHOLE SUITE (one pass)':<24}{'':>10}{whole:>11.4f}{whole / t_sk:>17.2f}")
    if not args.before:
        shared = ("auroc (pooled)", "aurc", "precision_at_coverage", "prr")  # what ranking_figures gives
        ranked = M.ranking_figures(conf, correct)
        assert (ranked.auroc, ranked.aurc, ranked.prr) == (M.auroc(conf, correct), M.aurc(conf, correct),
                                                             M.prr(conf, correct))
        rest = sum(t for k, t in times.items() if k not in ("smooth_ece", "prr", "ranking_figures"))
        separate = rest + times["smooth_ece"] + times["prr"]
        one_sort = separate - sum(times[k] for k in shared) + times["ranking_figures"]
        print(f"suite before smooth_ece and prr {rest:.4f} s; with them, one call per metric {separate:.4f} s "
              f"({separate / rest:.2f}x); with them, AUROC/AURC/PRR/precision at coverage from one sort as calibrl "
              f"eval computes them {one_sort:.4f} s ({one_sort / rest:.2f}x; sums of best-of times)")

    # abstention threshold with a guarantee (precision >= 0.8 with probability >= 0.95)
    t_search, found = best_of(lambda: M.abstention_threshold(conf, correct, target_precision=0.8, delta=0.05),
                              args.repeats)
    t_split, split = best_of(lambda: M.calibrated_abstention(conf, correct, prompt_ids, target_precision=0.8,
                                                             delta=0.05), args.repeats)
    print(f"abstention_threshold on all {n:,} samples (101 thresholds, Clopper-Pearson + Bonferroni): "
          f"{t_search:.4f} s -> t = {found.threshold}")
    precision = "none" if split.precision_heldout is None else f"{split.precision_heldout:.4f}"
    print(f"calibrated_abstention ({args.prompts:,} prompts split in half, one sample per calibration prompt): "
          f"{t_split:.4f} s -> t = {split.threshold}, held-out coverage {split.coverage:.3f}, precision {precision}")

    auc = M.auroc(conf, correct)
    assert abs(auc - ref) < 1e-9, (auc, ref)
    # per-prompt AUROC the slow way, on a subset, extrapolated to all prompts
    sub = 2_000
    order = np.argsort(prompt_ids, kind="stable")
    starts = np.arange(0, n, args.per_prompt)
    t0 = time.perf_counter()
    for s in starts[:sub]:
        idx = order[s : s + args.per_prompt]
        if correct[idx].any() and not correct[idx].all():
            roc_auc_score(correct[idx], conf[idx])
    loop = (time.perf_counter() - t0) * args.prompts / sub
    print(f"per-prompt AUROC as a Python loop of roc_auc_score (extrapolated): {loop:.1f} s "
          f"vs {times['per_prompt_auroc']:.3f} s vectorised ({loop / times['per_prompt_auroc']:.0f}x)")


if __name__ == "__main__":
    main()
