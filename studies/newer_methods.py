"""DCPO and Clip-Cov against GRPO and RLCR on the testbed's stated-confidence task (protocol written before the runs:
docs/protocols/newer_methods_testbed.md).

    python -m studies.newer_methods run --workers 2      # 15 runs of 800 steps (about 2-4 min each), resumable
    python -m studies.newer_methods report               # docs/results/newer_methods.md from the runs' files

Task ``testbed/verbalized`` and the training loop are the RLCR study's (:mod:`studies.rlcr`: ``run_arm``,
``evaluate``, ``tables``). Arms (:data:`ARMS`): ``grpo`` and ``rlcr`` (the RLCR study's), ``dcpo`` (calibrl's
``dcpo`` estimator at its defaults, the authors' code's assignment; the stated confidence read by
``calibrl.testbed.tasks:verbalized_confidence_span``), ``clip_cov`` (GRPO with ``loss_type="clip_cov"`` at verl
0.9.1's defaults) and the secondary ``dcpo_paper`` (the paper's assignment). Each finished run is written at once
to ``<out>/<arm>_seed<k>.json`` (its evaluations, settings, UTC start and end); a restart skips the runs whose file
exists. The report (:func:`page`) reads those files alone: the protocol's six paired differences at matched
accuracy (:func:`calibrl.testbed.report.matched_accuracy_differences`, t-intervals over seeds) with their readings,
the secondary comparisons, and the RLCR study's tables for these arms.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from studies import rlcr

TASK = rlcr.TASK
ARMS: dict[str, rlcr.Arm] = {
    "grpo": rlcr.ARM_SETTINGS["grpo"],
    "rlcr": rlcr.ARM_SETTINGS["rlcr"],
    "dcpo": rlcr.Arm("correctness", {
        "advantage_estimator": "dcpo", "stated_confidence_reader": "calibrl.testbed.tasks:verbalized_confidence_span"}),
    "clip_cov": rlcr.Arm("correctness", {  # verl 0.9.1's actor defaults for loss_mode=clip_cov
        "advantage_estimator": "grpo", "loss_type": "clip_cov", "epsilon": 0.2, "epsilon_high": 0.2,
        "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0, "cov_loss_aggregation": "token-mean"}),
    "dcpo_paper": rlcr.Arm("correctness", {
        "advantage_estimator": "dcpo", "advantage_params": {"assignment": "paper"},
        "stated_confidence_reader": "calibrl.testbed.tasks:verbalized_confidence_span"}),
}
PRIMARY = ("grpo", "rlcr", "dcpo", "clip_cov")
SECONDARY = ("dcpo_paper",)
OUT = Path("docs/results/newer_methods")
PROTOCOL = "docs/protocols/newer_methods_testbed.md"
STATED_MIN = 0.5  # an arm stating a confidence in fewer completions: its stated endpoints are not resolvable

# the protocol's primary endpoints: (arm, reference, key, the paper's direction: -1 below 0, +1 above, 0 two-sided)
ENDPOINTS = (
    ("dcpo", "grpo", "stated_ece", -1), ("dcpo", "grpo", "stated_auroc", +1),
    ("dcpo", "rlcr", "stated_ece", -1), ("dcpo", "rlcr", "stated_auroc", +1),
    ("clip_cov", "grpo", "entropy", +1), ("clip_cov", "grpo", "seq_auroc", 0),
)
NAMES = {"stated_ece": "stated ECE", "stated_auroc": "stated AUROC", "entropy": "per-token entropy",
         "seq_auroc": "sequence-confidence AUROC", "expected_accuracy": "final expected accuracy",
         "stated_calib_err": "mean abs(stated - true p)", "brier": "Brier"}


# ------------------------------------------------------------------------------------------------------- runs


def run_file(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm}_seed{seed}.json"


def _one_run(arm: str, seed: int, steps: int, eval_every: int, lr: float, out: str, commit: str) -> str:
    """One run in a worker process (one torch thread); its record written when it ends."""
    import torch

    from calibrl._files import write_then_rename
    from calibrl.testbed.runner import utc_now

    torch.set_num_threads(1)
    started_utc, start = utc_now(), time.perf_counter()
    print(f"{started_utc} start {arm} seed {seed}", flush=True)
    history = rlcr.run_arm(arm, seed=seed, steps=steps, eval_every=eval_every, lr=lr, settings=ARMS[arm])
    record = {"arm": arm, "seed": seed, "steps": steps, "eval_every": eval_every, "lr": lr,
              "settings": dataclasses.asdict(ARMS[arm]), "started_utc": started_utc, "finished_utc": utc_now(),
              "seconds": round(time.perf_counter() - start, 1), "commit": commit, "history": history}
    path = run_file(Path(out), arm, seed)
    write_then_rename(path, json.dumps(record, indent=1))
    print(f"{record['finished_utc']} done {arm} seed {seed}: {record['seconds']:.0f} s -> {path}", flush=True)
    return str(path)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = args.arms.split(",")
    for arm in arms:
        if arm not in ARMS:
            sys.exit(f"--arms: unknown arm {arm!r}; known: {', '.join(ARMS)}")
    primary = [a for a in arms if a in PRIMARY]
    todo = [(arm, seed) for seed in range(args.seeds) for arm in primary]  # the primary runs first, seed-major
    todo += [(arm, seed) for arm in arms if arm not in PRIMARY for seed in range(args.seeds)]
    todo = [(arm, seed) for arm, seed in todo if not run_file(out, arm, seed).exists()]
    print(f"{len(todo)} runs to do: {', '.join(f'{a}/{s}' for a, s in todo)}", flush=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["OMP_NUM_THREADS"] = "1"
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=get_context("spawn")) as pool:
        commit = _commit()  # the checkout the job started from (later commits do not reach the running workers)
        futures = {pool.submit(_one_run, arm, seed, args.steps, args.eval_every, args.lr, str(out), commit): (arm, seed)
                   for arm, seed in todo}
        for future in as_completed(futures):
            future.result()  # a failed run stops the job; the finished runs' files are kept


# ----------------------------------------------------------------------------------------------------- report


def load(folder: Path = OUT) -> list[dict]:
    """Every run record in ``folder`` (arm order of :data:`ARMS`, then seed)."""
    records = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*_seed*.json"))]
    order = list(ARMS)
    return sorted(records, key=lambda r: (order.index(r["arm"]), r["seed"]))


def _summary(records: list[dict]) -> dict:
    """The records in the testbed report's layout, for :func:`matched_accuracy_differences`."""
    return {"results": [{"task": TASK, "method": r["arm"], "seed": r["seed"], "label": r["arm"],
                         "history": r["history"]} for r in records]}


