"""The testbed study: every demo method x N seeds from one warm start per task; mean and spread over seeds.

:func:`run_study` is what ``python -m studies.testbed`` runs. It trains the methods with
:func:`calibrl.testbed.demo.run_demo` (or, with ``report_only``, trains nothing and reloads an earlier
``testbed_results.json``), merges the runs of earlier results files (more seeds, more methods), and writes to ``out``:

* ``testbed.md``: the report (:func:`calibrl.testbed.report.write_demo_report`: tables per task with mean ± std over
  seeds, the warm start, curves and reliability diagrams), with the hand-written ``## Findings`` section of the
  ``testbed.md`` already there (:func:`kept_findings`) and what was tuned, on what (:data:`TUNING_NOTES`);
* ``testbed_curves_*.png`` / ``testbed_tradeoff_*.png`` / ``testbed_reliability_*.png``: its figures;
* ``testbed_results.json``: every evaluation of every run (without TRL's training logs), reloadable by a later
  ``report_only`` study;
* ``headline.md``: the README's table (:func:`headline`), with the exact commands.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from calibrl.testbed.demo import run_demo
from calibrl.metrics import metric
from calibrl.testbed.methods import DemoConfig
from calibrl.testbed.report import (aggregate, final_samples_path, format_interval, matched_accuracy_differences,
                                   holm_sentence, matched_note, write_demo_report)

STUDY_TITLE = "Testbed study"
# the line of every results page naming its raw data (tests/test_reproduce.py)
DATA_LINE = "Data: `docs/results/testbed_results.json` (rebuilt by `python -m studies.reproduce --only testbed`"

TUNING_NOTES = """\
### What was tuned, on what

- Shared by all methods, taken from earlier exploratory runs on this tiny model (not on these
  evaluation prompts): lr 1e-4 (5e-4 collapsed), 16 prompts x 8 samples per step, T = 1, beta 0, one torch thread
  per process.
- Warm starts: SFT lr 3e-3 (constant), batch 64, up to 1500 steps, evaluated every 100 steps (greedy, on the
  *eval* prompt pool, disjoint from the *test* prompts used here); the first checkpoint reaching 97% reasoning
  accuracy, else the best. Neither task reached 97% (the constant lr oscillates): decision kept step 1100 (94.5%),
  stochastic_reasoning step 1400 (93.8%). The decision warm start is NOT well calibrated (mean |q - p| 0.19):
  sampling from the true distribution gives calibrated targets, but 1100 steps of SFT at this lr do not fit them.
- Addition control warm start: its own SFT settings (calibrl.testbed.warmstart.TASK_SFT), set after the shared ones
  stalled (3% greedy accuracy after 700 steps): lr 1e-3 cosine, 100 warmup steps, batch 128, 50,000 distinct
  prompts, evaluated every 50 steps, target 50% greedy accuracy on the eval pool. The first setting tried, no search (run
  once evaluating every 250 steps, which stopped at 65.6%, then every 50 steps to stop nearer the target: the
  trajectory is the same, identical accuracies at shared steps). It kept step 1200 (56.2%; 27.3% at step 1150). The RL settings are the shared ones above, CAPO at tau 0.6; none tuned on it.
