"""The built-in demo: one warm start per task, then every method trained from it with the same seeds.

:func:`run_demo` is what ``calibrl demo`` runs: the warm starts (:func:`calibrl.testbed.runner.prepare_warm_starts`),
one run per method x seed (:func:`calibrl.testbed.runner.run_jobs`) with a progress bar per run, then
``results.json`` and the report (:func:`calibrl.testbed.report.write_demo_report`). The methods and the budget they
share are in :mod:`calibrl.testbed.methods`, the metrics in :mod:`calibrl.testbed.evaluate`; the multi-seed study
behind docs/results/ (:mod:`calibrl.testbed.study`) calls :func:`run_demo` too.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from calibrl.testbed.methods import DemoConfig, method_specs
from calibrl.testbed.runner import build_jobs, prepare_warm_starts, run_jobs


def run_demo(config: DemoConfig, out: str | Path, *, console=None, write_report: bool = True,
             runs_dir: str | Path | None = None, title: str = "calibrl demo", command: str | None = None) -> dict:
    """Warm starts, every method x seed, then ``report.md`` + PNGs in ``out``. Returns the summary dict.

    Per-run files (history.json, final_samples.npz) go to ``runs_dir`` (default ``out/runs``)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    specs = method_specs(capo_tau=config.capo_tau, decision_coef=config.decision_coef)
    keys = list(config.methods)
    tasks = sorted({specs[k].task for k in keys if k in specs})
    console.print(f"[bold]calibrl demo[/bold]: {len(keys)} methods x {len(config.seeds)} seed(s), "
                  f"{config.steps} steps each, {config.workers} worker(s) -> {out}")
    with console.status("warm starts (SFT, cached after the first run)..."):
        warm = prepare_warm_starts(config, tasks, log=None)
    for task, path in warm.items():
        from calibrl.testbed.warmstart import warm_start_info

        info = warm_start_info(path)
        console.print(f"  warm start {task}: step {info['chosen_step']}, greedy accuracy "
                      f"{info['chosen_accuracy']:.2f} ({path})")
    jobs = build_jobs(config, Path(runs_dir) if runs_dir else out / "runs", warm)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[m]}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        bars = {}
        for job in jobs:
            name = f"{job['key']} s{job['seed']}"
            bars[(job["key"], job["seed"])] = progress.add_task(name, total=max(job["steps"], 1), m="")

        def on_progress(msg: dict) -> None:
            bar = bars.get((msg["key"], msg["seed"]))
            if bar is None:
                return
            fields = {}
            if "metrics" in msg:
                m = msg["metrics"]
                fields["m"] = f"acc {m['accuracy']:.2f} auroc {m['auroc']:.2f} ece {m['ece']:.3f}"
            total = msg.get("total") or 1
            progress.update(bar, completed=msg["step"] if msg.get("total") else 1, total=total, **fields)

        results = run_jobs(jobs, workers=config.workers, on_progress=on_progress)
    summary = {"config": dataclasses.asdict(config), "warm_starts": warm, "results": results,
               "seconds": round(time.perf_counter() - t0, 1)}
    (out / "results.json").write_text(json.dumps(summary, indent=1, default=float))
    if write_report:
        from calibrl.testbed.report import write_demo_report

        report = write_demo_report(summary, out, title=title, command=command)
        console.print(f"report: {report}")
        from calibrl.testbed.report import summary_table

        for task in tasks:
            console.print(summary_table(summary, task, rich=True))
    console.print(f"done in {summary['seconds']:.0f} s")
    return summary


__all__ = ["run_demo"]