def _reading(interval: tuple[float, float, float], direction: int, n: int) -> str:
    """The protocol's reading of one paired difference."""
    mean, low, high = interval
    if n < 2 or not np.isfinite(low):
        return "not resolvable (fewer than 2 seeds)"
    if low > 0 or high < 0:
        sign = 1 if low > 0 else -1
        if direction == 0:
            return "higher" if sign > 0 else "lower"
        return "reproduced" if sign == direction else "refuted"
    return "not resolvable at this scale"


def _rarely_states(records: list[dict], arm: str) -> bool:
    """True when some evaluation of some seed of ``arm`` has under :data:`STATED_MIN` of its completions stating a
    confidence (conservative: the matched reading lies between two evaluations, so it is at least the lower)."""
    return any(h["stated_fraction"] < STATED_MIN for r in records if r["arm"] == arm for h in r["history"])


def analyse(records: list[dict]) -> dict:
    """The primary differences and the secondary ones, as :func:`page` writes them."""
    from calibrl.testbed.report import matched_accuracy_differences, paired_t_interval, paired_t_p_value

    summary = _summary(records)
    keys = ("expected_accuracy", "stated_ece", "stated_auroc", "stated_calib_err", "brier", "entropy", "seq_auroc",
            "stated_fraction")
    against = {ref: matched_accuracy_differences(summary, TASK, reference=ref, keys=keys)
               for ref in ("grpo", "rlcr", "dcpo")}
    primary = []
    for arm, ref, key, direction in ENDPOINTS:
        entry = against.get(ref, {}).get(arm)
        if entry is None:
            primary.append({"arm": arm, "ref": ref, "key": key, "direction": direction, "missing": True})
            continue
        n = entry["reached"] + entry["at_reference_end"]  # seeds with a matched reading
        reading = _reading(entry[key], direction, n)
        if key.startswith("stated_") and (_rarely_states(records, arm) or _rarely_states(records, ref)):
            reading = "not resolvable (an arm rarely states a confidence)"
        primary.append({"arm": arm, "ref": ref, "key": key, "direction": direction, "interval": entry[key],
                        "p": entry["p_values"][key], "accuracy": entry["accuracy"], "seeds": n, "reading": reading,
                        "stated_fraction": entry["readings"]["stated_fraction"]})
    finals = {}
    for arm, ref in (("dcpo", "grpo"), ("clip_cov", "grpo"), ("rlcr", "grpo"), ("dcpo_paper", "dcpo")):
        diffs = _final_differences(records, arm, ref, "expected_accuracy")
        if diffs:
            finals[(arm, ref)] = (paired_t_interval(diffs), paired_t_p_value(diffs), len(diffs))
    secondary = {}
    for arm, ref in (("dcpo", "grpo"), ("dcpo", "rlcr"), ("dcpo_paper", "dcpo"), ("dcpo_paper", "grpo")):
        entry = against.get(ref, {}).get(arm)
        if entry is not None:
            secondary[(arm, ref)] = entry
    return {"primary": primary, "finals": finals, "secondary": secondary}


