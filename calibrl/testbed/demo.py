"""The built-in demo: one warm start per task, then every method trained from it with the same seeds.

Two comparisons on the testbed (:mod:`calibrl.testbed.tasks`), every run going through
:class:`calibrl.trl.CalibratedGRPOTrainer` with the same budget (steps x 16 prompts x 8 samples, T = 1, AdamW
lr 1e-4, beta 0):

* sequence confidence (``stochastic_reasoning``): GRPO vs CAPO (arXiv 2604.12632) vs CAPO + reference-perplexity
  mask, with GCPO (arXiv 2605.21801, our reading) and SEED-GRPO (arXiv 2505.12346) beside them. Measure: AUROC of
  the mean token log-prob against correctness (pooled and per prompt), ECE of the sequence probability, accuracy.
* decisions (``decision``): the SFT warm start vs GRPO vs decision-token calibration (arXiv 2601.13284: GRPO with
  the decision token's advantage zeroed plus lambda x CE towards one-hot-if-right / uniform-if-wrong), with GCPO
  and SEED-GRPO beside them. Measure: ECE of the decision-token probability (equal-count bins, as the paper),
  the noise-free calibration error mean |q(Y|x) - p(x)|, AUROC of the sequence confidence, accuracy.

Evaluation (before training and every ``eval_every`` steps) samples ``eval_samples`` completions at T = 1 for
``eval_prompts`` held-out prompts, scores them exactly (:func:`calibrl.testbed.warmstart.sample_completions`) and draws
their outcomes from the true distribution with a FIXED stream (common random numbers across methods and steps).
``auroc_ceiling`` is the AUROC of the true success probability on the same samples: no confidence can beat it.

Methods run in worker processes (one torch thread each, ``workers`` of them at once).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

SEQ_TASK = "stochastic_reasoning"
DEC_TASK = "decision"
ADD_TASK = "addition"


@dataclass(frozen=True)
class MethodSpec:
    """One method of the demo: its task, the CalibratedGRPOConfig fields it sets, and whether it trains."""

    name: str
    task: str
    label: str
    config: dict = field(default_factory=dict)
    train: bool = True


def method_specs(*, capo_tau: float = 0.6, decision_coef: float = 1.0, seed_alpha: float | None = None
                 ) -> dict[str, MethodSpec]:
    """The demo's methods, keyed ``<task>/<method>``."""
    seed_params = {} if seed_alpha is None else {"advantage_params": {"alpha": seed_alpha}}
    specs = [
        MethodSpec("grpo", SEQ_TASK, "GRPO", {"advantage_estimator": "grpo"}),
        MethodSpec("capo", SEQ_TASK, f"CAPO (tau {capo_tau})", {"advantage_estimator": "capo", "capo_tau": capo_tau}),
        MethodSpec("capo_mask", SEQ_TASK, f"CAPO + mask (tau {capo_tau})",
                   {"advantage_estimator": "capo", "capo_tau": capo_tau, "capo_mask": "quantile"}),
        MethodSpec("gcpo", SEQ_TASK, "GCPO", {"advantage_estimator": "gcpo"}),
        # tau 0.2: a second CAPO setting chosen after seeing tau 0.6 on this task (not in the default demo)
        MethodSpec("capo_tau0.2", SEQ_TASK, "CAPO (tau 0.2)", {"advantage_estimator": "capo", "capo_tau": 0.2}),
        MethodSpec("capo_mask_tau0.2", SEQ_TASK, "CAPO + mask (tau 0.2)",
                   {"advantage_estimator": "capo", "capo_tau": 0.2, "capo_mask": "quantile"}),
        MethodSpec("seed_grpo", SEQ_TASK, "SEED-GRPO", {"advantage_estimator": "seed_grpo", **seed_params}),
        MethodSpec("sft", DEC_TASK, "SFT (warm start)", {}, train=False),
        MethodSpec("grpo", DEC_TASK, "GRPO", {"advantage_estimator": "grpo"}),
        MethodSpec("decision", DEC_TASK, f"GRPO + decision CE (lambda {decision_coef:g})",
                   {"advantage_estimator": "grpo", "decision_classes": ["Y", "N"],
                    "decision_loss_coef": decision_coef, "decision_zero_advantage": True}),
        MethodSpec("gcpo", DEC_TASK, "GCPO", {"advantage_estimator": "gcpo"}),
        MethodSpec("seed_grpo", DEC_TASK, "SEED-GRPO", {"advantage_estimator": "seed_grpo", **seed_params}),
        # deterministic control (not in the default demo): RL should help calibration here
        MethodSpec("grpo", ADD_TASK, "GRPO", {"advantage_estimator": "grpo"}),
        MethodSpec("capo", ADD_TASK, f"CAPO (tau {capo_tau})", {"advantage_estimator": "capo", "capo_tau": capo_tau}),
    ]
    return {f"{s.task}/{s.name}": s for s in specs}


