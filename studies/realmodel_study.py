"""A real-model training study on the CPU: LoRA GRPO vs CAPO (tau 0.6, with and without the frozen reference-
perplexity mask) vs GRPO + decision-token cross-entropy, from the same start (SmolLM2-135M-Instruct, the
built-in real model), with equal budgets.

Task, model, LoRA and evaluation: :mod:`calibrl.testbed.realmodel` (``multiple_choice`` levels 1-2, letter
answers, reward ``decision``; LoRA r 16 on the attention projections; held-out evaluation by
:class:`calibrl.trl.callbacks.CalibrationEvalCallback` at the start and every EVAL_EVERY steps, the same sampling
seed each time). Every method: the same start, PROMPTS x GENERATIONS completions of at most TOKENS tokens per step,
AdamW lr LR constant, T = 1, beta 0, STEPS steps, one torch thread (``--threads``).

All settings are fixed before the runs (nothing here is tuned on the evaluation prompts). Usage::

    python -m studies.realmodel_study --out runs/realmodel_study            # all methods, one after the other
    python -m studies.realmodel_study --out runs/realmodel_study --report-only

Each method takes 30-60 minutes on one core (36 steps of 50-100 s, 7 evaluations) and peaks at 2.4 GB of memory
(the first runs peaked near 9 GB, before TRL's loss pass was checkpointed): on 2 cores run two methods at a time,
each in its own process (``--methods grpo`` and ``--methods capo_mask``, ``OMP_NUM_THREADS=1``).

Each method's run writes ``<out>/<method>/calibration_eval.json``, ``evaluation_samples.json`` and
``trainer_log.json``; a method whose file says it finished is skipped on a rerun. ``--pack`` also writes each
finished run's records into ``docs/results/realmodel_study/<method>_seed<s>.json.gz`` (the study's committed data:
settings, every evaluation with its per-sample arrays, the trainer's log), from which ``python -m studies.reproduce
--only realmodel`` rebuilds docs/results/realmodel.md's tables and ``realmodel_study.png``.

Within a method, a checkpoint is saved at every evaluation point (the LoRA adapter, optimizer, scheduler, RNG
states and step; the newest kept), and a rerun of the same command resumes an interrupted method from its newest
complete checkpoint, with the records an uninterrupted run gives (:func:`calibrl.testbed.realmodel.train_real_model`,
``checkpoints=True``). The report (``<out>/report.md``, ``<out>/trajectories.png``) is rebuilt from those files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from calibrl.testbed.realmodel import (REAL_MODEL_LABELS, REAL_MODEL_METHODS, RealModelRunConfig, evaluation_error_bars,
                                       plot_runs, records_table, train_real_model, with_samples, write_json_gz)
from studies.realmodel_analysis import EVALUATION_METRICS, matched_accuracy_table, training_table

DONE = "finished"
ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "results" / "realmodel_study"  # the committed data: one <method>_seed<s>.json.gz per run
TITLE = "SmolLM2-135M-Instruct with LoRA: multiple-choice, held-out prompts"


def load_run_folders(out: Path, methods: list[str]) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """The runs under ``out`` (one folder per method) as (label -> held-out evaluation records with their
    per-sample arrays, label -> the trainer's log_history); a method without records comes back empty."""
    runs, logs = {}, {}
    for method in methods:
        path = out / method / "calibration_eval.json"
        runs[REAL_MODEL_LABELS[method]] = (with_samples(json.loads(path.read_text())["records"], out / method)
                                           if path.exists() else [])
        log = out / method / "trainer_log.json"
        if log.exists():
            logs[REAL_MODEL_LABELS[method]] = json.loads(log.read_text())["log_history"]
    return runs, logs


# the metrics of the paired differences (studies.realmodel_analysis.EVALUATION_METRICS) and their column titles
CHANGE_METRICS = (("accuracy", "Δ accuracy"), ("auroc", "Δ AUROC of mean log-prob"), ("ece", "Δ ECE"),
                  ("confidence_mean", "Δ mean confidence"), ("decision_ece", "Δ decision-letter ECE"))


def difference_table(pairs: list[tuple[str, dict, dict]], *, n_boot: int = 2000, seed: int = 0) -> str:
    """Markdown: for each ``(row label, evaluation a, evaluation b)`` (records with their per-sample arrays, the
    same prompts) the difference a - b of every :data:`CHANGE_METRICS` metric with its 95% paired prompt-bootstrap
    interval (:func:`calibrl.metrics.paired.paired_bootstrap_difference`, ``n_boot`` replicates, prompts drawn once
    for both evaluations); pairs without samples are left out."""
    from calibrl.metrics.paired import paired_bootstrap_difference

    lines = ["| | " + " | ".join(title for _, title in CHANGE_METRICS) + " |",
             "|---|" + "---:|" * len(CHANGE_METRICS)]
    for label, a, b in pairs:
        sa, sb = a.get("samples"), b.get("samples")
        if not (sa and sb):
            continue
        cells = []
        for name, _ in CHANGE_METRICS:
            arrays, score, _, _ = EVALUATION_METRICS[name]
            d = paired_bootstrap_difference(score, arrays(sa), arrays(sb), prompt_ids_a=sa["prompt_id"],
                                            prompt_ids_b=sb["prompt_id"], n_boot=n_boot, seed=seed)
            cells.append(f"{d.point:+.3f} [{d.low:+.3f}, {d.high:+.3f}]")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def change_tables(runs: dict[str, list[dict]]) -> str:
    """Markdown: each method's last evaluation against its start, then against GRPO's last evaluation (the same
    step, not the same accuracy), by :func:`difference_table`."""
    grpo = REAL_MODEL_LABELS["grpo"]
    since_start = [(f"{label}, step {r[-1]['step']} - step {r[0]['step']}", r[-1], r[0])
                   for label, r in runs.items() if len(r) > 1]
    against = [(f"{label} - GRPO, step {r[-1]['step']}", r[-1], runs[grpo][-1])
               for label, r in runs.items() if label != grpo and r and runs.get(grpo)]
    sections = ["## From the start to the last step (paired by prompt, 95% intervals)", "",
                difference_table(since_start)]
    if against:
        sections += ["", "## At the last step, against GRPO's (same step, not the same accuracy; paired by prompt)",
                     "", difference_table(against)]
    return "\n".join(sections)


def tables(runs: dict[str, list[dict]], logs: dict[str, list[dict]]) -> str:
    """Markdown: every evaluation of every method, the methods read against GRPO at matched held-out accuracy,
    the paired changes of :func:`change_tables`, and the trainer's own per-step logs (first and last steps)."""
    sections = ["## Held-out evaluations", "", records_table(runs)]
    if REAL_MODEL_LABELS["grpo"] in runs:
        sections += ["", "## At matched held-out accuracy (against GRPO's own path)", "",
                     matched_accuracy_table(runs, reference=REAL_MODEL_LABELS["grpo"])]
    sections += ["", change_tables(runs)]
    if logs:
        sections += ["", "## Training rollouts (trainer logs)", "", training_table(logs)]
    return "\n".join(sections)


def report(out: Path, methods: list[str]) -> str:
    """:func:`tables` of the runs under ``out``; writes ``trajectories.png``."""
    runs, logs = load_run_folders(out, methods)
    plot_runs(runs, out / "trajectories.png", title=TITLE)
    return tables(runs, logs)


def pack(out: Path, methods: list[str], dest: Path = RECORDS) -> list[Path]:
    """Each finished method's run under ``out`` into ``dest/<method>_seed<s>.json.gz``: its settings
    (``run_config.json``), every held-out evaluation with its per-sample arrays (prompt id, correctness,
    ``logprob_mean``, decision probability), the trainer's log and the UTC start and end of the invocation that
    finished the run. The study's committed data, from which
    :func:`load_packed` and ``studies/reproduce.py`` rebuild its tables and figure. Returns the files written."""
    written = []
    for method in methods:
        folder = out / method
        log = folder / "trainer_log.json"
        if not (log.exists() and json.loads(log.read_text()).get(DONE)):
            continue
        from calibrl.testbed.runner import run_times

        config = json.loads((folder / "run_config.json").read_text())
        finished = json.loads(log.read_text())
        runs, logs = load_run_folders(out, [method])
        label = REAL_MODEL_LABELS[method]
        path = dest / f"{method}_seed{config['seed']}.json.gz"
        doc = {"study": "equal-budget real-model study (docs/results/realmodel.md)", "method": method,
               "seed": config["seed"], "config": config, "records": runs[label], "log_history": logs[label],
               # UTC start and end of the invocation that finished the run (absent in records packed before them)
               **run_times(finished),
               "note": "confidence = exp(logprob_mean); decision_prob null where a completion named no letter"}
        if write_json_gz(path, doc):
            written.append(path)
    return written


def load_packed(dest: Path = RECORDS) -> dict[int, tuple[dict[str, list[dict]], dict[str, list[dict]]]]:
    """The committed data (:func:`pack`) as seed -> (label -> evaluation records, label -> log_history), the
    methods in the order of ``REAL_MODEL_METHODS``."""
    import gzip

    docs = [json.loads(gzip.decompress(f.read_bytes())) for f in sorted(dest.glob("*_seed*.json.gz"))]
    order = list(REAL_MODEL_METHODS)
    out: dict[int, tuple[dict, dict]] = {}
    for doc in sorted(docs, key=lambda d: (d["seed"], order.index(d["method"]))):
        runs, logs = out.setdefault(int(doc["seed"]), ({}, {}))
        runs[REAL_MODEL_LABELS[doc["method"]]] = doc["records"]
        logs[REAL_MODEL_LABELS[doc["method"]]] = doc["log_history"]
    return out


def plot_study(by_seed: dict[int, tuple[dict[str, list[dict]], dict]], path: Path) -> Path:
    """The study's figure: held-out accuracy over training for the first seed (bars: 95% prompt-bootstrap
    intervals), then one panel per seed of each method's (accuracy, AUROC) path in step order, its final
    evaluation drawn larger (intervals of the AUROC differences are in the matched-accuracy tables)."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from calibrl.evaluation.styles import series_style

    seeds = sorted(by_seed)
    fig, axes = plt.subplots(1, 1 + len(seeds), figsize=(4.4 * (1 + len(seeds)), 4.2), squeeze=False)
    axes = axes[0]
    first_runs = by_seed[seeds[0]][0]
    for label, records in first_runs.items():
        style = series_style(label)
        bars = np.array([evaluation_error_bars(r) for r in records])  # [E, 2, 2]: accuracy/AUROC, below/above
        axes[0].errorbar([r["step"] for r in records], [r["accuracy"] for r in records], yerr=bars[:, 0].T,
                         capsize=3, label=label, **style.kwargs())
    axes[0].set(xlabel="training step", ylabel="held-out accuracy (higher is better)",
                title=f"Accuracy over training, seed {seeds[0]}\n(bars: 95% prompt-bootstrap intervals)")
    for ax, seed in zip(axes[1:], seeds):
        for i, (label, records) in enumerate(by_seed[seed][0].items()):
            style = series_style(label)
            acc = [r["accuracy"] for r in records]
            auc = [r["auroc"] if isinstance(r.get("auroc"), (int, float)) else np.nan for r in records]
            ax.plot(acc, auc, label=label, **style.kwargs())
            ax.plot(acc[-1:], auc[-1:], marker=style.marker, markersize=11, color=style.color, linestyle="none")
            if i == 0:  # every method starts from the same evaluation of the same model
                ax.annotate("start", (acc[0], auc[0]), textcoords="offset points", xytext=(5, 4), fontsize=8)
        ax.set(xlabel="held-out accuracy (higher is better)", ylabel="AUROC of mean token log-prob (higher is better)",
               title=f"Seed {seed}: AUROC against accuracy\n(every 6 steps; large marker: the last)")
    for ax in axes:
        ax.grid(alpha=0.3)
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h), labels.append(lab)
    fig.suptitle(TITLE)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def study_text(by_seed: dict[int, tuple[dict[str, list[dict]], dict[str, list[dict]]]]) -> str:
    """:func:`tables` of every seed of the committed data, under one heading per seed (docs/results/realmodel.md
    quotes them)."""
    return "\n\n".join(f"### Seed {seed}\n\n" + tables(*by_seed[seed]).replace("## ", "#### ")
                       for seed in sorted(by_seed))


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
    parser.add_argument("--pack", action="store_true",
                        help="also write each finished method's records into docs/results/realmodel_study/ (the "
                             "study's committed data, rebuilt by studies/reproduce.py --only realmodel)")
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
    if options.pack:
        for path in pack(options.out, methods):
            print(f"packed {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
