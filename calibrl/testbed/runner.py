"""Running the demo's methods: one training run per method x seed, in worker processes.

:func:`run_method` trains one method from its warm start with :class:`calibrl.trl.CalibratedGRPOTrainer` and
evaluates it periodically (:func:`calibrl.testbed.evaluate.evaluate`). :func:`build_jobs` turns a
:class:`calibrl.testbed.methods.DemoConfig` into one job per method x seed, :func:`prepare_warm_starts` trains (or
loads from the cache) one warm start per task, and :func:`run_jobs` runs the jobs in spawned worker processes (one
torch thread each, ``workers`` of them at once), forwarding their progress messages.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from calibrl.testbed.evaluate import eval_prompts_for, evaluate
from calibrl.testbed.methods import DemoConfig, method_specs

# ----------------------------------------------------------------------------------------------------------
# one training run (runs in a worker process)


def utc_now() -> str:
    """The current UTC time as ISO 8601 to the second (``2026-11-28T03:04:05Z``): the start and end a study's run
    record carries, so the order of runs against the protocol's commits can be read rather than inferred."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


RUN_TIME_FIELDS = ("started_utc", "finished_utc")


def run_times(record: dict) -> dict[str, str | None]:
    """A run record's UTC start and end (:data:`RUN_TIME_FIELDS`; None in records made before they were kept)."""
    return {k: record.get(k) for k in RUN_TIME_FIELDS}


