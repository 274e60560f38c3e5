"""The built-in demo: one warm start per task, then every method trained from it with the same seeds.

:func:`run_demo` is what ``calibrl demo`` runs: the warm starts (:func:`calibrl.testbed.runner.prepare_warm_starts`),
one run per method x seed (:func:`calibrl.testbed.runner.run_jobs`), each shown by :class:`ProgressDisplay` (bars
with ETA on a terminal, periodic plain lines in a log file), then
``results.json`` and the report (:func:`calibrl.testbed.report.write_demo_report`). The methods and the budget they
share are in :mod:`calibrl.testbed.methods`, the metrics in :mod:`calibrl.testbed.evaluate`; the multi-seed study
behind docs/results/ (:mod:`studies.testbed_study`) calls :func:`run_demo` too.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from calibrl.testbed.methods import DemoConfig, method_specs
from calibrl.testbed.runner import build_jobs, prepare_warm_starts, run_jobs


def format_duration(seconds: float) -> str:
    """'45 s', '1m40s', '1h02m': short enough for a progress line."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class ProgressDisplay:
    """Progress of named jobs (warm starts, runs): step / total, elapsed time and ETA.

    On a terminal (``console.is_terminal``) a rich bar per job; otherwise (a log file, a pipe) plain lines such as
    ``warm start addition: step 300/1000, 45 s elapsed, ETA 1m45s``, one per job whenever it passes another
    ``every_fraction`` of its steps (but not within ``min_seconds`` of its last line: short runs would print every
    step) or ``every_seconds`` have gone by since its last line, and one when it ends.
    A job's clock starts at its first update (a queued run waiting for a worker is not counted). ``clock`` is
    ``time.monotonic`` unless given (tests drive it by hand)."""

    def __init__(self, console, *, every_fraction: float = 0.1, every_seconds: float = 30.0,
                 min_seconds: float = 5.0, clock=None):
        self.console = console
        self.plain = not console.is_terminal
        self.every_fraction, self.every_seconds, self.min_seconds = every_fraction, every_seconds, min_seconds
        self.clock = clock or time.monotonic
        self._jobs: dict[str, dict] = {}
        self._progress = None

    def __enter__(self) -> "ProgressDisplay":
        if not self.plain:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                      TextColumn("{task.fields[note]}"), console=self.console)
            self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def add(self, name: str, total: int) -> None:
        """Declare a job (optional: :meth:`update` adds unknown ones); its clock starts at its first update."""
        if name in self._jobs:
            return
        job = {"total": max(int(total), 1), "start": None, "last_time": None, "last_fraction": 0.0, "done": False}
        if self._progress is not None:
            job["bar"] = self._progress.add_task(name, total=job["total"], note="", start=False)
        self._jobs[name] = job

    def update(self, name: str, step: int, *, total: int | None = None, note: str = "") -> None:
        if name not in self._jobs:
            self.add(name, total or 1)
        job = self._jobs[name]
        if total:
            job["total"] = max(int(total), 1)
        now = self.clock()
        if job["start"] is None:
            job["start"] = job["last_time"] = now
            if self._progress is not None:
                self._progress.start_task(job["bar"])
        if self._progress is not None:
            fields = {"note": note} if note else {}
            self._progress.update(job["bar"], completed=step, total=job["total"], **fields)
            return
        if note:
            job["note"] = note
        fraction = min(step / job["total"], 1.0)
        finished = step >= job["total"]
        since = now - job["last_time"]
        due = (fraction - job["last_fraction"] >= self.every_fraction - 1e-9 and since >= self.min_seconds
               or since >= self.every_seconds)
        if job["done"] or not (finished or (step > 0 and due)):
            return
        job.update(last_time=now, last_fraction=fraction, done=finished)
        self.console.print(self.line(name, step, job["total"], now - job["start"], job.get("note", "")),
                           highlight=False, markup=False, soft_wrap=True)

    @staticmethod
    def line(name: str, step: int, total: int, elapsed: float, note: str = "") -> str:
        """``name: step s/total, X elapsed, ETA Y[, note]`` (``done in X`` at the last step)."""
        if step >= total:
            text = f"{name}: step {step}/{total}, done in {format_duration(elapsed)}"
        else:
            eta = format_duration(elapsed / step * (total - step)) if step > 0 else "?"
            text = f"{name}: step {step}/{total}, {format_duration(elapsed)} elapsed, ETA {eta}"
        return text + (f", {note}" if note else "")


