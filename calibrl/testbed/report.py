"""Report of a training comparison (the demo and the study): tables over seeds, curves, reliability diagrams.

Input: the summary dict :func:`calibrl.testbed.demo.run_demo` writes to ``results.json`` (``results``: one record per
method x seed with its evaluation ``history``; :func:`studies.testbed_study.run_study` merges several). Output:
``report.md`` opening with what the run shows (:func:`findings`: sentences computed from the results, saying when
methods ended at unequal accuracy and whether differences exceed the seed spread), then one table per task (final
evaluation, mean +- std over seeds, with the shared warm start as a row), training curves
(:func:`calibrl.evaluation.plots.plot_training_curves`) and reliability diagrams of the final models
(:func:`calibrl.evaluation.plots.plot_reliability`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from calibrl.metrics.registry import metric

# Per task: (metric key, column title, higher is better?); titles and directions from the one metric table
# (calibrl.metrics.registry), a (key, title) pair where a task titles a column its own way
_SEQ_AUROC = ("auroc", "AUROC seq. conf.")  # the testbed's confidence is the sequence's
_TASK_COLUMNS: dict[str, list] = {
    "stochastic_reasoning": ["expected_accuracy", "accuracy", _SEQ_AUROC, "auroc_per_prompt", "auroc_ceiling",
                             "auroc_gap", "seq_ece", "reasoning_accuracy"],
    "decision": ["expected_accuracy", "accuracy", "greedy_decision_accuracy", "dec_ece", "calib_err",
                 "frac_conf_99", "dec_auroc", _SEQ_AUROC, "auroc_ceiling", "auroc_gap"],
    "addition": ["expected_accuracy", _SEQ_AUROC, "auroc_per_prompt", "seq_ece"],
    "scratchpad": [("expected_accuracy", "accuracy"), _SEQ_AUROC, "auroc_per_prompt", "auroc_gap", "seq_ece",
                   "entropy"],
}


def _column(entry) -> tuple[str, str, bool | None]:
    key, title = entry if isinstance(entry, tuple) else (entry, None)
    m = metric(key)  # the testbed's records name some metrics by an alias (dec_ece: decision_ece)
    return key, title or m.short, m.higher


TASK_METRICS: dict[str, list[tuple[str, str, bool | None]]] = {
    task: [_column(e) for e in entries] for task, entries in _TASK_COLUMNS.items()
}
# Per task: what the findings compare. accuracy: the expected accuracy (noise-free); calibration: the headline
# calibration metric (key, readable name, higher is better?) with an optional ceiling key; also: a second
# calibration metric quoted beside it.
FINDING_METRICS: dict[str, dict[str, Any]] = {
    "stochastic_reasoning": {"calibration": ("auroc", "AUROC of the sequence confidence", True),
                             "ceiling": "auroc_ceiling", "also": ("seq_ece", "ECE", False)},
    "decision": {"calibration": ("dec_ece", "decision ECE", False), "ceiling": None,
                 "also": ("calib_err", "mean |q - p|", False), "argmax": "greedy_decision_accuracy"},
    "addition": {"calibration": ("auroc", "AUROC of the sequence confidence", True),
                 "ceiling": None, "also": ("seq_ece", "ECE", False)},
    "scratchpad": {"calibration": ("auroc", "AUROC of the sequence confidence", True),
                   "ceiling": "auroc_ceiling", "also": ("seq_ece", "ECE", False)},
}
# Which regime the demo's tasks are, said in every report (docs/results/protocol.md, docs/results/testbed.md)
REGIME_NOTE = (
    "Which regime this is: the sequence-confidence and decision tasks draw every outcome afresh, so accuracy and "
    "calibration trade off structurally (even an ideal sampler loses AUROC as it sharpens, and the AUROC ceiling "
    "falls); that is where GRPO's loss of calibration is established on this testbed. In the papers' own regime "
    "(deterministic reward, a worked scratchpad, easy and hard prompts: `--methods "
    "scratchpad/grpo,scratchpad/capo_tau0.6`) the pre-registered pilots found the opposite: GRPO raised the AUROC "
    "to its ceiling while raising accuracy, also when the hard prompts' confidently wrong answers were out of its "
    "reach, so the papers' premise was not reproduced at this scale (docs/results/protocol.md in the calibrl "
    "repository).")
# Temperatures of the ideal sampler drawn as the frontier in the (accuracy, AUROC) plane (T > 1 flatter than the
# true distribution, T = 0 always the likeliest answer)
FRONTIER_TEMPERATURES = (2.0, 1.5, 1.25, 1.0, 0.85, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)
# Final expected accuracies further apart than this are "not matched" (about one seed std of the study's runs)
MATCHED_ACCURACY_TOL = 0.01
# Calibration differences below this are not read as differences, even with seeds to compare them with (the
# study's seed stds of AUROC and ECE are 0.003 to 0.013)
SMALL_DIFFERENCE = 0.005
CURVE_METRICS = {
    "stochastic_reasoning": ("auroc", "seq_ece", "expected_accuracy"),
    "decision": ("dec_ece", "calib_err", "auroc", "expected_accuracy"),
    "addition": ("auroc", "seq_ece", "expected_accuracy"),
    "scratchpad": ("auroc", "auroc_per_prompt", "entropy", "expected_accuracy"),
}
TASK_TITLES = {
    "stochastic_reasoning": "Sequence confidence (testbed/stochastic_reasoning)",
    "decision": "Decisions (testbed/decision)",
    "addition": "Deterministic control (testbed/addition)",
    "scratchpad": "The papers' regime (testbed/scratchpad: deterministic reward, worked scratchpad)",
}


def _runs_by_method(summary: dict, task: str) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = defaultdict(list)
    for rec in summary["results"]:
        if rec["task"] == task:
            by[rec["method"]].append(rec)
    order = [k.split("/", 1)[1] for k in (summary.get("config", {}).get("methods") or []) if k.startswith(task + "/")]
    return dict(sorted(by.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))


def _with_derived(rec: dict) -> dict:
    """Adds ``auroc_gap`` = ceiling - AUROC (how far the confidence is from the best possible ranking of the
    very samples evaluated)."""
    rec = dict(rec)
    if "auroc" in rec and "auroc_ceiling" in rec:
        rec["auroc_gap"] = rec["auroc_ceiling"] - rec["auroc"]
    return rec


def aggregate(summary: dict, task: str) -> dict[str, dict[str, Any]]:
    """Per method: label, seeds, and for each metric the final values over seeds plus mean/std, and the warm-start
    (step 0) mean."""
    out = {}
    for method, runs in _runs_by_method(summary, task).items():
        finals = [r["history"][-1] for r in runs]
        starts = [r["history"][0] for r in runs]
        entry = {"label": runs[0]["label"], "seeds": [r["seed"] for r in runs], "metrics": {},
                 "steps": finals[0].get("step", 0), "seconds": float(np.mean([r.get("seconds", 0) for r in runs]))}
        finals = [_with_derived(f) for f in finals]
        starts = [_with_derived(s) for s in starts]
        keys = set().union(*(f.keys() for f in finals))
        for key in keys:
            vals = np.array([f.get(key, math.nan) for f in finals], dtype=float)
            start = np.array([s.get(key, math.nan) for s in starts], dtype=float)
            entry["metrics"][key] = {
                "values": vals.tolist(), "mean": float(np.nanmean(vals)) if np.isfinite(vals).any() else math.nan,
                "std": float(np.nanstd(vals, ddof=1)) if np.isfinite(vals).sum() > 1 else math.nan,
                "start": float(np.nanmean(start)) if np.isfinite(start).any() else math.nan,
            }
        out[method] = entry
    return out


def _fmt(m: dict | None, *, delta: bool = False) -> str:
    if m is None or not np.isfinite(m["mean"]):
        return "n/a"
    s = f"{m['mean']:.3f}"
    if np.isfinite(m.get("std", math.nan)):
        s += f" ± {m['std']:.3f}"
    return s


def markdown_table(summary: dict, task: str, *, metrics: list | None = None) -> str:
    """Markdown table of the final evaluation per method (mean ± std over seeds)."""
    agg = aggregate(summary, task)
    metrics = metrics or TASK_METRICS.get(task, [])
    metrics = [m for m in metrics if any(m[0] in e["metrics"] for e in agg.values())]
    n_seeds = max((len(e["seeds"]) for e in agg.values()), default=0)
    head = "| method | seeds | steps | " + " | ".join(f"{title}{' ↑' if hib else (' ↓' if hib is False else '')}"
                                             for _, title, hib in metrics) + " |"
    sep = "|---|---:|---:|" + "---:|" * len(metrics)
    rows = [head, sep]
    if agg and all(e["steps"] for e in agg.values()):
        # no evaluation-only row for this task: the shared warm start (step 0 of every run) is the reference row
        cells = [f"{_start(agg, k):.3f}" if np.isfinite(_start(agg, k)) else "n/a" for k, _, _ in metrics]
        rows.append(f"| warm start (SFT, step 0) | {n_seeds} | 0 | " + " | ".join(cells) + " |")
    for method, e in agg.items():
        cells = [_fmt(e["metrics"].get(k)) for k, _, _ in metrics]
        rows.append(f"| {e['label']} | {len(e['seeds'])} | {e['steps']} | " + " | ".join(cells) + " |")
    note = "\n\n_Mean ± sample std over seeds (no ± with one seed)._" if n_seeds else ""
    return "\n".join(rows) + note


def _mean(entry: dict, key: str) -> float:
    return entry["metrics"].get(key, {}).get("mean", math.nan)


def _std(entry: dict, key: str) -> float:
    return entry["metrics"].get(key, {}).get("std", math.nan)


def _start(agg: dict, key: str) -> float:
    """The warm-start (step 0) value of ``key``: the same for every method, which all start from it."""
    for entry in agg.values():
        value = entry["metrics"].get(key, {}).get("start", math.nan)
        if np.isfinite(value):
            return value
    return math.nan


def _change(name: str, before: float, after: float, higher_is_better: bool) -> str:
    """'AUROC fell from 0.891 to 0.730 (worse)': the direction and whether it is an improvement."""
    if not (np.isfinite(before) and np.isfinite(after)):
        return f"{name} n/a"
    if abs(after - before) < 5e-4:
        return f"{name} stayed at {after:.3f}"
    up = after > before
    better = up == higher_is_better
    return f"{name} {'rose' if up else 'fell'} from {before:.3f} to {after:.3f} ({'better' if better else 'worse'})"


def warm_start_sentence(summary: dict, task: str) -> str:
    """One sentence with the shared warm start's accuracy and calibration (step 0 of the runs)."""
    spec, agg = FINDING_METRICS.get(task), aggregate(summary, task)
    if not spec or not agg:
        return ""
    cal_key, cal_name, _ = spec["calibration"]
    also_key, also_name, _ = spec["also"]
    parts = [f"expected accuracy {_start(agg, 'expected_accuracy'):.3f}", f"{cal_name} {_start(agg, cal_key):.3f}"]
    if spec["ceiling"] and np.isfinite(_start(agg, spec["ceiling"])):
        parts[-1] += f" (ceiling {_start(agg, spec['ceiling']):.3f})"
    if np.isfinite(_start(agg, also_key)):
        parts.append(f"{also_name} {_start(agg, also_key):.3f}")
    return "Warm start (SFT, step 0, shared by every method): " + ", ".join(parts) + "."