def _final_differences(records: list[dict], arm: str, ref: str, key: str) -> list[float]:
    final = {(r["arm"], r["seed"]): r["history"][-1][key] for r in records}
    return [final[(arm, s)] - final[(ref, s)] for (a, s) in final if a == arm and (ref, s) in final]


def _num(value: float) -> str:
    return f"{value:.3f}" if np.isfinite(value) else "n/a"


def _direction_words(direction: int) -> str:
    return {-1: "below 0", 1: "above 0", 0: "two-sided"}[direction]


def findings(result: dict, records: list[dict]) -> list[str]:
    """The page's sentences: each primary reading with its interval (no stronger than it), accuracy kept or not,
    and this study's GRPO and RLCR runs beside the RLCR study's (docs/results/rlcr_results.json)."""
    from calibrl.testbed.report import format_interval

    out = []
    for e in result["primary"]:
        if e.get("missing"):
            continue
        what = f"`{e['arm']}` minus `{e['ref']}`, {NAMES[e['key']]} at matched accuracy"
        mean, low, high = e["interval"]
        if e["reading"].startswith("not resolvable at this scale"):
            out.append(f"{what}: {format_interval(e['interval'])}, not resolvable at this scale (the data do not "
                       f"exclude differences from {low:+.3f} to {high:+.3f}).")
        else:
            out.append(f"{what}: {format_interval(e['interval'])}, {e['reading']} (protocol's reading, "
                       f"{e['seeds']} seeds).")
    for (arm, ref), (interval, _, n) in result["finals"].items():
        mean, low, high = interval
        side = ("lower" if high < 0 else "higher" if low > 0 else "not resolved") if np.isfinite(low) else "one seed"
        out.append(f"Final expected accuracy, `{arm}` minus `{ref}`: {format_interval(interval)} ({n} seeds; "
                   f"{side}).")
    final = {(r["arm"], r["seed"]): r["history"][-1] for r in records}
    start = records[0]["history"][0]["expected_accuracy"]

    def per_seed(arm: str, key: str) -> str:
        return ", ".join(f"{final[(arm, s)][key]:.3f}" for s in sorted(s for a, s in final if a == arm))

    if any(a == "dcpo" for a, _ in final):
        out.append(f"`dcpo`'s final stated AUROC per seed: {per_seed('dcpo', 'stated_auroc')} (`grpo`: "
                   f"{per_seed('grpo', 'stated_auroc')}; `rlcr`: {per_seed('rlcr', 'stated_auroc')}). With the "
                   "code's assignment the stated digit sits after DCPO's split and is trained by the accuracy "
                   "advantage on this format, as under GRPO (protocol, worked out before the runs).")
    if any(a == "dcpo_paper" for a, _ in final):
        ends = [final[k]["expected_accuracy"] for k in final if k[0] == "dcpo_paper"]
        if max(ends) < start:
            out.append(f"`dcpo_paper` (the paper's assignment: the answer digit after the split, trained by the "
                       f"calibration advantage) ends below the warm start's expected accuracy ({start:.3f}) in "
                       f"every seed ({per_seed('dcpo_paper', 'expected_accuracy')}; stated AUROC "
                       f"{per_seed('dcpo_paper', 'stated_auroc')}), so it has no matched reading against any arm.")
    if any(a == "clip_cov" for a, _ in final):
        out.append(f"`clip_cov`'s share of completions stating a confidence at the end, per seed: "
                   f"{per_seed('clip_cov', 'stated_fraction')} (`grpo`: {per_seed('grpo', 'stated_fraction')}); "
                   f"its per-token entropy {per_seed('clip_cov', 'entropy')} (`grpo`: {per_seed('grpo', 'entropy')}).")
        entropy = next((e for e in result["primary"] if e["arm"] == "clip_cov" and e["key"] == "entropy"
                        and not e.get("missing")), None)
        if entropy is not None:
            arm_shares = ", ".join(f"{a:.3f}" for a, _ in entropy["stated_fraction"])
            ref_shares = ", ".join(f"{b:.3f}" for _, b in entropy["stated_fraction"])
            out.append(f"The per-token entropy endpoint compares completions of different formats: at the matched "
                       f"readings `clip_cov` states a confidence in {arm_shares} of its completions (per seed), "
                       f"`grpo` in {ref_shares}, and a completion without the statement has fewer, other tokens. "
                       "The runs record no count of the tokens Clip-Cov detached (the protocol's arithmetic, about "
                       "one per step at this ratio, was worked out before the runs, not measured).")
    rlcr_file = Path(__file__).resolve().parents[1] / "docs" / "results" / "rlcr_results.json"
    if rlcr_file.exists():
        earlier = json.loads(rlcr_file.read_text())["results"]
        parts = []
        for arm in ("grpo", "rlcr"):
            here = [r["history"][-1]["stated_auroc"] for r in records if r["arm"] == arm and r["steps"] == 800]
            before = [h[-1]["stated_auroc"] for h in earlier.get(arm, {}).values()]
            if here and before:
                parts.append(f"`{arm}` {np.mean(here):.3f} ± {np.std(here):.3f} here, {np.mean(before):.3f} ± "
                             f"{np.std(before):.3f} in the RLCR study")
        if parts:
            out.append("Consistency with the RLCR study (same arms, seeds and budget, run on 2026-11-26): final "
                       "stated AUROC " + "; ".join(parts) + ".")
    return out


