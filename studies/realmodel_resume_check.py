"""Does a resumed decision-CE run of the built-in real model equal an uninterrupted one? The powered real-model
study's decision-CE and slow-GRPO runs were resumed from checkpoints (its protocol's amendment 6); this checks that
mechanism with the decision-CE arm's settings on the CPU, at a size the CPU allows.

    python -m studies.realmodel_resume_check [--out runs/resume_check]    # about 20 minutes on 2 cores

Two runs of ``calibrl.testbed.realmodel.train_real_model`` with the study's decision-CE arm (``grpo_decision``,
learning rate 3e-4, LoRA r 16 on ``builtin:smollm2-135m-instruct``), 4 steps with an evaluation every 2: one
uninterrupted, one interrupted after step 3's training log (after checkpoint-2) and resumed by a rerun. Written to
``docs/results/realmodel_powered/resume_check.json``: both runs' evaluation records (metrics and per-sample
arrays), their step-4 training logs, whether each is equal, and each call's UTC start and end. The powered study's
page reads it (``studies/realmodel_powered.py``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "results" / "realmodel_powered" / "resume_check.json"
LOG_KEYS = ("reward", "loss", "grad_norm", "entropy", "calibration/auroc", "calibration/decision_prob_mean")


class _Interrupted(Exception):
    pass


def config():
    from calibrl.testbed.realmodel import RealModelRunConfig

    return RealModelRunConfig(method="grpo_decision", learning_rate=3e-4, steps=4, eval_every=2, prompts_per_step=2,
                              num_generations=4, eval_prompts=8, eval_k=2, threads=2, seed=0)


def _logs(result: dict) -> dict:
    return {str(h["step"]): {k: h.get(k) for k in LOG_KEYS} for h in result["log_history"] if "reward" in h}


def run(out: Path) -> dict:
    from dataclasses import asdict

    from calibrl.testbed.realmodel import train_real_model

    whole = train_real_model(config(), out / "whole")

    def crash(step: int, logs: dict) -> None:
        if step == 3 and "reward" in logs:
            raise _Interrupted

    try:
        train_real_model(config(), out / "cut", on_log=crash, checkpoints=True)
    except _Interrupted:
        pass
    resumed = train_real_model(config(), out / "cut", checkpoints=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return {"config": asdict(config()), "commit": commit, "resumed_from": resumed["resumed_from"],
            "whole": {"started_utc": whole["started_utc"], "finished_utc": whole["finished_utc"],
                      "records": whole["records"], "logs": _logs(whole)},
            "resumed": {"started_utc": resumed["started_utc"], "finished_utc": resumed["finished_utc"],
                        "records": resumed["records"], "logs": _logs(resumed)},
            "records_equal": resumed["records"] == whole["records"],
            "step4_log_equal": _logs(resumed).get("4") == _logs(whole).get("4")}


def summary(record: dict) -> str:
    """One sentence of what the check shows, for the powered study's page."""
    c = record["config"]
    equal = record["records_equal"] and record["step4_log_equal"]
    return (f"Resume check on the CPU ({record['whole']['started_utc']} to {record['resumed']['finished_utc']} UTC, "
            f"`python -m studies.realmodel_resume_check`): a decision-CE run of the real model (the arm's settings, "
            f"{c['steps']} steps, an evaluation every {c['eval_every']}) interrupted after step 3 and resumed from "
            f"step {record['resumed_from']} gave "
            + ("every evaluation's metrics and per-sample arrays and the step-4 training log of the uninterrupted "
               "run, exactly." if equal else
               "records that differ from the uninterrupted run's: "
               + ", ".join(k for k in ("records_equal", "step4_log_equal") if not record[k]) + " false.")
            + " The GPU's kernels were not checked.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/resume_check"))
    args = parser.parse_args(argv)
    record = run(args.out)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(summary(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