def findings(summary: dict, task: str, *, matched_tol: float = MATCHED_ACCURACY_TOL) -> list[str]:
    """What the final evaluation of ``task`` shows, as sentences computed from ``summary`` (the results dict).

    Per trained method: how its expected accuracy and headline calibration metric moved from the warm start
    (against the AUROC ceiling where the task has one). Then which method kept the most and the least
    calibration, whether the methods ended at matched expected accuracy (if not, the comparison is marked as not
    at matched accuracy: on these tasks calibration is traded against accuracy), and, with more than one seed,
    whether the best method's lead over the next exceeds the seed spread. Empty when the task has no findings
    spec or no runs."""
    spec, agg = FINDING_METRICS.get(task), aggregate(summary, task)
    if not spec or not agg:
        return []
    cal_key, cal_name, cal_hib = spec["calibration"]
    also_key, also_name, also_hib = spec["also"]
    ceiling = spec["ceiling"]
    trained = {m: e for m, e in agg.items() if e["steps"] and np.isfinite(_mean(e, cal_key))}
    out = []
    acc0 = _start(agg, "expected_accuracy")
    for entry in trained.values():
        acc1 = _mean(entry, "expected_accuracy")
        if abs(acc1 - acc0) < 5e-4:
            acc_change = f"left expected accuracy at {acc1:.3f}"
        else:
            acc_change = f"{'raised' if acc1 > acc0 else 'lowered'} expected accuracy from {acc0:.3f} to {acc1:.3f}"
        sentence = f"{entry['label']} {acc_change} in {entry['steps']} steps; " + _change(
            cal_name, _start(agg, cal_key), _mean(entry, cal_key), cal_hib)
        if ceiling and np.isfinite(_mean(entry, ceiling)):
            sentence += (f", {_mean(entry, ceiling) - _mean(entry, cal_key):.3f} below the ceiling of its samples "
                         f"({_mean(entry, ceiling):.3f})")
        if np.isfinite(_mean(entry, also_key)):
            sentence += "; " + _change(also_name, _start(agg, also_key), _mean(entry, also_key), also_hib)
        out.append(sentence + ".")
    if len(trained) < 2:
        return out
    sign = 1.0 if cal_hib else -1.0
    ranked = sorted(trained.values(), key=lambda e: -sign * _mean(e, cal_key))
    best, second, worst = ranked[0], ranked[1], ranked[-1]
    lead = abs(_mean(best, cal_key) - _mean(worst, cal_key))
    sentence = (f"Most calibration kept: {best['label']}, {cal_name} {_mean(best, cal_key):.3f}; least: "
                f"{worst['label']}, {_mean(worst, cal_key):.3f} (a difference of {lead:.3f}")
    if lead < SMALL_DIFFERENCE:
        sentence += ", too small to tell the methods apart"
    out.append(sentence + ").")
    by_acc = sorted(trained.values(), key=lambda e: -_mean(e, "expected_accuracy"))
    lo, hi = _mean(by_acc[-1], "expected_accuracy"), _mean(by_acc[0], "expected_accuracy")
    if hi - lo > matched_tol:
        sentence = (f"Not a comparison at matched accuracy: the methods ended between expected accuracy {lo:.3f} "
                    f"({by_acc[-1]['label']}) and {hi:.3f} ({by_acc[0]['label']}). On this task calibration is "
                    "traded against accuracy (a method that moves less far from the warm start keeps more of its "
                    "calibration and of its lower accuracy), so better calibration at lower accuracy does not show "
                    "a better method; compare the training curves at equal accuracy.")
        if best is by_acc[-1]:
            sentence += f" Here the best calibrated, {best['label']}, is also the least accurate."
        out.append(sentence)
    else:
        out.append(f"The methods ended at matched expected accuracy ({lo:.3f} to {hi:.3f}, within {matched_tol}), "
                   "so the calibration ranking compares like with like.")
    if spec.get("argmax"):
        key = spec["argmax"]
        values = [f"{e['label']} {_mean(e, key):.3f}" for e in agg.values() if np.isfinite(_mean(e, key))]
        if values:
            out.append("Accuracy when deciding by the most probable decision instead of sampling it (argmax "
                       "decision): " + ", ".join(values) + ".")
    n_seeds = min(len(e["seeds"]) for e in trained.values())
    if n_seeds > 1:
        gap = abs(_mean(best, cal_key) - _mean(second, cal_key))
        spread = np.nan_to_num(_std(best, cal_key)) + np.nan_to_num(_std(second, cal_key))
        verdict = "exceeds" if gap > spread else "does not exceed"
        out.append(f"Over {n_seeds} seeds, {best['label']}'s lead in {cal_name} over the next, {second['label']}, "
                   f"is {gap:.3f}: it {verdict} the seed spread (sum of the two seed stds, {spread:.3f}).")
    else:
        out.append("One seed: these differences carry no measure of seed-to-seed noise (`--seeds 3` gives one).")
    return out