DEFAULT_METHODS = ("stochastic_reasoning/grpo", "stochastic_reasoning/capo", "stochastic_reasoning/capo_mask",
                   "stochastic_reasoning/gcpo", "stochastic_reasoning/seed_grpo", "decision/sft", "decision/grpo",
                   "decision/decision", "decision/gcpo", "decision/seed_grpo")
CONTROL_METHODS = ("addition/grpo", "addition/capo")
QUICK_METHODS = ("stochastic_reasoning/grpo", "stochastic_reasoning/capo", "decision/sft", "decision/grpo",
                 "decision/decision")


@dataclass
class DemoConfig:
    """Budget and hyperparameters shared by every method (same for all: the comparison is fair by construction)."""

    steps: int = 200
    eval_every: int = 25
    eval_prompts: int = 128
    eval_samples: int = 8
    prompts_per_step: int = 16
    num_generations: int = 8
    learning_rate: float = 1e-4
    capo_tau: float = 0.6
    decision_coef: float = 1.0
    seeds: tuple[int, ...] = (0,)
    workers: int = 2
    methods: tuple[str, ...] = DEFAULT_METHODS  # keys of method_specs()
    warmstart_steps: int = 1500
    warmstart_target: float | None = None  # None: per-task default
    quick: bool = False

    @classmethod
    def quick_config(cls, **overrides) -> "DemoConfig":
        base = dict(steps=10, eval_every=5, eval_prompts=48, eval_samples=8, methods=QUICK_METHODS,
                    warmstart_steps=400, warmstart_target=0.9, quick=True)
        base.update(overrides)
        return cls(**base)


# ----------------------------------------------------------------------------------------------------------
# evaluation


