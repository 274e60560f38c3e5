"""A short CPU run of the shipped recipe ``smollm2_cpu_ternary`` (the built-in real model, LoRA, GRPO on TruthRL's
ternary reward, multiple choice with a fifth of the questions unanswerable), its records committed and its page
written from them alone:

    python -m studies.abstention_recipe run        # calibrl train smollm2_cpu_ternary (24 steps, about 20 min on
                                                   # 2 cores), then its records into docs/results/abstention_recipe/
    python -m studies.abstention_recipe page       # docs/results/abstention_recipe.md from those records

A record of what the recipe does at its own length, one seed: not a comparison, and no claim about abstention
training beyond it (docs/abstention.md, "Training a model to decline, by recipe").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path("docs/results/abstention_recipe")
PAGE = Path("docs/results/abstention_recipe.md")
RECIPE = "smollm2_cpu_ternary"
KEPT = ("calibration_eval.json", "log_history.jsonl")
COLUMNS = (("accuracy", "accuracy (declining right on unanswerable)"), ("answer_rate", "answer rate"),
           ("accuracy_answered", "accuracy of the answers"), ("hallucination_rate", "wrong answers among all"),
           ("declined_unanswerable", "declines, unanswerable"), ("declined_answerable", "declines, answerable"),
           ("auroc", "AUROC of the confidence"), ("n_samples", "samples"))


def run(args) -> None:
    from calibrl.testbed.runner import utc_now

    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "calibrl", "train", RECIPE, "--output-dir", str(Path(tmp) / "run")]
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        started = utc_now()
        subprocess.run(command, check=True)
        finished = utc_now()
        out.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            shutil.copyfile(Path(tmp) / "run" / name, out / name)
    record = {"command": f"calibrl train {RECIPE}", "started_utc": started, "finished_utc": finished,
              "commit": commit}
    (out / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"records in {out}; python -m studies.abstention_recipe page writes {PAGE}")


def page(folder: Path = OUT) -> str:
    """The page, from the committed records alone."""
    run_record = json.loads((folder / "run.json").read_text())
    records = json.loads((folder / "calibration_eval.json").read_text())["records"]
    logs = [json.loads(line) for line in (folder / "log_history.jsonl").read_text().splitlines() if line.strip()]
    rewards = [(log["step"], log["reward"]) for log in logs if "reward" in log and "step" in log]
    lines = [
        "# The shipped abstention recipe, run at its own length", "",
        f"Data: `{OUT}/` (the run's held-out evaluations, its training log and its run record). This page is "
        "written whole from them by `python -m studies.abstention_recipe page`, and rebuilt by `python -m "
        "studies.reproduce --only abstention_recipe`.", "",
        f"`{run_record['command']}` (the recipe's 24 steps on the CPU), {run_record['started_utc']} to "
        f"{run_record['finished_utc']}, commit `{run_record['commit'][:7]}`.", "",
        "SmolLM2-135M-Instruct with LoRA, GRPO on TruthRL's ternary reward (+1 right, 0 \"I don't know\", -1 wrong), "
        "`multiple_choice` with a fifth of the questions unanswerable. The held-out evaluation: "
        f"{int(records[0]['n_samples']) // 4} questions x 4 samples at each listed step. One run, one seed: a record "
        "of what the recipe does, not a comparison; no interval is given (the samples of one question are not "
        "independent, and the records keep only the figures).", "",
        "| step | " + " | ".join(title for _, title in COLUMNS) + " |", "|---:|" + "---:|" * len(COLUMNS)]
    for r in records:
        cells = [f"{int(r[key])}" if key == "n_samples" else f"{r[key]:.3f}" for key, _ in COLUMNS]
        lines.append(f"| {r['step']} | " + " | ".join(cells) + " |")
    first = records[0]
    if first["accuracy_answered"] < 0.5:  # what the reward asks of a model this weak
        lines += ["", f"The untrained model's answers are right {first['accuracy_answered']:.3f} of the time at step "
                  f"{first['step']}. Under this reward answering pays only where P(right) > 1/2, so on average "
                  "an answer of this model earns less than declining: declining nearly everything is what the reward "
                  "asks of a model this weak, not by itself a sign of calibration."]
    if rewards:
        lines += ["", f"Mean training reward per step: {rewards[0][1]:+.3f} at step {rewards[0][0]}, "
                  f"{rewards[-1][1]:+.3f} at step {rewards[-1][0]} (each step's 32 completions)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the recipe and keep its records")
    r.add_argument("--out", default=str(OUT))
    p = sub.add_parser("page", help="write the page from the records")
    p.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    if args.command == "run":
        run(args)
    else:
        PAGE.write_text(page(Path(args.out)))
        print(f"written {PAGE}")


if __name__ == "__main__":
    main()