def summary_table(summary: dict, task: str, *, rich: bool = False):
    """The final-evaluation table as a rich Table (``rich=True``) or markdown."""
    if not rich:
        return markdown_table(summary, task)
    from rich.table import Table

    agg = aggregate(summary, task)
    short = {"expected_accuracy": "acc (expected)", "auroc": "AUROC", "auroc_ceiling": "ceiling", "seq_ece": "ECE",
             "dec_ece": "dec. ECE", "calib_err": "|q-p|", "frac_conf_99": ">0.99"}
    metrics = [(k, short[k], h) for k, _, h in TASK_METRICS.get(task, [])
               if k in short and any(k in e["metrics"] for e in agg.values())]
    table = Table(title=TASK_TITLES.get(task, task))
    table.add_column("method")
    for _, title, _ in metrics:
        table.add_column(title, justify="right")
    for method, e in agg.items():
        table.add_row(e["label"], *[_fmt(e["metrics"].get(k)) for k, _, _ in metrics])
    return table


def _histories(summary: dict, task: str) -> dict[str, list[dict]]:
    return {runs[0]["label"]: [rec for r in runs for rec in r["history"]]
            for runs in _runs_by_method(summary, task).values()}


def final_samples_path(out: str | Path, run: dict) -> Path | None:
    """The final_samples.npz of one run record: in its ``run_dir``, else under ``out``/runs; None if neither."""
    for path in (Path(run.get("run_dir") or "") / "final_samples.npz",
                 Path(out) / "runs" / run["task"] / run["method"] / f"seed{run['seed']}" / "final_samples.npz"):
        if path.exists():
            return path
    return None