def _set_threads() -> None:
    """One torch thread (intra- and inter-op) in this process: the workers share the machine's cores."""
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

    t0, started_utc = time.perf_counter(), utc_now()
    run_dir = Path(job["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    task = job["task"]
    model, tokenizer = load_warm_start(job["warm_path"])
    # the main curve's prompts: the test split (the demo), or the eval split (the pre-registered studies, which keep
    # their test prompts for the end); extra sets ({name: (split, n)}) are evaluated beside it and their samples
    # kept for every evaluation
    prompts = eval_prompts_for(task, job["eval_prompts"], split=job.get("eval_split", "test"))
    extra_sets = {name: eval_prompts_for(task, n, split=split)
                  for name, (split, n) in (job.get("eval_sets") or {}).items()}
    history: list[dict] = []
    last_samples: dict = {}
    kept_samples: dict[str, np.ndarray] = {}

    def do_eval(step: int) -> None:
        was = model.training
        metrics, samples = evaluate(model, tokenizer, task, prompts, n=job["eval_samples"], seed=10_000)
        rec = {"step": step, **metrics}
        for name, set_prompts in extra_sets.items():
            set_metrics, set_samples = evaluate(model, tokenizer, task, set_prompts, n=job["eval_samples"],
                                                seed=20_000 + len(name))  # a fixed stream per set name
            rec[name] = set_metrics
            for field in ("prompt_index", "logprob_mean", "correct", "q_true", "dec_conf", "p_yes"):
                if field in set_samples:
                    kept_samples[f"{name}/step{step}/{field}"] = np.asarray(set_samples[field])
        model.train(was)
        rec["time"] = round(time.perf_counter() - t0, 2)
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
            settings = dict(
                output_dir=tmp, max_steps=steps, per_device_train_batch_size=n_completions,
                num_generations=job["num_generations"], max_completion_length=spec.max_completion_length,
                learning_rate=job["learning_rate"], lr_scheduler_type="constant", warmup_steps=0, beta=0.0,
                temperature=1.0, top_k=0, top_p=1.0, logging_steps=max(1, eval_every), report_to="none",
                save_strategy="no", use_cpu=True, seed=job["seed"], data_seed=job["seed"], bf16=False,
                disable_tqdm=True, weight_decay=0.0, max_grad_norm=1.0, dataloader_num_workers=0,
            )
            settings.update(job["config"])  # a method may set its own learning_rate or beta (the study's controls)
            cfg = CalibratedGRPOConfig(**settings)
            trainer = CalibratedGRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=train_ds,
                                            processing_class=tokenizer, callbacks=[Eval()])
            from transformers.trainer_callback import PrinterCallback, ProgressCallback

            trainer.remove_callback(PrinterCallback)  # the demo shows its own progress
            trainer.remove_callback(ProgressCallback)
            trainer.train()
        extra["train_logs"] = logs
    record = {"key": job["key"], "task": task, "method": job["method"], "label": job["label"], "seed": job["seed"],
              "config": job["config"], "run_dir": str(run_dir), "history": history, "seconds": round(time.perf_counter() - t0, 1),
              "started_utc": started_utc, "finished_utc": utc_now(), **extra}
    (run_dir / "history.json").write_text(json.dumps(record, indent=1, default=float))
    np.savez_compressed(run_dir / "final_samples.npz", **{k: np.asarray(v) for k, v in last_samples.items()})
    if kept_samples:
        np.savez_compressed(run_dir / "eval_set_samples.npz", **kept_samples)
    return record


def _worker(job: dict, queue) -> dict:
    """:func:`run_method` in a worker process: progress goes to ``queue``, a failure carries its traceback."""
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
    """One :func:`run_method` job per method x seed of ``config``, each from its task's warm start, with its run
    folder ``runs_dir/<task>/<method>/seed<k>``; trained runs first. Unknown method keys raise ``ValueError``."""
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


def prepare_warm_starts(config: DemoConfig, tasks: list[str], log: Callable[[str], None] | None = None,
                        on_progress: Callable[[dict], None] | None = None) -> dict[str, str]:
    """The warm-start folder of each task (trained once, then cached); missing ones train in parallel when
    ``config.workers`` allows. ``on_progress`` receives the training progress of the missing ones
    (``{"task", "step", "total"[, "note"]}``, see :func:`calibrl.testbed.warmstart.warm_start`)."""
    from calibrl.testbed.warmstart import WarmStartConfig, cache_path, warm_start

    configs = {task: WarmStartConfig.for_task(task, max_steps=config.warmstart_steps, target=config.warmstart_target)
               for task in tasks}
    missing = [t for t in tasks if not (cache_path(configs[t]) / "warmstart.json").exists()]
    if len(missing) > 1 and config.workers > 1:
        # train the missing warm starts in parallel (one process and one thread each)
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("spawn")
        manager = ctx.Manager()
        try:
            queue = manager.Queue()
            with ProcessPoolExecutor(max_workers=min(config.workers, len(missing)), mp_context=ctx) as pool:
                _wait_forwarding({pool.submit(_warm_worker, configs[t], queue) for t in missing}, queue, on_progress)
        finally:
            manager.shutdown()
    return {task: str(warm_start(task, configs[task], log=log, progress=on_progress)) for task in tasks}


def _warm_worker(ws_config, queue=None) -> str:
    """One warm start trained in a worker process (one torch thread); progress messages go to ``queue``."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    _set_threads()
    from calibrl.testbed.warmstart import warm_start

    return str(warm_start(ws_config.task, ws_config, progress=queue.put if queue is not None else None))


def _wait_forwarding(pending: set, queue, on_progress: Callable[[dict], None] | None) -> list:
    """Wait for the futures in ``pending``, forwarding the messages arriving on ``queue`` to ``on_progress``
    meanwhile; returns their results in completion order (a failed one raises)."""
    import queue as queue_mod
    from concurrent.futures import FIRST_COMPLETED, wait

    results = []
    while pending:
        done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
        while True:
            try:
                msg = queue.get_nowait()
            except queue_mod.Empty:
                break
            if on_progress:
                on_progress(msg)
        results += [fut.result() for fut in done]
    return results


def run_jobs(jobs: list[dict], *, workers: int = 2, on_progress: Callable[[dict], None] | None = None
             ) -> list[dict]:
    """Run ``jobs`` in ``workers`` spawned processes (in-process when workers <= 1); progress messages are
    forwarded to ``on_progress`` as they arrive."""
    if workers <= 1 or len(jobs) == 1:
        return [run_method(job, on_progress) for job in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    q = manager.Queue()
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned workers
    try:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
            results = _wait_forwarding({pool.submit(_worker, job, q) for job in jobs}, q, on_progress)
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
        manager.shutdown()
    return results


__all__ = ["build_jobs", "prepare_warm_starts", "run_jobs", "run_method"]
