"""Report of a training comparison (the demo and the study): tables over seeds, curves, reliability diagrams.

Input: the summary dict :func:`calibrl.testbed.demo.run_demo` writes to ``results.json`` (``results``: one record per
method x seed with its evaluation ``history``; :func:`calibrl.testbed.study.run_study` merges several). Output:
``report.md`` with one table per task (final evaluation, mean +- std over seeds, and the change from the shared warm
start), training curves (:func:`calibrl.evaluation.plots.plot_training_curves`) and reliability diagrams of the final
models (:func:`calibrl.evaluation.plots.plot_reliability`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

# Per task: (metric key, column title, higher is better?)
TASK_METRICS: dict[str, list[tuple[str, str, bool | None]]] = {
    "stochastic_reasoning": [
        ("expected_accuracy", "accuracy (expected)", True),
        ("accuracy", "accuracy (drawn)", True),
        ("auroc", "AUROC seq. conf.", True),
        ("auroc_per_prompt", "AUROC per prompt", True),
        ("auroc_ceiling", "AUROC ceiling", None),
        ("auroc_gap", "ceiling − AUROC", False),
        ("seq_ece", "ECE seq. prob.", False),
        ("reasoning_accuracy", "reasoning ok", True),
    ],
    "decision": [
        ("expected_accuracy", "accuracy (expected)", True),
        ("accuracy", "accuracy (drawn)", True),
        ("greedy_decision_accuracy", "accuracy, argmax decision", True),
        ("dec_ece", "decision ECE (eq.-count)", False),
        ("calib_err", "mean abs(q - p)", False),
        ("frac_conf_99", "frac. conf > 0.99", False),
        ("dec_auroc", "AUROC decision conf.", True),
        ("auroc", "AUROC seq. conf.", True),
        ("auroc_ceiling", "AUROC ceiling", None),
        ("auroc_gap", "ceiling − AUROC", False),
    ],
    "addition": [
        ("expected_accuracy", "accuracy", True),
        ("auroc", "AUROC seq. conf.", True),
        ("auroc_per_prompt", "AUROC per prompt", True),
        ("seq_ece", "ECE seq. prob.", False),
    ],
}
CURVE_METRICS = {
    "stochastic_reasoning": ("auroc", "seq_ece", "expected_accuracy"),
    "decision": ("dec_ece", "calib_err", "auroc", "expected_accuracy"),
    "addition": ("auroc", "seq_ece", "expected_accuracy"),
}
TASK_TITLES = {
    "stochastic_reasoning": "Sequence confidence (testbed/stochastic_reasoning)",
    "decision": "Decisions (testbed/decision)",
    "addition": "Deterministic control (testbed/addition)",
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
    for method, e in agg.items():
        cells = [_fmt(e["metrics"].get(k)) for k, _, _ in metrics]
        rows.append(f"| {e['label']} | {len(e['seeds'])} | {e['steps']} | " + " | ".join(cells) + " |")
    note = "\n\n_Mean ± sample std over seeds (no ± with one seed)._" if n_seeds else ""
    return "\n".join(rows) + note


def summary_table(summary: dict, task: str, *, rich: bool = False):
    """The final-evaluation table as a rich Table (``rich=True``) or markdown."""
    if not rich:
        return markdown_table(summary, task)
    from rich.table import Table

    agg = aggregate(summary, task)
    short = {"expected_accuracy": "acc", "auroc": "AUROC", "auroc_ceiling": "ceiling", "seq_ece": "ECE",
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
    """Training curves and final reliability diagrams for ``task`` into ``out``; returns the PNG paths."""
    from calibrl.evaluation.plots import plot_reliability, plot_training_curves

    out = Path(out)
    paths = []
    hist = _histories(summary, task)
    if hist:
        paths.append(plot_training_curves(hist, metrics=CURVE_METRICS.get(task, ("auroc", "ece", "accuracy")),
                                          path=out / f"curves_{task}.png"))
    samples = _final_samples(out, summary, task)
    if samples:
        if task == "decision":
            series = {}
            for label, s in samples.items():
                has = np.isfinite(s["dec_conf"])
                series[label] = (s["dec_conf"][has], s["correct"][has])
            paths.append(plot_reliability(series, out / f"reliability_{task}.png", strategy="quantile",
                                          title="Decision-token reliability (final models, equal-count bins)"))
        else:
            series = {label: (s["seq_prob"], s["correct"]) for label, s in samples.items()}
            paths.append(plot_reliability(series, out / f"reliability_{task}.png",
                                          title="Sequence-probability reliability (final models)"))
    return paths


def write_demo_report(summary: dict, out: str | Path, *, title: str = "calibrl demo", command: str | None = None,
                      extra: str = "") -> Path:
    """``report.md`` (tables per task, figures, setup) in ``out``; returns its path."""
    out = Path(out)
    cfg = summary.get("config", {})
    tasks = [t for t in ("stochastic_reasoning", "decision", "addition")
             if any(r["task"] == t for r in summary["results"])]
    lines = [f"# {title}", ""]
    if command:
        lines += ["Command:", "", f"```\n{command}\n```", ""]
    lines += [
        f"Setup: tiny char-level Llama (~0.2M parameters), one SFT warm start per task (sampled from the true "
        f"distribution, chosen by evaluation), then every method for {cfg.get('steps')} steps of "
        f"{cfg.get('prompts_per_step')} prompts x {cfg.get('num_generations')} samples at T = 1, AdamW lr "
        f"{cfg.get('learning_rate')}, beta 0, seeds {list(cfg.get('seeds', []))}. Same budget for every method. "
        f"Evaluation: {cfg.get('eval_prompts')} held-out prompts x {cfg.get('eval_samples')} samples, outcomes drawn "
        "from the true distribution with one fixed stream for all methods (common random numbers). "
        "'AUROC ceiling' = AUROC of the true success probability on the same samples (no confidence can beat "
        "it); 'accuracy (expected)' = mean true success probability of the sampled completions (noise-free).",
        "",
    ]
    for task in tasks:
        lines += [f"## {TASK_TITLES.get(task, task)}", "", markdown_table(summary, task), ""]
        agg = aggregate(summary, task)
        start = next(iter(agg.values()), None)
        if start:
            keys = [k for k, _, _ in TASK_METRICS.get(task, []) if k in start["metrics"]]
            lines += ["Warm start (step 0, shared by every method): " + ", ".join(
                f"{k} {start['metrics'][k]['start']:.3f}" for k in keys if np.isfinite(start['metrics'][k]['start'])),
                ""]
        for path in write_figures(summary, out, task):
            lines += [f"![{path.stem}]({path.name})", ""]
    if extra:
        lines += [extra, ""]
    lines += [f"Wall time: {summary.get('seconds', 0):.0f} s.", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


__all__ = ["aggregate", "final_samples_path", "markdown_table", "summary_table", "write_demo_report", "write_figures"]