def run_note(metrics: dict) -> str:
    """A run's latest evaluation for its progress line (the expected accuracy, as the report's tables)."""
    note = f"acc (expected) {metrics['expected_accuracy']:.2f}, AUROC {metrics['auroc']:.2f}"
    if "dec_ece" in metrics:
        return note + f", decision ECE {metrics['dec_ece']:.3f}"
    return note + f", ECE {metrics['seq_ece']:.3f}"


def run_demo(config: DemoConfig, out: str | Path, *, console=None, write_report: bool = True,
             runs_dir: str | Path | None = None, title: str = "calibrl demo", command: str | None = None) -> dict:
    """Warm starts, every method x seed, then ``report.md`` + PNGs in ``out``. Returns the summary dict.

    Per-run files (history.json, final_samples.npz) go to ``runs_dir`` (default ``out/runs``)."""
    from rich.console import Console

    console = console or Console()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    specs = method_specs(capo_tau=config.capo_tau, decision_coef=config.decision_coef)
    keys = list(config.methods)
    tasks = sorted({specs[k].task for k in keys if k in specs})
    console.print(f"[bold]calibrl demo[/bold]: {len(keys)} methods x {len(config.seeds)} seed(s), "
                  f"{config.steps} steps each, {config.workers} worker(s) -> {out}", soft_wrap=True)
    with ProgressDisplay(console) as display:
        def on_warm_progress(msg: dict) -> None:
            # a warm start not yet cached: SFT up to `total` steps, stopping early at its target accuracy
            display.update(f"warm start {msg['task']} (SFT, first run only)", msg["step"], total=msg["total"],
                           note=msg.get("note", ""))

        warm = prepare_warm_starts(config, tasks, log=None, on_progress=on_warm_progress)
    for task, path in warm.items():
        from calibrl.testbed.warmstart import warm_start_info

        info = warm_start_info(path)
        target = info.get("target")
        reached = "" if target is None else (
            f", target {target:.3f} reached" if info["chosen_accuracy"] >= target else
            f", below the SFT target {target:.3f} within its step limit: the best evaluation is the warm start "
            "(every method starts from this less accurate model alike)")
        console.print(f"  warm start {task}: step {info['chosen_step']}, greedy accuracy "
                      f"{info['chosen_accuracy']:.3f}{reached} ({path})", soft_wrap=True)  # 0.969 < 0.97: 3 digits
    jobs = build_jobs(config, Path(runs_dir) if runs_dir else out / "runs", warm)
    with ProgressDisplay(console) as display:
        names = {}
        for job in jobs:
            names[(job["key"], job["seed"])] = name = f"{job['key']} s{job['seed']}"
            display.add(name, max(job["steps"], 1))

        def on_progress(msg: dict) -> None:
            name = names.get((msg["key"], msg["seed"]))
            if name is None:
                return
            note = run_note(msg["metrics"]) if "metrics" in msg else ""
            # an evaluation-only run (the SFT row) reports total 0: one step, done at its evaluation
            display.update(name, msg["step"] if msg.get("total") else 1, total=msg.get("total") or 1, note=note)

        results = run_jobs(jobs, workers=config.workers, on_progress=on_progress)
    summary = {"config": dataclasses.asdict(config), "warm_starts": warm, "results": results,
               "seconds": round(time.perf_counter() - t0, 1)}
    (out / "results.json").write_text(json.dumps(summary, indent=1, default=float))
    if write_report:
        from calibrl.testbed.report import write_demo_report

        report = write_demo_report(summary, out, title=title, command=command)
        console.print(f"report: {report}", soft_wrap=True)
        from calibrl.testbed.report import REGIME_NOTE, TASK_TITLES, findings, summary_table

        for task in tasks:
            # a log file gets the markdown table, unwrapped: a rich table squeezed to 80 columns truncates cells
            if console.is_terminal:
                console.print(summary_table(summary, task, rich=True))
            else:
                console.print(f"\n{TASK_TITLES.get(task, task)}\n\n{summary_table(summary, task)}\n",
                              highlight=False, markup=False, soft_wrap=True)
            for sentence in findings(summary, task):
                console.print(f"- {sentence}", highlight=False, markup=False, soft_wrap=True)
        console.print(f"\n{REGIME_NOTE}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"done in {summary['seconds']:.0f} s")
    return summary


__all__ = ["ProgressDisplay", "format_duration", "run_demo", "run_note"]