def page(records: list[dict]) -> str:
    """docs/results/newer_methods.md, written whole from the run records."""
    from calibrl.testbed.report import format_interval

    result = analyse(records)
    arms_run = [a for a in ARMS if any(r["arm"] == a for r in records)]
    by_arm = {a: {r["seed"]: r["history"] for r in records if r["arm"] == a} for a in arms_run}
    steps = sorted({r["steps"] for r in records})
    every = sorted({r["eval_every"] for r in records})
    lines = [
        "# DCPO and Clip-Cov against GRPO and RLCR on the testbed's stated-confidence task",
        "",
        "Data: `docs/results/newer_methods/` (one file per run: every evaluation, the arm's settings, its UTC start "
        "and end). This page is written whole by `python -m studies.newer_methods report` from those files and "
        "checked by `python -m studies.reproduce --only newer_methods`. Protocol, written and committed before the "
        "runs: [../protocols/newer_methods_testbed.md](../protocols/newer_methods_testbed.md).",
        "",
        "Command: `python -m studies.newer_methods run --workers 2` (two runs at a time, one torch thread each, on a "
        "shared 2-core machine), then `python -m studies.newer_methods report`.",
        "",
        f"Task `testbed/verbalized` (completions `ss;A:k`, stated confidence k/10, true success probability known), "
        f"one SFT warm start, {', '.join(map(str, steps))} steps of 16 prompts x 8 samples per run, T = 1, lr 3e-4, "
        f"beta 0; evaluation every {', '.join(map(str, every))} steps on 128 held-out `test` prompts x 8 samples, outcomes drawn once with a "
        "fixed seed. Arms: `grpo` and `rlcr` (the RLCR study's), `dcpo` (the authors' code's assignment, gamma 0.5, "
        "weight 0.5), `clip_cov` (GRPO with verl 0.9.1's Clip-Cov defaults: ratio 2e-4, covariance bounds (1, 5), "
        "clip 0.2), `dcpo_paper` (secondary: the paper's assignment).",
        "",
        "## Scope",
        "",
        "The built-in testbed: a 0.2M-parameter character-level Llama trained on the CPU, not a pretrained language "
        "model; one synthetic task whose completions are 7 characters; 3 seeds per arm; one warm start. The "
        "learning rate (3e-4), batch and budget are the RLCR study's, which chose the learning rate after one "
        "100-step look whose records were not kept, possibly with these test prompts in view (the protocol says "
        "so); nothing was chosen from this study's runs. With 3 seeds an interval that contains 0 leaves "
        "differences of the size the papers report undecided: it reads \"not resolvable at this scale\", not \"no "
        "difference\".",
        "",
        "## Primary endpoints: paired differences at matched expected accuracy",
        "",
        "Per seed, the arm and the reference are read at the lower of their two final expected accuracies (the run "
        "that went further on its own curve there); arm minus reference, mean [95% t-interval over seeds, 2 degrees "
        "of freedom]. Readings as fixed in the protocol: reproduced / refuted when the interval excludes 0 in / "
        "against the paper's direction, otherwise not resolvable at this scale.",
        "",
        "| # | difference | matched accuracy | seeds | mean [95% t-interval] | p | paper's direction | reading |",
        "|---:|---|---:|---:|---:|---:|---|---|",
    ]
    for i, e in enumerate(result["primary"], 1):
        label = f"`{e['arm']}` - `{e['ref']}`, {NAMES[e['key']]}"
        if e.get("missing"):
            lines.append(f"| {i} | {label} | | 0 | n/a | | {_direction_words(e['direction'])} | not run |")
            continue
        lines.append(f"| {i} | {label} | {_num(e['accuracy'])} | {e['seeds']} | {format_interval(e['interval'])} | "
                     f"{_num(e['p'])} | {_direction_words(e['direction'])} | {e['reading']} |")
    lines += ["", "## Secondary", "", "Final expected accuracy, arm minus reference at the end of training "
              "(paired by seed):", "", "| difference | seeds | mean [95% t-interval] | p |", "|---|---:|---:|---:|"]
    named = {("dcpo", "grpo"), ("clip_cov", "grpo"), ("dcpo_paper", "dcpo")}  # the protocol's secondary list
    for (arm, ref), (interval, p, n) in result["finals"].items():
        extra = "" if (arm, ref) in named else " (extra: not named by the protocol)"
        lines.append(f"| `{arm}` - `{ref}`{extra} | {n} | {format_interval(interval)} | {_num(p)} |")
    lines += ["", "Other stated-confidence differences at matched accuracy (same rule as the primary table):", "",
              "| difference | matched accuracy | " + " | ".join(NAMES[k] for k in
                                                            ("stated_ece", "stated_auroc", "stated_calib_err",
                                                             "brier", "entropy", "seq_auroc")) + " |",
              "|---|---:|" + "---:|" * 6]
    for (arm, ref), entry in result["secondary"].items():
        if not np.isfinite(entry["accuracy"]):  # the protocol's amendment: no level both reach
            lines.append(f"| `{arm}` - `{ref}` | no matched reading | " + " | ".join(
                ["no matched reading: `" + arm + "` ends below the warm start in every seed"] + [""] * 5) + " |")
            continue
        cells = [format_interval(entry[k]) for k in ("stated_ece", "stated_auroc", "stated_calib_err", "brier",
                                                        "entropy", "seq_auroc")]
        lines.append(f"| `{arm}` - `{ref}` | {_num(entry['accuracy'])} | " + " | ".join(cells) + " |")
    metrics = rlcr.METRICS + ("entropy", "auroc_ceiling")
    titles = rlcr.TITLES + ("per-token entropy", "AUROC ceiling")
    matched = rlcr.MATCHED + (("entropy", "per-token entropy"),)
    lines += ["", "## Each arm's last evaluation and readings at two accuracy levels", "",
              "Mean ± std over seeds (the RLCR study's tables, `studies/rlcr.py`); a seed whose completions almost "
              "never state a confidence (under 1%) is left out of its arm's stated figures (ECE, AUROC, mean "
              "abs(stated - true p), Brier), the seeds kept said as \"(k of n seeds)\"; an arm with no such seed "
              "left has them in parentheses. The levels of the second table are "
              "those every run of the primary arms reaches (`dcpo_paper` is left out of it: see the amendment of "
              "the protocol).", "",
              rlcr.tables(by_arm, metrics=metrics, titles=titles, matched=matched,
                          matched_arms=tuple(a for a in PRIMARY if a in by_arm))]
    lines += ["", "## What this shows", ""] + [f"- {sentence}" for sentence in findings(result, records)]
    lines += ["", "## Runs", "", "| arm | seed | started (UTC) | finished (UTC) | seconds |", "|---|---:|---|---|---:|"]
    for r in records:
        lines.append(f"| {r['arm']} | {r['seed']} | {r['started_utc']} | {r['finished_utc']} | {r['seconds']:.0f} |")
    missing = [f"{a}/{s}" for a in ARMS for s in range(3) if not any(r["arm"] == a and r["seed"] == s
                                                                      for r in records)]
    if missing:
        lines += ["", f"Not run: {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def report(args) -> None:
    from calibrl._files import write_then_rename

    records = load(Path(args.out))
    if not records:
        sys.exit(f"{args.out}: no run records (*_seed*.json)")
    write_then_rename(args.page, page(records))
    print(f"written {args.page} from {len(records)} runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train the arms (skips runs whose file exists)")
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--seeds", type=int, default=3)
    r.add_argument("--steps", type=int, default=800)
    r.add_argument("--eval-every", type=int, default=100)
    r.add_argument("--lr", type=float, default=3e-4)
    r.add_argument("--arms", default=",".join(ARMS))
    r.add_argument("--out", default=str(OUT))
    p = sub.add_parser("report", help="write the results page from the run files")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--page", default="docs/results/newer_methods.md")
    args = parser.parse_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
