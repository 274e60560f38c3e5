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

    python -m studies.testbed --seeds 3 --first-seed 0 --steps 200 --workers 2 \\
        --methods stochastic_reasoning/grpo,stochastic_reasoning/capo,stochastic_reasoning/capo_frozen_mask,\\
stochastic_reasoning/capo_tau0.2 --out runs/downstream --runs runs/bench_testbed
    python -m studies.downstream runs/downstream/testbed_results.json

Prints markdown: per method mean ± std over seeds, and each method minus GRPO paired by seed. With ``--save FILE``
(``docs/results/downstream_results.json.gz``) also writes the runs' final samples, from which :func:`metrics_of`
and :func:`tables` rebuild the tables alone.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from calibrl import metrics as M
from calibrl.selection import METHODS, select
from calibrl.testbed.report import final_samples_path
from studies.data_files import load_data, save_data  # noqa: F401  (load_data: the rebuild reads through this module)

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


SAMPLE_FIELDS = ("prompt_index", "answer_id", "q_true", "correct", "logprob_mean", "completion")


def collect(results_path: Path, methods: list[str] | None = None) -> dict:
    """The raw data the tables are read from: every run's final evaluation samples (the fields
    ``run_metrics`` uses), ``{"labels": {method: label}, "samples": {method: {seed: {field: list}}}}``, for every
    run whose final samples hold answers (only ``methods``, in that order, when given)."""
    from calibrl.testbed.runner import run_times

    results = json.loads(results_path.read_text())
    out: dict = {"labels": {}, "samples": {}}
    runs = results["results"]
    if methods:
        runs = sorted((r for r in runs if r["method"] in methods),
                      key=lambda r: (methods.index(r["method"]), r["seed"]))
    for run in runs:
        path = final_samples_path(results_path.parent, run)
        if path is None:
            continue
        data = dict(np.load(path, allow_pickle=False))
        if "answer_id" not in data:
            raise SystemExit(f"{path}: no answer_id (a run from before answers were kept): rerun it")
        record = {k: data[k].tolist() for k in SAMPLE_FIELDS}
        record["dtypes"] = {k: data[k].dtype.str for k in SAMPLE_FIELDS}  # read back exactly as written
        record.update(run_times(run))  # the run's UTC start and end
        out["samples"].setdefault(run["method"], {})[str(run["seed"])] = record
        out["labels"][run["method"]] = run["label"]
    return out


def _samples(record: dict) -> dict[str, np.ndarray]:
    """One run's saved samples as the arrays its final_samples.npz held (same dtypes)."""
    return {k: np.asarray(record[k], dtype=np.dtype(record["dtypes"][k])) for k in SAMPLE_FIELDS}


def metrics_of(data: dict) -> tuple[dict[str, dict[int, dict[str, float]]], dict[str, str]]:
    """{method: {seed: run_metrics}} and labels from :func:`collect`'s data."""
    runs = {method: {int(seed): run_metrics(_samples(record)) for seed, record in seeds.items()}
            for method, seeds in data["samples"].items()}
    return runs, dict(data["labels"])


def load(results_path: Path) -> tuple[dict[str, dict[int, dict[str, float]]], dict[str, str]]:
    """{method: {seed: run_metrics}} for every run whose final samples hold answers; labels by method."""
    return metrics_of(collect(results_path))


# column titles of docs/results/downstream.md's tables (a key without one is shown as it is)
TITLES = {"pc": "PC", "rpc": "RPC", "best_of_n": "best-of-N", "AURC": "AURC ↓",
          "precision@0.5": "precision at 50% ↑"}


def tables(runs: dict, labels: dict) -> str:
    """Markdown (docs/results/downstream.md): per method mean ± std over seeds; each selection rule's gain over
    majority voting; each method minus GRPO paired by seed (mean [min, max])."""
    keys = list(next(iter(next(iter(runs.values())).values())))
    titles = [TITLES.get(k, k) for k in keys]
    n_seeds = max(len(seeds) for seeds in runs.values())
    lines = [f"| method (mean ± std over {n_seeds} seeds) | " + " | ".join(titles) + " |",
             "|---|" + "---:|" * len(keys)]
    for method, seeds in runs.items():
        cells = []
        for k in keys:
            v = np.array([m[k] for m in seeds.values()])
            cells.append(f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}")
        lines.append(f"| {labels[method]} | " + " | ".join(cells) + " |")
    gain = ["", "Selection gain over majority voting (method minus majority, mean over seeds):", "",
            "| method | " + " | ".join(TITLES.get(m, m) for m in METHODS if m != "majority") + " |",
            "|---|" + "---:|" * (len(METHODS) - 1)]
    for method, seeds in runs.items():
        gain.append(f"| {labels[method]} | " + " | ".join(
            f"{np.mean([m[k] - m['majority'] for m in seeds.values()]):+.3f}" for k in METHODS if k != "majority")
            + " |")
    paired = []
    if REFERENCE in runs:
        paired = ["", f"Paired by seed against {labels[REFERENCE]} (method minus it: mean [min, max]):", "",
                  "| method | " + " | ".join(titles) + " |", "|---|" + "---:|" * len(keys)]
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
    parser.add_argument("results", type=Path, help="testbed_results.json of the studies/testbed.py run above")
    parser.add_argument("--save", type=Path, default=None,
                        help="also write the runs' final samples (the tables' raw data; .json.gz compressed)")
    parser.add_argument("--methods", default=None, help="comma-separated methods to read, in this order (default: all)")
    options = parser.parse_args()
    data = collect(options.results, options.methods.split(",") if options.methods else None)
    if options.save:
        save_data(data, options.save)
    runs, labels = metrics_of(data)
    if not runs:
        raise SystemExit(f"{options.results}: no run with final samples")
    print(tables(runs, labels))


if __name__ == "__main__":
    main()
