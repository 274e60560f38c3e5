"""Downstream use of calibration on the testbed: answer selection at N = 8 and selective answering, per method.

The CAPO paper reports that a calibrated policy gains more from confidence-weighted selection (Perplexity
Consistency, N = 16 on AIME: CAPO 25.3 vs GRPO 20.3) and answers more precisely when it abstains on its least
confident samples. This reads both from the final evaluation samples of testbed runs (128 held-out prompts x 8
samples, ``final_samples.npz``, which hold each sample's answer since the selection study was added):

* selection at N = 8 with ``calibrl.selection`` (majority, probability-weighted, PC, RPC, best-of-N), scored
  without outcome noise: the true success probability of the chosen answer (completions with one answer key share
  it, :func:`calibrl.testbed.evaluate.answer_keys`; on a tie the first tied answer), beside mean@8 (one sample) and
  the oracle (the best answer among the 8);
* selective answering: AURC and the precision at 50% coverage of the mean token log-prob against the drawn
  outcomes (``calibrl.metrics``).

Usage (the runs first; about 10 minutes on 2 cores)::

    python bench/testbed.py --seeds 3 --first-seed 0 --steps 200 --workers 2 \\
        --methods stochastic_reasoning/grpo,stochastic_reasoning/capo,stochastic_reasoning/capo_frozen_mask,\\
stochastic_reasoning/capo_tau0.2 --out runs/downstream --runs runs/bench_testbed
    python bench/downstream.py runs/downstream/testbed_results.json

Prints markdown: per method mean ± std over seeds, and each method minus GRPO paired by seed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from calibrl import metrics as M
from calibrl.selection import METHODS, select
from calibrl.testbed.report import final_samples_path

REFERENCE = "grpo"


def selection_accuracy(samples: dict[str, np.ndarray], method: str) -> float:
    """Mean over prompts of the true success probability of the answer ``method`` chooses among the samples."""
    pid, answers, q = samples["prompt_index"], samples["answer_id"], samples["q_true"]
    result = select(method, answers, samples["correct"], pid, logprob_mean=samples["logprob_mean"],
                    completions=samples["completion"], confidence=np.exp(samples["logprob_mean"]))
    value = {(p, a): v for p, a, v in zip(pid.tolist(), answers.tolist(), q.tolist())}
    return float(np.mean([value[(p, a)] for p, a in zip(result.prompts.tolist(), result.answer_ids.tolist())]))


def run_metrics(samples: dict[str, np.ndarray]) -> dict[str, float]:
    """One run's final samples -> mean@8, oracle@8, every selection method, AURC, precision at 50% coverage."""
    pid, q = samples["prompt_index"], samples["q_true"]
    out = {"mean@8": float(q.mean()),
           "oracle@8": float(np.mean([q[pid == p].max() for p in np.unique(pid)]))}
    for method in METHODS:
        out[method] = selection_accuracy(samples, method)
    out["AURC"] = M.aurc(np.exp(samples["logprob_mean"]), samples["correct"])
    out["precision@0.5"] = M.precision_at_coverage(np.exp(samples["logprob_mean"]), samples["correct"], [0.5])[0.5]
    return out


def load(results_path: Path) -> tuple[dict[str, dict[int, dict[str, float]]], dict[str, str]]:
    """{method: {seed: run_metrics}} for every run whose final samples hold answers; labels by method."""
    results = json.loads(results_path.read_text())
    runs: dict[str, dict[int, dict[str, float]]] = {}
    labels = {}
    for run in results["results"]:
        path = final_samples_path(results_path.parent, run)
        if path is None:
            continue
        data = dict(np.load(path, allow_pickle=False))
        if "answer_id" not in data:
            raise SystemExit(f"{path}: no answer_id (a run from before answers were kept): rerun it")
        runs.setdefault(run["method"], {})[run["seed"]] = run_metrics(data)
        labels[run["method"]] = run["label"]
    return runs, labels


def tables(runs: dict, labels: dict) -> str:
    keys = list(next(iter(next(iter(runs.values())).values())))
    lines = ["| method | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for method, seeds in runs.items():
        cells = []
        for k in keys:
            v = np.array([m[k] for m in seeds.values()])
            cells.append(f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}")
        lines.append(f"| {labels[method]} | " + " | ".join(cells) + " |")
    gain = ["", "Selection gain over majority voting (method minus majority, mean over seeds):", "",
            "| method | " + " | ".join(m for m in METHODS if m != "majority") + " |",
            "|---|" + "---:|" * (len(METHODS) - 1)]
    for method, seeds in runs.items():
        gain.append(f"| {labels[method]} | " + " | ".join(
            f"{np.mean([m[k] - m['majority'] for m in seeds.values()]):+.3f}" for k in METHODS if k != "majority")
            + " |")
    paired = []
    if REFERENCE in runs:
        paired = ["", f"Paired by seed against {labels[REFERENCE]} (method minus it: mean [min, max]):", "",
                  "| method | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
        for method, seeds in runs.items():
            if method == REFERENCE:
                continue
            common = sorted(set(seeds) & set(runs[REFERENCE]))
            cells = []
            for k in keys:
                d = np.array([seeds[s][k] - runs[REFERENCE][s][k] for s in common])
                cells.append(f"{d.mean():+.3f} [{d.min():+.3f}, {d.max():+.3f}]")
            paired.append(f"| {labels[method]} | " + " | ".join(cells) + " |")
    return "\n".join(lines + gain + paired)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="testbed_results.json of the bench/testbed.py run above")
    options = parser.parse_args()
    runs, labels = load(options.results)
    if not runs:
        raise SystemExit(f"{options.results}: no run with final samples")
    print(tables(runs, labels))


if __name__ == "__main__":
    main()
