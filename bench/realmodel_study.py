"""A real-model training study on the CPU: LoRA GRPO vs CAPO (tau 0.6, with and without the frozen reference-
perplexity mask) vs GRPO + decision-token cross-entropy, from the same start (SmolLM2-135M-Instruct, the
built-in real model), with equal budgets.

Task, model, LoRA and evaluation: :mod:`calibrl.testbed.realmodel` (``multiple_choice`` levels 1-2, letter
answers, reward ``decision``; LoRA r 16 on the attention projections; held-out evaluation by
:class:`calibrl.trl.callbacks.CalibrationEvalCallback` at the start and every EVAL_EVERY steps, the same sampling
seed each time). Every method: the same start, PROMPTS x GENERATIONS completions of at most TOKENS tokens per step,
AdamW lr LR constant, T = 1, beta 0, STEPS steps, one torch thread (``--threads``).

All settings are fixed before the runs (nothing here is tuned on the evaluation prompts). Usage::

    python bench/realmodel_study.py --out runs/realmodel_study            # all methods, one after the other
    python bench/realmodel_study.py --out runs/realmodel_study --report-only

Each method takes about 30 minutes on one core (36 steps of about 50 s, 7 evaluations) and up to 9 GB of memory
(the 192-sample evaluation batch): on 24 GB run two methods at a time, each in its own process
(``--methods grpo,capo`` and ``--methods capo_mask,grpo_decision``, ``OMP_NUM_THREADS=1``), not four.

Each method's run writes ``<out>/<method>/calibration_eval.json`` and ``trainer_log.json``; a method whose file
says it finished is skipped on a rerun. Within a method, a checkpoint is saved at every evaluation point (the LoRA
adapter, optimizer, scheduler, RNG states and step; the newest kept), and a rerun of the same command resumes an
interrupted method from its newest complete checkpoint, with the records an uninterrupted run gives
(:func:`calibrl.testbed.realmodel.train_real_model`, ``checkpoints=True``). The report
(``<out>/report.md``, ``<out>/trajectories.png``) is rebuilt from those files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from calibrl.testbed.realmodel import (REAL_MODEL_LABELS, REAL_MODEL_METHODS, RealModelRunConfig,
                                       matched_accuracy_table, plot_runs, records_table, train_real_model,
                                       training_table, with_samples)

DONE = "finished"


def report(out: Path, methods: list[str]) -> str:
    """Markdown: every evaluation of every method, the methods read against GRPO at matched held-out accuracy,
    and the trainer's own per-step logs (first and last steps); writes ``trajectories.png``."""
    runs, logs = {}, {}
    for method in methods:
        path = out / method / "calibration_eval.json"
        runs[REAL_MODEL_LABELS[method]] = (with_samples(json.loads(path.read_text())["records"], out / method)
                                           if path.exists() else [])
        log = out / method / "trainer_log.json"
        if log.exists():
            logs[REAL_MODEL_LABELS[method]] = json.loads(log.read_text())["log_history"]
    plot_runs(runs, out / "trajectories.png",
              title="SmolLM2-135M-Instruct with LoRA: multiple-choice, held-out prompts")
    sections = ["## Held-out evaluations", "", records_table(runs)]
    if REAL_MODEL_LABELS["grpo"] in runs:
        sections += ["", "## At matched held-out accuracy (against GRPO's own path)", "",
                     matched_accuracy_table(runs, reference=REAL_MODEL_LABELS["grpo"])]
    if logs:
        sections += ["", "## Training rollouts (trainer logs)", "", training_table(logs)]
    return "\n".join(sections)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/realmodel_study"))
    parser.add_argument("--methods", default=",".join(REAL_MODEL_METHODS))
    parser.add_argument("--steps", type=int, default=36)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--train-prompts", type=int, default=2000)
    parser.add_argument("--eval-prompts", type=int, default=48)
    parser.add_argument("--eval-k", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=6)
    parser.add_argument("--eval-split", default="validation", help="split of the held-out prompts")
    parser.add_argument("--eval-batch", type=int, default=None,
                        help="prompts per generate batch of an evaluation (default: all at once)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where each run computes: the CPU (default) or one GPU (strict float32 either way)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--on-finish", default=None, metavar="COMMAND",
                        help="a shell command run after each method's run finishes (scripts/realmodel_powered_queue.sh "
                             "commits the raw records with it); its failure is reported, not fatal")
    options = parser.parse_args()
    methods = [m for m in options.methods.split(",") if m]
    unknown = [m for m in methods if m not in REAL_MODEL_METHODS]
    if unknown:
        sys.exit(f"unknown method(s) {unknown}; choose from {', '.join(REAL_MODEL_METHODS)}")
    options.out.mkdir(parents=True, exist_ok=True)
    if not options.report_only:
        for method in methods:
            log = options.out / method / "trainer_log.json"
            if log.exists() and json.loads(log.read_text()).get(DONE):
                print(f"{method}: finished earlier, skipped", flush=True)
                continue
            config = RealModelRunConfig(
                method=method, steps=options.steps, prompts_per_step=options.prompts,
                num_generations=options.generations, max_completion_length=options.tokens, learning_rate=options.lr,
                levels=tuple(options.levels), train_prompts=options.train_prompts, eval_prompts=options.eval_prompts,
                eval_k=options.eval_k, eval_every=options.eval_every, eval_split=options.eval_split,
                eval_batch_prompts=options.eval_batch, seed=options.seed, threads=options.threads,
                device=options.device)
            result = train_real_model(config, options.out / method, checkpoints=True,
                                      print_fn=lambda line: print(line, flush=True))
            since = "" if result["resumed_from"] is None else f" (resumed at step {result['resumed_from']})"
            print(f"{method}: {options.steps} steps in {result['seconds']:.0f} s{since}", flush=True)
            if options.on_finish:
                done = subprocess.run(options.on_finish, shell=True, check=False)
                if done.returncode:
                    print(f"{method}: --on-finish exited {done.returncode}: {options.on_finish}", file=sys.stderr,
                          flush=True)
    text = report(options.out, methods)
    (options.out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