def _final_samples(out: Path, summary: dict, task: str) -> dict[str, dict[str, np.ndarray]]:
    """Final evaluation samples per method (seeds pooled), read from each run's final_samples.npz."""
    pooled: dict[str, dict[str, list]] = {}
    for runs in _runs_by_method(summary, task).values():
        label = runs[0]["label"]
        for r in runs:
            path = final_samples_path(out, r)
            if path is None:
                continue
            data = np.load(path, allow_pickle=False)
            bucket = pooled.setdefault(label, defaultdict(list))
            for k in data.files:
                bucket[k].append(data[k])
    return {label: {k: np.concatenate(v) for k, v in d.items()} for label, d in pooled.items()}


def write_figures(summary: dict, out: str | Path, task: str) -> list[Path]:
    """Training curves, the (accuracy, AUROC) paths with the ideal sampler's frontier (tasks where it is known)
    and final reliability diagrams for ``task`` into ``out``; returns the PNG paths."""
    from calibrl.evaluation.plots import plot_metric_paths, plot_reliability, plot_training_curves
    from calibrl.testbed.tasks import ideal_sampler

    out = Path(out)
    paths = []
    hist = _histories(summary, task)
    if hist:
        paths.append(plot_training_curves(hist, metrics=CURVE_METRICS.get(task, ("auroc", "ece", "accuracy")),
                                          path=out / f"curves_{task}.png"))
        frontier = np.array([ideal_sampler(task, t) for t in FRONTIER_TEMPERATURES])
        if np.isfinite(frontier).all():
            paths.append(plot_metric_paths(
                hist, x="expected_accuracy", y="auroc", path=out / f"tradeoff_{task}.png",
                references={"auroc": (frontier[:, 0], frontier[:, 1], "ideal sampler at temperature T")}))
    samples = _final_samples(out, summary, task)
    # the legend's ECE is that of the pooled samples, which is not the tables' mean of per-seed ECEs: say so
    seeds = len({r["seed"] for r in summary["results"] if r["task"] == task})
    pooled = f"\n({seeds} seeds pooled; the legend's ECE is that of the pooled samples)" if seeds > 1 else ""
    if samples:
        if task == "decision":
            series = {}
            for label, s in samples.items():
                has = np.isfinite(s["dec_conf"])
                series[label] = (s["dec_conf"][has], s["correct"][has])
            paths.append(plot_reliability(series, out / f"reliability_{task}.png", strategy="quantile",
                                          title=f"Decision-token reliability, final models, equal-count bins{pooled}"))
        else:
            series = {label: (s["seq_prob"], s["correct"]) for label, s in samples.items()}
            paths.append(plot_reliability(series, out / f"reliability_{task}.png",
                                          title=f"Sequence-probability reliability, final models{pooled}"))
    return paths


