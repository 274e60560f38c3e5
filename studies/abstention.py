"""CAPO's abstention claim at matched accuracy: is its precision-coverage trade-off better than GRPO's own?

The CAPO paper (arXiv 2604.12632) reports that, allowed to abstain on low confidence, CAPO reaches a
Pareto-optimal precision-coverage trade-off. Comparing end points confounds that with accuracy (a less accurate
policy has a worse curve whatever its calibration; a slower one has a better ranking), so this reads each CAPO run
against GRPO's training curve of the same seed where it reaches the CAPO run's final accuracy
(:func:`calibrl.testbed.report.matched_accuracy_differences`), for the selective-answering metrics every evaluation
records: AURC (area under the risk-coverage curve of the mean token log-prob, lower is better) and the precision of
the most confident half and quarter of the answers. Outcomes are the drawn ones, as everywhere in the testbed::

    python -m studies.testbed --seeds 3 --first-seed 0 --steps 200 --workers 2 \\
        --methods stochastic_reasoning/grpo,stochastic_reasoning/capo,stochastic_reasoning/capo_mask,\\
stochastic_reasoning/capo_frozen_mask,stochastic_reasoning/capo_tau0.2 --out runs/abstention --runs runs/bench_testbed
    python -m studies.abstention runs/abstention/testbed_results.json --plot docs/results/abstention.png

The first command takes about 3 minutes on 2 cores. This one prints the markdown tables of
docs/results/abstention.md and, with ``--plot``, draws every arm's path in the (accuracy, AURC) and (accuracy,
precision at 50% coverage) planes: at equal accuracy, lower AURC and higher precision is the better trade-off.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from calibrl.testbed.report import aggregate, format_interval, matched_accuracy_differences, matched_note

TASK = "stochastic_reasoning"
KEYS = (("aurc", "AURC ↓"), ("precision_at_50", "precision at 50% coverage ↑"),
        ("precision_at_25", "precision at 25% coverage ↑"), ("auroc", "AUROC ↑"))


def tables(summary: dict) -> str:
    agg = aggregate(summary, TASK)
    n = len({r["seed"] for r in summary["results"] if r["task"] == TASK})
    lines = [f"At the end of training (step {next(iter(agg.values()))['steps']}), mean ± std over {n} seeds:", "",
             "| arm | accuracy (expected) | " + " | ".join(name for _, name in KEYS) + " |",
             "|---|---:|" + "---:|" * len(KEYS)]
    for e in agg.values():
        cells = []
        for key in ("expected_accuracy", *(k for k, _ in KEYS)):
            m = e["metrics"][key]
            cells.append(f"{m['mean']:.3f} ± {m['std']:.3f}" if np.isfinite(m["std"]) else f"{m['mean']:.3f}")
        lines.append(f"| {e['label']} | " + " | ".join(cells) + " |")
    matched = matched_accuracy_differences(summary, TASK, keys=tuple(k for k, _ in KEYS))
    lines += ["", f"At matched accuracy: each run's final evaluation minus GRPO's curve (same seed) where it first "
              f"reaches that accuracy (where GRPO never gets there, the method's curve "
              f"at GRPO's final accuracy minus GRPO's final evaluation); mean [95% t-interval over {n} seeds]:", "",
              "| arm - GRPO at its accuracy | accuracy | " + " | ".join(f"Δ {name}" for _, name in KEYS) + " |",
              "|---|---:|" + "---:|" * len(KEYS)]
    for e in matched.values():
        note = matched_note(e)
        lines.append(f"| {e['label']}{note} | {e['accuracy']:.3f} | "
                     + " | ".join(format_interval(e[k], missing="not reached by GRPO") for k, _ in KEYS) + " |")
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    """Each arm's path (mean over seeds of every evaluation) in the accuracy-AURC and accuracy-precision planes
    (:func:`calibrl.evaluation.plots.plot_metric_paths`)."""
    from calibrl.evaluation.plots import plot_metric_paths

    history: dict[str, list[dict]] = {}
    for run in summary["results"]:
        if run["task"] == TASK:
            history.setdefault(run["label"], []).extend(run["history"])
    plot_metric_paths(history, x="expected_accuracy", y=("aurc", "precision_at_50"), path=path,
                      title="stochastic_reasoning: each arm's path over training (mean over seeds; circle = last step)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="testbed_results.json of the runs")
    parser.add_argument("--plot", type=Path, help="write the paths here (PNG)")
    options = parser.parse_args()
    summary = json.loads(options.results.read_text())
    missing = [r["key"] for r in summary["results"] if r["task"] == TASK and "aurc" not in r["history"][-1]]
    if missing:
        raise SystemExit(f"{options.results}: runs without selective-answering metrics ({', '.join(missing[:3])}): "
                         "they were made before the evaluation recorded aurc; rerun the first command")
    print(tables(summary))
    if options.plot:
        plot(summary, options.plot)
        print(f"\nwrote {options.plot}")


if __name__ == "__main__":
    main()