- CAPO: tau = 0.6 (the paper's 1.5B value), normaliser 1/G, mask = batch quantiles 0.75 / 0.25 of the reference
  perplexity (the paper's fixed 2.5 / 1.05 are for Qwen2.5-Math and do not transfer to a char-level model).
  Not tuned here. CAPO tau = 0.2 (rows "CAPO (tau 0.2)", "CAPO + mask (tau 0.2)") was chosen AFTER seeing the
  tau 0.6 results on this same task and these same test prompts: tuned on the test task itself, so read those
  rows as a second operating point, not as a held-out result.
- Decision-token CE: lambda = 1 (earlier exploratory runs: the paper's 1e-3 is far too weak at this scale; 1 was the
  best of {0, 1e-3, 1} in the throwaway runs). GCPO / SEED-GRPO: library defaults, not tuned.
"""


FINDINGS_HEADING = "## Findings"


def kept_findings(old_report: str) -> str:
    """The hand-written ``## Findings`` section of an earlier ``testbed.md`` (up to the tuning notes, the next
    ``## `` heading or the wall time line), so that rebuilding the tables does not drop it; ``""`` if it has none.
    The findings are read against the numbers, so the caller prints a reminder to re-read them."""
    lines = old_report.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(FINDINGS_HEADING)), None)
    if start is None:
        return ""
    tuning = TUNING_NOTES.splitlines()[0]
    end = len(lines)
    for i in range(start + 1, len(lines)):
        if lines[i] == tuning or lines[i].startswith("## ") or lines[i].startswith("Wall time:"):
            end = i
            break
    return "\n".join(lines[start:end]).strip() + "\n"


def headline(summary: dict, command: str) -> str:
    """The README's table (``headline.md``): per task, the final evaluation of every method as mean ± std over
    seeds next to the warm start, then the ``command`` that made it."""
    def cell(agg, method, key):
        e = agg.get(method)
        if not e or key not in e["metrics"]:
            return "n/a"
        m = e["metrics"][key]
        s = f"{m['mean']:.3f}"
        if np.isfinite(m["std"]):
            s += f" ± {m['std']:.3f}"
        return s

    n = len(summary["config"]["seeds"])
    lines = [
        DATA_LINE + ").",
        "",
        f"Testbed (tiny char-level Llama, CPU; {summary['config']['steps']} RL steps from one SFT warm start, "
        f"{n} seed(s), mean ± std over seeds; evaluation on held-out prompts):",
        "",
    ]
    seq = aggregate(summary, "stochastic_reasoning")
    matched = matched_accuracy_differences(summary, "stochastic_reasoning")
    if matched and n > 1:
        lines += [f"At matched accuracy: each method's final evaluation minus GRPO's curve (same seed) where it first "
                  f"reaches that method's final expected accuracy (where GRPO never gets there, the method's curve "
                  f"at GRPO's final accuracy minus GRPO's final evaluation); mean [95% t-interval over {n} seeds]:", "",
                  "| sequence confidence | matched accuracy (expected) | Δ AUROC of mean log-prob ↑ | "
                  "Δ ceiling − AUROC ↓ | Δ ECE seq. prob. ↓ |", "|---|---:|---:|---:|---:|"]
        for e in matched.values():
            cells = [format_interval(e[key], missing="not reached by GRPO") for key in ("auroc", "auroc_gap", "seq_ece")]
            note = matched_note(e)
            lines.append(f"| {e['label']}{note} | {e['accuracy']:.3f} | " + " | ".join(cells) + " |")
        lines += ["", holm_sentence(matched), "", "At the end of training (unequal accuracy), mean ± std over seeds:",
                  ""]
    if seq:
        ceiling = next(iter(seq.values()))["metrics"].get("auroc_ceiling", {}).get("start", float("nan"))
        lines += ["| sequence confidence | accuracy (expected) ↑ | AUROC of mean log-prob ↑ | ceiling − AUROC ↓ | "
                  "ECE seq. prob. ↓ |", "|---|---:|---:|---:|---:|"]
        w = next(iter(seq.values()))["metrics"]
        lines.append(f"| warm start (SFT) | {w['expected_accuracy']['start']:.3f} | {w['auroc']['start']:.3f} | "
                     f"{w['auroc_gap']['start']:.3f} | {w['seq_ece']['start']:.3f} |")
        for method, e in seq.items():
            lines.append(f"| {e['label']} | {cell(seq, method, 'expected_accuracy')} | {cell(seq, method, 'auroc')} | "
                         f"{cell(seq, method, 'auroc_gap')} | {cell(seq, method, 'seq_ece')} |")
        lines += ["", f"AUROC ceiling (true probability, warm-start samples): {ceiling:.3f}."]
        if any("tau0.2" in method for method in seq):
            lines.append("CAPO tau 0.2 was chosen after seeing tau 0.6 on these test prompts (tuned on the test task).")
        lines.append("")
    dec = aggregate(summary, "decision")
    if dec:
        lines += ["| decisions | accuracy (expected, sampled) ↑ | accuracy (argmax decision) ↑ | decision ECE ↓ | "
                  "mean abs(q - p) ↓ | conf > 0.99 ↓ |", "|---|---:|---:|---:|---:|---:|"]

        for method, e in dec.items():
            lines.append(f"| {e['label']} | {cell(dec, method, 'expected_accuracy')} | "
                         f"{cell(dec, method, 'greedy_decision_accuracy')} | {cell(dec, method, 'dec_ece')} | "
                         f"{cell(dec, method, 'calib_err')} | {cell(dec, method, 'frac_conf_99')} |")
        lines.append("")
    add = aggregate(summary, "addition")
    if add:
        lines += ["| deterministic control (addition) | accuracy ↑ | AUROC of mean log-prob ↑ |", "|---|---:|---:|"]
        first = next(iter(add.values()))["metrics"]
        lines.append(f"| warm start (SFT) | {first['expected_accuracy']['start']:.3f} | {first['auroc']['start']:.3f} |")
        for method, e in add.items():
            lines.append(f"| {e['label']} | {cell(add, method, 'expected_accuracy')} | {cell(add, method, 'auroc')} |")
        lines.append("")
    lines += ["Reproduce:", "", f"```\n{command}\n```", "", "Full report: [docs/results/testbed.md](testbed.md)."]
    return "\n".join(lines) + "\n"


def backfill(summary: dict) -> None:
    """Runs made before ``greedy_decision_accuracy`` existed: compute it for their final evaluation from the
    saved final samples (the same declared metric, ``calibrl.metrics.metric("greedy_decision_accuracy")``)."""
    for rec in summary["results"]:
        final = rec["history"][-1]
        if rec["task"] != "decision" or "greedy_decision_accuracy" in final:
            continue
        path = Path(rec.get("run_dir", "")) / "final_samples.npz"
        if path.exists():
            d = np.load(path)
            final["greedy_decision_accuracy"] = metric("greedy_decision_accuracy").compute(
                {"p_yes": d["p_yes"], "p_true_yes": d["p_true_yes"], "p_true": d["q_true"]})
            if len(rec["history"]) == 1 or rec["method"] == "sft":
                rec["history"][0]["greedy_decision_accuracy"] = final["greedy_decision_accuracy"]


def merge_results(summary: dict, paths: Sequence[str | Path]) -> str:
    """Add to ``summary`` the runs of earlier results files (a method x seed already in it is kept) and update its
    seeds; returns the commands those files were made with, each on a new line, to append to its command."""
    commands = ""
    for extra in paths:
        old = json.loads(Path(extra).read_text())
        if "seconds" in summary and "seconds" in old:  # every training invocation's time, for the report
            mine = summary.get("seconds_by_invocation") or [summary["seconds"]]
            summary["seconds_by_invocation"] = mine + (old.get("seconds_by_invocation") or [old["seconds"]])
        seen = {(r["key"], r["seed"]) for r in summary["results"]}
        summary["results"] += [r for r in old["results"] if (r["key"], r["seed"]) not in seen]
        summary["config"]["seeds"] = sorted({r["seed"] for r in summary["results"]})
        commands += "\n" + old.get("command", str(extra))
    return commands


def warn_missing_samples(summary: dict, scratch: Path) -> None:
    """Say on stderr which runs have no ``final_samples.npz`` where the summary says (a results file moved to
    another machine): the reliability diagrams leave them out."""
    missing = [f"{r['key']} seed {r['seed']}" for r in summary["results"] if final_samples_path(scratch, r) is None]
    if missing:
        print(f"no final_samples.npz for {len(missing)} run(s) ({', '.join(missing[:4])}"
              f"{', ...' if len(missing) > 4 else ''}): the reliability diagrams leave them out "
              "(their run folders are not where the results file says)", file=sys.stderr)


def write_study_report(summary: dict, out: Path, *, scratch: Path, command: str) -> Path:
    """Write ``out/testbed.md`` (keeping the Findings of the one already there) and its figures, prefixed
    ``testbed_``; the report is drawn in ``scratch`` first. Returns the path of ``testbed.md``."""
    scratch.mkdir(parents=True, exist_ok=True)
    previous = out / "testbed.md"
    findings = kept_findings(previous.read_text()) if previous.exists() else ""
    if findings:
        print(f"kept the Findings section of {previous}: re-read it against the new tables", file=sys.stderr)
    report = write_demo_report(summary, scratch, title=STUDY_TITLE, command=command,
                               extra="\n".join(part for part in (findings, TUNING_NOTES) if part))
    # copy the report and figures into out with a testbed_ prefix
    text = report.read_text()
    title = f"# {STUDY_TITLE}\n"
    if text.startswith(title) and "\nData: " not in text[:400]:
        text = (f"{title}\n{DATA_LINE}; the reliability\ndiagrams from the runs' per-sample files, "
                f"`docs/results/testbed_samples/`, one `<task>/<method>/seed<k>/final_samples.npz` per run).\n"
                + text[len(title):])
    for png in scratch.glob("*.png"):
        target = out / f"testbed_{png.name}"
        shutil.copyfile(png, target)
        text = text.replace(f"]({png.name})", f"]({target.name})")
    previous.write_text(text)
    return previous


def write_results(summary: dict, out: Path) -> Path:
    """Write ``out/testbed_results.json``: the summary without TRL's training logs (what ``report_only`` reloads)."""
    slim = {k: v for k, v in summary.items() if k != "results"}
    slim["results"] = [{k: v for k, v in r.items() if k != "train_logs"} for r in summary["results"]]
    path = out / "testbed_results.json"
    path.write_text(json.dumps(slim, indent=1, default=float))
    return path


def run_demo_for_study(config: DemoConfig, *, scratch: Path, runs: Path, command: str) -> dict:
    """Train the study's runs with :func:`calibrl.testbed.demo.run_demo` (per-run files in ``runs``, no demo
    report: the study writes its own)."""
    summary = run_demo(config, scratch, runs_dir=runs, title=STUDY_TITLE, command=command, write_report=False)
    summary["command"] = command
    return summary


def runnable_command(recorded: str) -> str:
    """A recorded command as it runs today: the studies moved from ``bench/<name>.py`` to the ``studies`` package
    (2026-11-28), so ``python bench/testbed.py ...`` reads ``python -m studies.testbed ...`` (the results files keep
    the commands as they were run)."""
    import re

    def current(match: re.Match) -> str:  # a study that moved; bench/'s cost benchmarks stay where they are
        moved = (Path(__file__).parent / f"{match.group(2)}.py").exists()
        return f"python{match.group(1)} -m studies.{match.group(2)}" if moved else match.group(0)

    return re.sub(r"\bpython(3?) bench/(\w+)\.py\b", current, recorded)


def run_study(config: DemoConfig, *, out: str | Path, runs: str | Path, merge: Sequence[str | Path] = (),
              report_only: bool = False, command: str) -> dict:
    """Train every method of ``config`` x its seeds (per-run files in ``runs``; nothing trained with
    ``report_only``, which rebuilds from the first ``merge`` file), merge in the runs of the ``merge`` files, and
    write the study's files to ``out`` (see the module docstring). ``command`` is the command line that invoked
    the study; the report records it with the commands behind the merged files. Returns the merged summary."""
    if report_only and not merge:
        raise ValueError("report_only needs at least one results file to merge")
    out, runs = Path(out), Path(runs)
    out.mkdir(parents=True, exist_ok=True)
    scratch = runs / "report"
    if report_only:
        summary = json.loads(Path(merge[0]).read_text())
        recorded = summary.get("command", command)
        merge = merge[1:]
    else:
        summary = run_demo_for_study(config, scratch=scratch, runs=runs, command=command)
        recorded = command
    recorded += merge_results(summary, merge)
    if report_only:
        recorded += "\n" + command
    summary["command"] = recorded
    backfill(summary)
    warn_missing_samples(summary, scratch)
    write_study_report(summary, out, scratch=scratch, command=runnable_command(recorded))
    write_results(summary, out)
    (out / "headline.md").write_text(headline(summary, runnable_command(recorded)))
    return summary


__all__ = ["FINDINGS_HEADING", "TUNING_NOTES", "backfill", "headline", "kept_findings", "merge_results", "run_study",
           "runnable_command", "warn_missing_samples", "write_results", "write_study_report"]
