"""Group weightings where GCPO and SEED-GRPO can differ: the pre-registered study on ``testbed/forms``.

The protocol (arms, endpoints, statistics, success rules) was written in docs/testbed.md before the runs
("Pre-registered: group weightings where GCPO and SEED-GRPO can differ"). The runs::

    python -m studies.testbed --seeds 5 --first-seed 0 --steps 300 --eval-every 25 --workers 2 \\
        --methods forms/grpo,forms/dr_grpo,forms/gcpo,forms/gcpo_std,forms/seed_grpo,forms/seed_grpo_paper \\
        --out runs/forms_study --runs runs/bench_testbed
    python -m studies.forms_study runs/forms_study/testbed_results.json --plot docs/results/forms_study.png

The first command takes about 10 minutes on 2 cores; this one prints the markdown tables of
docs/results/forms.md and, with ``--plot``, draws the accuracy curves.

Endpoints, per run: ``A`` = expected accuracy on the test prompts whose reward can be learned (learnable + hard
tiers, weighted by their prompt counts); (1) ``final``: A at the last evaluation; (2) ``area``: the mean of A over
all evaluations (step 0 included); (3) ``max_fall``: the largest fall of A between consecutive evaluations, and the
per-token ``entropy`` at the last evaluation. Differences against a reference arm are paired by seed, with a 95%
t-interval over seeds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from calibrl.testbed.report import format_interval, paired_t_interval

TASK = "forms"
LEARNABLE_TIERS = ("learnable", "hard")
ENDPOINTS = (("final", "A at step 300"), ("area", "mean A over the curve"), ("max_fall", "largest fall of A"),
             ("entropy", "per-token entropy"), ("auroc", "AUROC"))
# (arm, reference): the two judged pairs of the protocol first, then the pairs reported without a verdict
JUDGED = (("gcpo_std", "seed_grpo_paper"), ("dr_grpo", "grpo"))
REPORTED = (("gcpo", "grpo"), ("gcpo_std", "grpo"), ("seed_grpo", "grpo"), ("seed_grpo_paper", "grpo"),
            ("gcpo", "seed_grpo"), ("gcpo_std", "seed_grpo"), ("gcpo", "seed_grpo_paper"))


def tier_weights(n_prompts: int) -> dict[str, float]:
    """Share of each learnable tier among the learnable test prompts (the curve's prompts: test split, seed 0)."""
    from calibrl.testbed import tasks as tb

    rows = tb.build_rows(TASK, n_prompts, split="test", seed=0)
    counts = {t: sum(r["tier"] == t for r in rows) for t in LEARNABLE_TIERS}
    total = sum(counts.values())
    return {t: c / total for t, c in counts.items()}


def learnable_accuracy(record: dict, weights: dict[str, float]) -> float:
    """A of one evaluation record: the expected accuracy of the learnable tiers, weighted by their counts."""
    return float(sum(w * record[f"expected_accuracy_{t}"] for t, w in weights.items()))


def run_endpoints(history: list[dict], weights: dict[str, float]) -> dict[str, float]:
    """The protocol's endpoints of one run (its evaluation records, in step order)."""
    curve = np.array([learnable_accuracy(r, weights) for r in history])
    return {"final": float(curve[-1]), "area": float(curve.mean()),
            "max_fall": float(max(0.0, np.max(curve[:-1] - curve[1:]))) if curve.size > 1 else 0.0,
            "entropy": float(history[-1]["entropy"]), "auroc": float(history[-1]["auroc"]),
            **{f"tier_{t}": float(history[-1][f"expected_accuracy_{t}"]) for t in (*LEARNABLE_TIERS, "noise")},
            # exploratory (chosen after seeing the curves): how early the hard prompts are learned
            "hard_area": float(np.mean([r["expected_accuracy_hard"] for r in history])),
            "hard_at_75": next((float(r["expected_accuracy_hard"]) for r in history if r["step"] == 75), np.nan)}


def verdict(rows: dict[str, tuple[float, float, float]]) -> str:
    """The protocol's rule on endpoints (1) final and (2) area: interval above 0 on one, below 0 on neither."""
    above = [k for k in ("final", "area") if rows[k][1] > 0]
    below = [k for k in ("final", "area") if rows[k][2] < 0]
    if above and not below:
        return "claim reproduced (" + ", ".join(above) + " higher)"
    if below:
        return "opposite found (" + ", ".join(below) + " lower)"
    return "not reproduced (no interval excludes 0)"


def load(path: Path) -> tuple[dict[str, dict[int, list[dict]]], dict[str, str]]:
    """{method: {seed: history}} of the forms runs, and their labels."""
    from calibrl.testbed.methods import FORMS_ARMS

    runs: dict[str, dict[int, list[dict]]] = {}
    labels: dict[str, str] = {}
    for run in json.loads(path.read_text())["results"]:
        if run["task"] == TASK:
            runs.setdefault(run["method"], {})[run["seed"]] = run["history"]
            labels[run["method"]] = run["label"]
    order = [arm.name for arm in FORMS_ARMS]  # the protocol's order; other methods after
    runs = dict(sorted(runs.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))
    return runs, labels


def tables(runs: dict, labels: dict, weights: dict[str, float]) -> str:
    ends = {m: {s: run_endpoints(h, weights) for s, h in seeds.items()} for m, seeds in runs.items()}
    keys = [k for k, _ in ENDPOINTS] + [f"tier_{t}" for t in (*LEARNABLE_TIERS, "noise")]
    names = [n for _, n in ENDPOINTS] + ["learnable tier", "hard tier", "noise tier"]
    lines = [f"Per arm, mean ± std over seeds ({len(next(iter(runs.values())))} seeds):", "",
             "| arm | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for method, per_seed in ends.items():
        cells = []
        for k in keys:
            v = np.array([e[k] for e in per_seed.values()])
            cells.append(f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if v.size > 1 else f"{v[0]:.3f}")
        lines.append(f"| {labels[method]} | " + " | ".join(cells) + " |")
    lines += ["", "Paired by seed, arm minus reference: mean [95% t-interval over seeds]:", "",
              "| arm - reference | " + " | ".join(n for _, n in ENDPOINTS[:4]) + " | verdict |",
              "|---|" + "---:|" * 4 + "---|"]
    for judged, pairs in ((True, JUDGED), (False, REPORTED)):
        for arm, ref in pairs:
            if arm not in ends or ref not in ends:
                continue
            seeds = sorted(set(ends[arm]) & set(ends[ref]))
            rows = {k: paired_t_interval([ends[arm][s][k] - ends[ref][s][k] for s in seeds]) for k, _ in ENDPOINTS}
            cells = [format_interval(rows[k]) for k, _ in ENDPOINTS[:4]]
            rule = verdict(rows) if judged else "(reported)"
            lines.append(f"| {labels[arm]} - {labels[ref]} | " + " | ".join(cells) + f" | {rule} |")
    lines += ["", "Exploratory, chosen after seeing the curves (not pre-registered): the hard tier's expected accuracy "
              "at step 75 and its mean over the curve, arm minus GRPO, paired by seed [95% t-interval]:", "",
              "| arm - GRPO | hard tier at step 75 | hard tier, mean over the curve |", "|---|---:|---:|"]
    for arm in ends:
        if arm == "grpo" or "grpo" not in ends:
            continue
        seeds = sorted(set(ends[arm]) & set(ends["grpo"]))
        cells = [paired_t_interval([ends[arm][s][k] - ends["grpo"][s][k] for s in seeds]) for k in
                 ("hard_at_75", "hard_area")]
        lines.append(f"| {labels[arm]} | " + " | ".join(format_interval(c) for c in cells) + " |")
    return "\n".join(lines)


def plot(runs: dict, labels: dict, weights: dict[str, float], path: Path) -> None:
    """A (learnable + hard prompts) and the hard tier alone against step: mean over seeds with the seeds' range,
    one line per arm (:func:`calibrl.evaluation.plots.plot_training_curves`)."""
    from calibrl.evaluation.plots import plot_training_curves

    history = {labels[m]: [{**r, "accuracy on learnable + hard prompts (A)": learnable_accuracy(r, weights)}
                           for h in seeds.values() for r in h] for m, seeds in runs.items()}
    plot_training_curves(history, ("accuracy on learnable + hard prompts (A)", "expected_accuracy_hard"), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="testbed_results.json of the forms runs")
    parser.add_argument("--plot", type=Path, help="write the curves here (PNG)")
    options = parser.parse_args()
    data = json.loads(options.results.read_text())
    runs, labels = load(options.results)
    if not runs:
        raise SystemExit(f"{options.results}: no runs of testbed/{TASK}")
    weights = tier_weights(int(data["config"]["eval_prompts"]))
    print(tables(runs, labels, weights))
    if options.plot:
        plot(runs, labels, weights, options.plot)
        print(f"\nwrote {options.plot}")


if __name__ == "__main__":
    main()
