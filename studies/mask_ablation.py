"""CAPO's reference-perplexity mask, ablated on the testbed (arXiv 2604.12632's two claims about it).

The paper's ablation says (1) without the mask entropy rises and accuracy stalls, and (2) the mask alone on GRPO
does not improve AUC. Arms on ``testbed/stochastic_reasoning`` (the regime where GRPO loses calibration here),
fixed before the runs: GRPO, GRPO + frozen mask (``grpo_mask``), CAPO tau 0.6, CAPO + frozen mask (the paper's
reading: reference-perplexity quartiles of the first batch, then fixed) and CAPO + per-batch mask (the reading of
the earlier study); 3 seeds x 200 steps, everything else as the testbed study. Read here: each masked arm against
its unmasked twin, paired by seed (same warm start, same evaluation prompts and outcome stream), at the last
evaluation and at matched expected accuracy (each arm's own curve, linear between evaluations)::

    python -m studies.testbed --seeds 3 --first-seed 0 --steps 200 --workers 1 \\
        --methods stochastic_reasoning/grpo,stochastic_reasoning/grpo_mask,stochastic_reasoning/capo,\\
stochastic_reasoning/capo_frozen_mask,stochastic_reasoning/capo_mask --out runs/mask_ablation --runs runs/bench_testbed
    python -m studies.mask_ablation runs/mask_ablation/testbed_results.json

The first command takes about 10 minutes on 2 cores; this one prints markdown tables (docs/results/mask.md), and with
``--save docs/results/mask_results.json`` writes the ablation's runs (every evaluation), from which
:func:`final_table` and :func:`paired_rows` rebuild them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from calibrl.testbed.report import at_accuracy

TASK = "stochastic_reasoning"
# (masked arm, its unmasked twin)
PAIRS = (("grpo_mask", "grpo"), ("capo_frozen_mask", "capo"), ("capo_mask", "capo"))
KEYS = (("expected_accuracy", "accuracy (expected)"), ("auroc", "AUROC"), ("gap", "ceiling - AUROC"),
        ("entropy", "per-token entropy"), ("ece", "ECE"))
MATCHED_KEYS = KEYS[1:]
FRACTIONS = (0.5, 0.9)  # matched accuracies: start + f x (the accuracy every run of both arms reaches - start)


ARMS = ("grpo", "grpo_mask", "capo", "capo_frozen_mask", "capo_mask")  # the ablation's arms, in table order


def load(path: Path) -> tuple[dict[str, dict[int, list[dict]]], dict[str, str]]:
    """{method: {seed: history}} of the task's runs of the ablation's arms (each record with ``gap`` = ceiling -
    AUROC), in :data:`ARMS` order, and labels."""
    results = sorted(json.loads(path.read_text())["results"],
                     key=lambda r: (ARMS.index(r["method"]) if r["method"] in ARMS else len(ARMS), r["seed"]))
    runs: dict[str, dict[int, list[dict]]] = {}
    labels = {}
    for run in results:
        if run["task"] != TASK or run["method"] not in ARMS:
            continue
        history = [{**r, "gap": r["auroc_ceiling"] - r["auroc"]} for r in run["history"]]
        runs.setdefault(run["method"], {})[run["seed"]] = history
        labels[run["method"]] = run["label"]
    return runs, labels


def _spread(values: list[float]) -> str:
    v = np.asarray(values, dtype=float)
    return f"{np.nanmean(v):+.3f} [{np.nanmin(v):+.3f}, {np.nanmax(v):+.3f}]"


def final_table(runs: dict, labels: dict) -> str:
    """The warm start (every run's step-0 evaluation: one model, one sampling seed) and the last evaluation, mean ±
    std over seeds."""
    lines = ["| arm | " + " | ".join(name for _, name in KEYS) + " |", "|---|" + "---:|" * len(KEYS)]
    start = next(iter(next(iter(runs.values())).values()))[0]
    lines.append("| warm start | " + " | ".join(f"{start[key]:.3f}" for key, _ in KEYS) + " |")
    for method, seeds in runs.items():
        cells = []
        for key, _ in KEYS:
            v = np.array([h[-1][key] for h in seeds.values()], dtype=float)
            cells.append(f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}")
        lines.append(f"| {labels[method]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_rows(runs: dict, labels: dict) -> list[str]:
    """Masked minus unmasked, per seed: mean [min, max] over seeds, at the last evaluation and at matched
    expected accuracy."""
    lines = ["| masked arm - unmasked twin | where | " + " | ".join(name for _, name in KEYS) + " |",
             "|---|---|" + "---:|" * len(KEYS)]
    for arm, twin in PAIRS:
        if arm not in runs or twin not in runs:
            continue
        seeds = sorted(set(runs[arm]) & set(runs[twin]))
        name = f"{labels[arm]} - {labels[twin]}"
        cells = [_spread([runs[arm][s][-1][k] - runs[twin][s][-1][k] for s in seeds]) for k, _ in KEYS]
        lines.append(f"| {name} | last evaluation | " + " | ".join(cells) + " |")
        start = runs[arm][seeds[0]][0]["expected_accuracy"]
        reach = min(max(r["expected_accuracy"] for r in runs[m][s]) for m in (arm, twin) for s in seeds)
        for fraction in FRACTIONS:
            level = start + fraction * (reach - start)
            cells = ["(matched)"] + [_spread([at_accuracy(runs[arm][s], k, level) - at_accuracy(runs[twin][s], k, level)
                                              for s in seeds]) for k, _ in MATCHED_KEYS]
            lines.append(f"| {name} | accuracy {level:.3f} | " + " | ".join(cells) + " |")
    return lines


def save(results: Path, path: Path) -> None:
    """Write the runs of ``results`` (a testbed_results.json) that :func:`load` reads, with their per-evaluation
    histories, as a results file of the same form (train logs and scratch paths left out)."""
    data = json.loads(results.read_text())
    keep = [{k: v for k, v in run.items() if k not in ("train_logs", "run_dir")} for run in data["results"]
            if run["task"] == TASK and run["method"] in ARMS]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": data.get("config"), "command": data.get("command"), "results": keep},
                               indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="testbed_results.json of the studies/testbed.py run above")
    parser.add_argument("--save", type=Path, default=None,
                        help="also write the ablation's runs (every evaluation; the tables' raw data) to this file")
    options = parser.parse_args()
    if options.save:
        save(options.results, options.save)
    runs, labels = load(options.results)
    if not runs:
        raise SystemExit(f"{options.results}: no {TASK} runs")
    print("Last evaluation (mean ± std over seeds):\n")
    print(final_table(runs, labels))
    print("\nPaired by seed (mean [min, max] over seeds):\n")
    print("\n".join(paired_rows(runs, labels)))


if __name__ == "__main__":
    main()