def evaluate(model, tokenizer, task: str, prompts: list[str], p_true: list[float] | None = None, *,
             n: int = 8, seed: int = 1234) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Sample ``n`` completions per prompt and compute the demo's metrics.

    Returns ``(metrics, samples)``; ``samples`` holds per-completion arrays (confidences, drawn outcomes, true
    success probabilities) for reliability diagrams. Outcomes are drawn from the true distribution with a stream
    seeded by ``seed`` (common random numbers: the same uniforms for every method and step).
    """
    from calibrl import metrics as M
    from calibrl.testbed import tasks as tb
    from calibrl.testbed.warmstart import sample_completions

    spec = tb.get_task(task)
    class_ids = None
    if spec.classes:
        class_ids = [tokenizer.convert_tokens_to_ids(c) for c in spec.classes]
    res = sample_completions(model, tokenizer, prompts, n=n, max_new_tokens=spec.max_completion_length,
                             class_token_ids=class_ids, seed=seed)
    q = np.array([tb.true_success_probability(task, p, c) for p, c in zip(res["prompt"], res["completion"])])
    parsed = [tb.parse(task, p, c) for p, c in zip(res["prompt"], res["completion"])]
    reasoning_ok = np.array([x["reasoning_ok"] for x in parsed], dtype=bool)
    u = np.random.default_rng(seed).random(len(q))
    correct = u < q
    lpm = res["logprob_mean"]
    seq_prob = np.exp(lpm * res["n_tokens"])  # probability of the whole completion
    pid = res["prompt_index"]
    pp = M.per_prompt_auroc(lpm, correct, pid)
    out: dict[str, float] = {
        "accuracy": float(correct.mean()),
        "expected_accuracy": float(q.mean()),
        "reasoning_accuracy": float(reasoning_ok.mean()),
        "auroc": float(M.auroc(lpm, correct)),
        "auroc_per_prompt": float(pp[0]),
        "auroc_ceiling": float(M.auroc(q, correct)),
        "seq_ece": float(M.ece(seq_prob, correct, n_bins=10, strategy="uniform")),
        "mean_confidence": float(np.exp(lpm).mean()),
    }
    samples = {"prompt_index": pid, "logprob_mean": lpm, "seq_prob": seq_prob, "correct": correct, "q_true": q}
    if spec.classes:
        cp = res["class_probs"]  # [M, 2]: (Y, N)
        has = ~np.isnan(cp[:, 0])
        choice = np.array([x["choice"] for x in parsed], dtype=object)
        chosen = np.where(choice == spec.classes[0], 0, 1)
        conf = np.where(has, cp[np.arange(len(cp)), chosen], np.nan)
        ok = has & reasoning_ok
        p_y = np.array([tb.DECISION_P[tb._digit_sum(p) % 8] for p in res["prompt"]])
        d_conf, d_corr = conf[has], correct[has]
        out.update({
            "dec_ece": float(M.ece(d_conf, d_corr, n_bins=10, strategy="quantile")) if has.any() else math.nan,
            "dec_ece_uniform": float(M.ece(d_conf, d_corr, n_bins=10, strategy="uniform")) if has.any() else math.nan,
            "dec_auroc": float(M.auroc(d_conf, d_corr)) if has.any() else math.nan,
            "calib_err": float(np.abs(cp[ok, 0] - p_y[ok]).mean()) if ok.any() else math.nan,
            "frac_conf_99": float((d_conf > 0.99).mean()) if has.any() else math.nan,
            "dec_conf_mean": float(d_conf.mean()) if has.any() else math.nan,
            # accuracy of deciding by argmax q instead of sampling (sampling a calibrated decision costs accuracy)
            "greedy_decision_accuracy": greedy_decision_accuracy(cp[:, 0], p_y, q),
        })
        samples.update({"dec_conf": conf, "p_yes": cp[:, 0], "p_true_yes": p_y})
        out["ece"] = out["dec_ece"]
    else:
        out["ece"] = out["seq_ece"]
    return out, samples


def greedy_decision_accuracy(p_yes: np.ndarray, p_true_yes: np.ndarray, q_true: np.ndarray) -> float:
    """Expected accuracy when each sampled completion's decision is replaced by argmax q (Y iff q(Y) >= 0.5):
    samples with a wrong sum or no decision (q_true == 0) count as wrong."""
    ok = (q_true > 0) & np.isfinite(p_yes)
    acc = np.where(p_yes >= 0.5, p_true_yes, 1.0 - p_true_yes)
    return float(np.where(ok, acc, 0.0).mean())


def eval_prompts_for(task: str, n: int) -> list[str]:
    from calibrl.testbed import tasks as tb

    return [r["prompt"] for r in tb.build_rows(task, n, split="test", seed=0)]


# ----------------------------------------------------------------------------------------------------------
# one training run (runs in a worker process)


def _set_threads() -> None:
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


def run_method(job: dict, progress: Callable[[dict], None] | None = None) -> dict:
    """Train one method from its warm start and evaluate it periodically. ``job`` keys: key, task, method,
    label, config (CalibratedGRPOConfig fields), train, seed, warm_path, run_dir and the DemoConfig fields.

    Writes ``history.json`` and ``final_samples.npz`` to ``run_dir``; returns the history record.
    """
    from calibrl.testbed.warmstart import one_torch_thread

    with one_torch_thread():
        return _run_method(job, progress)


def _run_method(job: dict, progress: Callable[[dict], None] | None = None) -> dict:
    import logging
    import warnings

    import torch
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging

    from calibrl.testbed import tasks as tb
    from calibrl.testbed.warmstart import load_warm_start

    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("trl").setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
    except Exception:  # pragma: no cover
        pass

    t0 = time.perf_counter()
    run_dir = Path(job["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    task = job["task"]
    model, tokenizer = load_warm_start(job["warm_path"])
    prompts = eval_prompts_for(task, job["eval_prompts"])
    history: list[dict] = []
    last_samples: dict = {}

    def do_eval(step: int) -> None:
        was = model.training
        metrics, samples = evaluate(model, tokenizer, task, prompts, n=job["eval_samples"], seed=10_000)
        model.train(was)
        rec = {"step": step, **metrics, "time": round(time.perf_counter() - t0, 2)}
        history.append(rec)
        last_samples.clear()
        last_samples.update(samples)
        if progress:
            progress({"key": job["key"], "seed": job["seed"], "step": step, "total": job["steps"] if job["train"]
                      else 0, "metrics": metrics})

    torch.manual_seed(job["seed"])
    do_eval(0)
    extra: dict[str, Any] = {}
    if job["train"] and job["steps"] > 0:
        from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

        spec = tb.get_task(task)
        train_ds = tb.build_dataset(task, 2000, split="train", seed=0)
        reward = tb.make_reward(task, seed=job["seed"])
        eval_every = job["eval_every"]
        steps = job["steps"]
        logs: list[dict] = []

        class Eval(TrainerCallback):
            def on_step_end(self, args, state, control, model=None, **kwargs):
                if state.global_step % eval_every == 0 or state.global_step == steps:
                    do_eval(state.global_step)
                elif progress:
                    progress({"key": job["key"], "seed": job["seed"], "step": state.global_step, "total": steps})

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs:
                    logs_copy = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
                    logs_copy["step"] = state.global_step
                    train_logs.append(logs_copy)

        train_logs = logs
        with tempfile.TemporaryDirectory() as tmp:
            n_completions = job["prompts_per_step"] * job["num_generations"]
            cfg = CalibratedGRPOConfig(
                output_dir=tmp, max_steps=steps, per_device_train_batch_size=n_completions,
                num_generations=job["num_generations"], max_completion_length=spec.max_completion_length,
                learning_rate=job["learning_rate"], lr_scheduler_type="constant", warmup_steps=0, beta=0.0,
                temperature=1.0, top_k=0, top_p=1.0, logging_steps=max(1, eval_every), report_to="none",
                save_strategy="no", use_cpu=True, seed=job["seed"], data_seed=job["seed"], bf16=False,
                disable_tqdm=True, weight_decay=0.0, max_grad_norm=1.0, dataloader_num_workers=0,
                **job["config"],
            )
            trainer = CalibratedGRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=train_ds,
                                            processing_class=tokenizer, callbacks=[Eval()])
            from transformers.trainer_callback import PrinterCallback, ProgressCallback

            trainer.remove_callback(PrinterCallback)  # the demo shows its own progress
            trainer.remove_callback(ProgressCallback)
            trainer.train()
        extra["train_logs"] = logs
    record = {"key": job["key"], "task": task, "method": job["method"], "label": job["label"], "seed": job["seed"],
              "config": job["config"], "run_dir": str(run_dir), "history": history, "seconds": round(time.perf_counter() - t0, 1), **extra}
    (run_dir / "history.json").write_text(json.dumps(record, indent=1, default=float))
    np.savez_compressed(run_dir / "final_samples.npz", **{k: np.asarray(v) for k, v in last_samples.items()})
    return record


def _worker(job: dict, queue) -> dict:
    def progress(msg: dict) -> None:
        if queue is not None:
            queue.put(msg)

    try:
        return run_method(job, progress)
    except Exception as exc:  # surface the error in the parent with the traceback text
        import traceback

        raise RuntimeError(f"{job['key']} seed {job['seed']} failed:\n{traceback.format_exc()}") from exc


# ----------------------------------------------------------------------------------------------------------
# orchestration


def build_jobs(config: DemoConfig, runs_dir: Path, warm_paths: dict[str, str]) -> list[dict]:
    specs = method_specs(capo_tau=config.capo_tau, decision_coef=config.decision_coef)
    keys = list(config.methods)
    unknown = [k for k in keys if k not in specs]
    if unknown:
        raise ValueError(f"unknown demo method(s) {unknown}; choose from {list(specs)}")
    jobs = []
    shared = {k: getattr(config, k) for k in ("steps", "eval_every", "eval_prompts", "eval_samples",
                                              "prompts_per_step", "num_generations", "learning_rate")}
    for seed in config.seeds:
        for key in keys:
            s = specs[key]
            jobs.append({**shared, "key": key, "task": s.task, "method": s.name, "label": s.label,
                         "config": dict(s.config), "train": s.train, "seed": seed,
                         "steps": config.steps if s.train else 0,
                         "warm_path": warm_paths[s.task], "run_dir": str(runs_dir / s.task / s.name / f"seed{seed}")})
    # longest first: trained runs before the evaluation-only SFT row
    jobs.sort(key=lambda j: (not j["train"],))
    return jobs


def prepare_warm_starts(config: DemoConfig, tasks: list[str], log: Callable[[str], None] | None = None
                        ) -> dict[str, str]:
    from calibrl.testbed.warmstart import WarmStartConfig, warm_start

    configs = {task: WarmStartConfig.for_task(task, max_steps=config.warmstart_steps, target=config.warmstart_target)
               for task in tasks}
    from calibrl.testbed.warmstart import cache_path

    missing = [t for t in tasks if not (cache_path(configs[t]) / "warmstart.json").exists()]
    if len(missing) > 1 and config.workers > 1:
        # train the missing warm starts in parallel (one process and one thread each)
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(config.workers, len(missing)),
                                 mp_context=mp.get_context("spawn")) as pool:
            list(pool.map(_warm_worker, [configs[t] for t in missing]))
    return {task: str(warm_start(task, configs[task], log=log)) for task in tasks}


def _warm_worker(ws_config) -> str:
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    _set_threads()
    from calibrl.testbed.warmstart import warm_start

    return str(warm_start(ws_config.task, ws_config))


def run_jobs(jobs: list[dict], *, workers: int = 2, on_progress: Callable[[dict], None] | None = None
             ) -> list[dict]:
    """Run ``jobs`` in ``workers`` spawned processes (in-process when workers <= 1); progress messages are
    forwarded to ``on_progress`` as they arrive."""
    if workers <= 1 or len(jobs) == 1:
        return [run_method(job, on_progress) for job in jobs]
    import multiprocessing as mp
    import queue as queue_mod
    from concurrent.futures import ProcessPoolExecutor, wait, FIRST_COMPLETED

    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    q = manager.Queue()
    results: list[dict] = []
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned workers
    try:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
            pending = {pool.submit(_worker, job, q) for job in jobs}
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                while True:
                    try:
                        msg = q.get_nowait()
                    except queue_mod.Empty:
                        break
                    if on_progress:
                        on_progress(msg)
                for fut in done:
                    results.append(fut.result())
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
        manager.shutdown()
    return results


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


__all__ = ["DemoConfig", "MethodSpec", "evaluate", "method_specs", "run_demo", "run_jobs", "run_method"]