def figure_caption(summary: dict, task: str, path: Path) -> str:
    """The sentence under a figure of :func:`write_figures` in the report (known by its file name, ``path`` in the
    report's folder): what it shows and how to read it."""
    from calibrl.evaluation.plots import THIN_BIN

    kind = Path(path).stem.split("_", 1)[0]
    seeds = len({r["seed"] for r in summary["results"] if r["task"] == task})
    drawn = sum(any(final_samples_path(path.parent, r) for r in runs)  # series in the reliability diagram
                for runs in _runs_by_method(summary, task).values())
    if kind == "curves":
        spread = " (the line is the mean over seeds, the band their range)" if seeds > 1 else ""
        return ("*Training curves: one panel per metric over the RL steps (its title says whether higher or lower "
                f"is better), one colour and marker per method{spread}, each curve starting from the shared warm "
                "start at step 0 and a dotted flat line marking a method evaluated only once.*")
    if kind == "tradeoff":
        return ("*Accuracy against AUROC: each method's path from the warm start to its circled last evaluation, "
                "beside the dashed ideal sampler (the true distribution sharpened or flattened by a temperature T: "
                "what sharpening alone costs in AUROC); compare methods at equal accuracy, where the higher point "
                "ranks right above wrong answers better, not by where they stopped.*")
    if kind == "reliability":
        confidence = ("the decision token's probability in equal-count bins" if task == "decision" else
                      "the sequence probability in equal-width bins")
        if drawn == 1:
            reading = "the bars are the share right in each bin, the hatched red their gap to the bin's mean confidence"
        else:
            reading = (f"each point is a bin's share right against its mean confidence (hollow: fewer than "
                       f"{THIN_BIN} samples)")
        return (f"*Reliability of the final models, {confidence}: {reading}, the histogram below shows where the "
                f"confidences lie and the legend gives {'the' if drawn == 1 else 'each'} method's ECE; on the "
                "diagonal is calibrated, below it over-confident, above it under-confident.*")
    return ""


def _ceiling_noise(summary: dict, cfg: dict) -> str:
    """", of the order of the ceiling's standard error on these samples, about X-Y" (Hanley and McNeil, from each
    final evaluation's ceiling, accuracy and sample count), or "" when the records do not say."""
    from calibrl.metrics import auroc_standard_error

    n = int(cfg.get("eval_prompts") or 0) * int(cfg.get("eval_samples") or 0)
    errors = []
    for run in summary.get("results", []):
        final = (run.get("history") or [{}])[-1]
        ceiling, accuracy = final.get("auroc_ceiling"), final.get("expected_accuracy", final.get("accuracy"))
        if n and isinstance(ceiling, (int, float)) and isinstance(accuracy, (int, float)):
            errors.append(auroc_standard_error(ceiling, round(n * accuracy), n - round(n * accuracy)))
    errors = [e for e in errors if np.isfinite(e)]
    if not errors:
        return ""
    low, high = min(errors), max(errors)
    return (f", of the order of the ceiling's standard error on these samples, about {low:.3f}"
            + (f"-{high:.3f}" if f"{high:.3f}" != f"{low:.3f}" else ""))


def write_demo_report(summary: dict, out: str | Path, *, title: str = "calibrl demo", command: str | None = None,
                      extra: str = "") -> Path:
    """``report.md`` (tables per task, figures, setup) in ``out``; returns its path."""
    out = Path(out)
    cfg = summary.get("config", {})
    tasks = [t for t in ("stochastic_reasoning", "decision", "addition", "scratchpad")
             if any(r["task"] == t for r in summary["results"])]
    lines = [f"# {title}", ""]
    if command:
        lines += ["Command:", "", f"```\n{command}\n```", ""]
    lines += [
        f"Setup: tiny char-level Llama (~0.2M parameters), one SFT warm start per task (sampled from the true "
        f"distribution, or for scratchpad from a teacher that slips; chosen by evaluation), then every method for {cfg.get('steps')} steps of "
        f"{cfg.get('prompts_per_step')} prompts x {cfg.get('num_generations')} samples at T = 1, AdamW lr "
        f"{cfg.get('learning_rate')}, beta 0, seeds {list(cfg.get('seeds', []))}. Same budget for every method. "
        f"Evaluation: {cfg.get('eval_prompts')} held-out prompts x {cfg.get('eval_samples')} samples, outcomes drawn "
        "from the true distribution with one fixed stream for all methods (common random numbers). "
        "'AUROC ceiling' = AUROC of the true success probability on the same samples (no confidence can beat "
        "it in expectation; on finite samples one can land above it by chance, so a 'ceiling − AUROC' a little "
        f"below 0 is sampling noise{_ceiling_noise(summary, cfg)}). Two accuracies: 'accuracy (expected)' = mean true success probability of the sampled completions "
        "(noise-free; the one the findings and the progress lines quote), 'accuracy (drawn)' = share of the "
        "outcomes drawn from it that came out right. ↑: higher is better, ↓: lower is better.",
        "",
    ]
    found = [(task, findings(summary, task)) for task in tasks]
    if any(lines_ for _, lines_ in found):
        lines += ["## What this run shows", "",
                  "Computed from the tables below. Much of what separates the methods here is one trade-off: "
                  "the further a method moves from the calibrated warm start towards higher accuracy, the more "
                  "calibration it loses; read every comparison at unequal accuracy with that in mind.", ""]
        for task, lines_ in found:
            if lines_:
                lines += [f"**{TASK_TITLES.get(task, task)}**", ""] + [f"- {x}" for x in lines_] + [""]
        lines += [REGIME_NOTE, ""]
    for task in tasks:
        lines += [f"## {TASK_TITLES.get(task, task)}", "", markdown_table(summary, task), ""]
        if warm_start_sentence(summary, task):
            lines += [warm_start_sentence(summary, task), ""]
        for path in write_figures(summary, out, task):
            lines += [f"![{path.stem}]({path.name})", "", figure_caption(summary, task, path), ""]
    if extra:
        lines += [extra, ""]
    lines += [wall_time_sentence(summary), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def wall_time_sentence(summary: dict) -> str:
    """The run's wall time; for a study merged from several training invocations (``seconds_by_invocation``, or
    only the last one's ``seconds`` where older files did not record the others), what the figure covers."""
    timed = summary.get("seconds_by_invocation")
    if timed and len(timed) > 1:
        return f"Wall time: {sum(timed):.0f} s over {len(timed)} training invocations."
    trainings = [line for line in str(summary.get("command", "")).splitlines()
                 if line.strip() and "--report-only" not in line]
    if len(trainings) > 1:
        return (f"Wall time: {summary.get('seconds', 0):.0f} s for one of the {len(trainings)} training "
                "invocations above (the others' times were not recorded).")
    return f"Wall time: {summary.get('seconds', 0):.0f} s."


def at_accuracy(history: list[dict], key: str, accuracy: float, *, accuracy_key: str = "expected_accuracy") -> float:
    """``key`` where a run's curve first reaches ``accuracy`` (linear between its evaluations; nan if it never
    does): a method read on its own path at a matched accuracy, so a method that merely moves more slowly along
    the same accuracy-calibration path shows no difference."""
    for a, b in zip(history, history[1:]):
        lo, hi = a[accuracy_key], b[accuracy_key]
        if min(lo, hi) <= accuracy <= max(lo, hi) and hi != lo:
            w = (accuracy - lo) / (hi - lo)
            return (1 - w) * a[key] + w * b[key]
    return math.nan


def paired_t_interval(differences, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of per-seed paired differences: the mean with its Student-t interval over seeds (the seed
    is the unit: same warm start, prompts and outcome stream within a pair, training randomness between pairs);
    low and high are nan with fewer than two finite differences."""
    from scipy import stats

    d = np.asarray(differences, dtype=float)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return math.nan, math.nan, math.nan
    if d.size < 2:
        return float(d.mean()), math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def format_interval(interval: tuple[float, float, float], *, missing: str = "n/a") -> str:
    """``+0.014 [+0.002, +0.026]`` for a (mean, low, high) of :func:`paired_t_interval`; the mean alone when there
    is no interval (one seed); ``missing`` when there is no mean."""
    mean, low, high = interval
    if not np.isfinite(mean):
        return missing
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]" if np.isfinite(low) else f"{mean:+.3f}"


def matched_accuracy_differences(summary: dict, task: str, *, reference: str = "grpo",
                                 keys: tuple[str, ...] = ("auroc", "auroc_gap", "seq_ece")) -> dict[str, dict]:
    """Each method read against ``reference`` at matched accuracy, paired by seed: per seed, both runs are read at
    the lower of their two final expected accuracies, the run that went further on its own curve there
    (:func:`at_accuracy`) and the other at its final evaluation. So a method that only moves more slowly along the
    reference's path gets 0, and a seed where the method ends above anything the reference reached is read at the
    reference's end instead of being dropped (dropping exactly the seeds that went furthest biases the mean).

    Returns ``{method: {"label", "accuracy" (mean matched accuracy), "seeds", "reached" (seeds read at the
    method's final accuracy, the reference's curve reaching it), "at_reference_end" (seeds read at the
    reference's final accuracy instead), key: (mean, low, high) for each of keys}}`` (:func:`paired_t_interval`
    over seeds, the method minus the reference), with ``"readings"``: {key: [(method's value, reference's value)
    per seed]} at the matched points."""
    runs = _runs_by_method(summary, task)
    if reference not in runs:
        return {}
    ref = {r["seed"]: [_with_derived(h) for h in r["history"]] for r in runs[reference]}
    out = {}
    for method, records in runs.items():
        if method == reference:
            continue
        pairs = [([_with_derived(h) for h in r["history"]], ref[r["seed"]]) for r in records if r["seed"] in ref]
        diffs: dict[str, list[float]] = {k: [] for k in keys}
        readings: dict[str, list[tuple[float, float]]] = {k: [] for k in keys}
        matched, reached, at_end = [], 0, 0
        for history, ref_history in pairs:
            final, ref_final = history[-1], ref_history[-1]
            ref_at = {k: at_accuracy(ref_history, k, final["expected_accuracy"]) for k in keys}
            if np.isfinite(ref_at[keys[0]]):  # the reference's curve reaches the method's final accuracy
                reached += 1
                matched.append(final["expected_accuracy"])
                pair = {k: (final.get(k, math.nan), ref_at[k]) for k in keys}
            else:  # the method went further: read its own curve at the reference's final accuracy
                own_at = {k: at_accuracy(history, k, ref_final["expected_accuracy"]) for k in keys}
                at_end += int(np.isfinite(own_at[keys[0]]))
                matched.append(ref_final["expected_accuracy"] if np.isfinite(own_at[keys[0]]) else math.nan)
                pair = {k: (own_at[k], ref_final.get(k, math.nan)) for k in keys}
            for k in keys:
                diffs[k].append(pair[k][0] - pair[k][1])
                readings[k].append(pair[k])
        finite = [a for a in matched if np.isfinite(a)]
        entry = {"label": records[0]["label"], "seeds": len(pairs), "reached": reached, "at_reference_end": at_end,
                 "accuracy": float(np.mean(finite)) if finite else math.nan}
        entry.update({k: paired_t_interval(v) for k, v in diffs.items()})
        entry["p_values"] = {k: paired_t_p_value(v) for k, v in diffs.items()}
        entry["readings"] = readings
        out[method] = entry
    return out


def paired_t_p_value(differences) -> float:
    """Two-sided p-value of the one-sample t-test of mean 0 over the finite per-seed differences (nan below two)."""
    from scipy import stats

    d = np.asarray(differences, dtype=float)
    d = d[np.isfinite(d)]
    return float(stats.ttest_1samp(d, 0.0).pvalue) if d.size >= 2 else math.nan


def holm_sentence(matched: dict, *, level: float = 0.05) -> str:
    """How many of the matched-accuracy intervals of a table survive Holm's correction over all of them (no
    endpoint of the testbed study was named before its runs, so every interval is one of many tests)."""
    tests = [(p, e["label"], k) for e in matched.values() for k, p in e.get("p_values", {}).items() if np.isfinite(p)]
    if not tests:
        return ""
    from calibrl.evaluation.plots import metric_labels

    def name(label: str, key: str) -> str:
        return f"{label}, {metric_labels(key)[0]}"

    ordered = sorted(tests)
    survivors = []
    for rank, (p, label, key) in enumerate(ordered):  # Holm: the i-th smallest p against level / (m - i)
        if p > level / (len(ordered) - rank):
            break
        survivors.append(name(label, key))
    p, label, key = ordered[0]
    head = f"No endpoint was named before these runs, so the table is {len(tests)} tests, Holm-corrected at {level:g}: "
    if survivors:
        return head + f"{len(survivors)} survive ({'; '.join(survivors)})."
    return head + (f"none survives (the smallest p-value, {p:.3f} for {name(label, key)}, would need to be at most "
                   f"{level / len(tests):.4f}).")


def matched_note(entry: dict, reference: str = "GRPO") -> str:
    """`` (k of n seeds read at GRPO's final accuracy)`` for a method some of whose seeds went further than the
    reference, and how many could be read at all."""
    read = entry["reached"] + entry.get("at_reference_end", 0)
    notes = []
    if entry.get("at_reference_end"):
        notes.append(f"{entry['at_reference_end']} of {entry['seeds']} seeds read at {reference}'s final accuracy")
    if read < entry["seeds"]:
        notes.append(f"{entry['seeds'] - read} of {entry['seeds']} seeds not matched")
    return f" ({'; '.join(notes)})" if notes else ""


__all__ = ["REGIME_NOTE", "aggregate", "at_accuracy", "final_samples_path", "findings", "format_interval",
           "wall_time_sentence",
           "holm_sentence", "markdown_table", "matched_accuracy_differences", "matched_note",
           "paired_t_interval", "paired_t_p_value",
           "warm_start_sentence",
           "summary_table", "write_demo_report", "write_figures", "figure_caption"]
