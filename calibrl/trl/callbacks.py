"""Checkpoint choice and early stopping by calibration: :class:`CalibrationEvalCallback` (a transformers
``TrainerCallback``).

Every ``every`` optimizer steps (and before the first one, the *start*) the callback samples ``k`` completions for
each of a fixed set of held-out prompts with the project's generation path (:mod:`calibrl.evaluation.backends`, the
sampler and log-prob reader of ``calibrl generate``), grades them with the trainer's correctness reward function
(``CalibratedGRPOConfig.correctness_reward``; value > 0.5 is correct) and computes, with :mod:`calibrl.metrics`:

    accuracy                 mean@k (mean over prompts of the fraction of correct samples)
    auroc                    pooled AUROC of the mean token log-prob vs correctness
    auroc_per_prompt         mean within-prompt AUROC over prompts with both outcomes (``auroc_n_prompts`` of them)
    ece                      ECE of exp(mean token log-prob) vs correctness (``n_bins`` equal-width bins)
    smooth_ece               smooth ECE of exp(mean token log-prob) (kernel, no bins: :func:`calibrl.metrics.smooth_ece`)
    prr                      prediction-rejection ratio of the mean token log-prob (0 = random, 1 = oracle;
                             :func:`calibrl.metrics.prr`)
    aurc                     area under the risk-coverage curve of the confidence (selective answering:
                             lower is better; :func:`calibrl.metrics.aurc`)
    mean_confidence          mean exp(mean token log-prob)
    decision_ece, decision_prob_mean, decision_frac_above_099
                             decision tasks (a ``classes`` column): the decided class's probability (equal-count
                             bins, as the training telemetry)
    answer_rate, accuracy_answered, hallucination_rate, accuracy_hallucination_ratio
                             the model's own "I don't know" (the final answer of each completion:
                             :func:`calibrl.tasks.abstention.is_abstention`; :mod:`calibrl.metrics.stated_abstention`)
    declined_unanswerable, declined_answerable
                             the share of samples declined on items with no right answer (an ``answerable``
                             column false; NaN without one) and on the others
    n_samples                samples scored

These are the metrics declared for the ``callback`` context (:mod:`calibrl.metrics.registry`), with a user's
declared metrics (``plugins:``) after them.
Each is logged as ``eval_calibration/<key>`` through the trainer's logging (TensorBoard, W&B, ``log_history``),
left out when undefined (NaN). The decision rules are pure functions of the list of evaluation records
(:func:`pareto_best`, :func:`should_stop_early`), so they are tested without training:

* ``metric_for_best_model="eval_calibration/auroc"`` (any logged key) drives transformers' own best-checkpoint
  bookkeeping (``state.best_metric``, ``best_model_checkpoint``, ``load_best_model_at_end``,
  ``save_strategy="best"``): the callback hands its metrics to ``Trainer._determine_best_metric`` as
  ``Trainer._maybe_log_save_evaluate`` would hand an evaluation's (transformers 5.23).
* the Pareto rule (:func:`pareto_best`) writes ``best_checkpoint`` into ``<output_dir>/calibration_eval.json``
  and logs ``eval_calibration/best_checkpoint_step``;
* early stopping (:func:`should_stop_early`) sets ``control.should_training_stop`` when the watched calibration
  metric has fallen more than ``stop_margin`` from its best (or start) value while accuracy has not risen for
  ``patience`` evaluations.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import SaveStrategy

from calibrl._files import write_then_rename
from calibrl.metrics.registry import higher_is_better as _registry_higher_is_better
from calibrl.metrics.registry import metric
from calibrl.trl.calibration_config import CalibrationEvalConfig

__all__ = [
    "CALIBRATION_EVAL_FILE", "CalibrationEvalCallback", "CalibrationEvalConfig", "LOG_PREFIX",
    "attach_calibration_eval", "calibration_record", "check_best_metric_settings", "heldout_problems",
    "higher_is_better", "pareto_best", "record_keys", "sample_completions", "should_stop_early",
]

CALIBRATION_EVAL_FILE = "calibration_eval.json"  # in output_dir: every record, best_checkpoint, early_stop
LOG_PREFIX = "eval_calibration/"
_EPS = 1e-9  # margins compare with this slack, so 0.80 - 0.78 counts as within a margin of 0.02


# ---------------------------------------------------------------------------------------------------- pure rules


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` is better: its declared direction
    (:func:`calibrl.metrics.registry.higher_is_better`; False for ECEs, smooth ECE, AURC, Brier, NLL; a key that
    is not a declared metric raises)."""
    return _registry_higher_is_better(metric)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def calibration_record(rows: Sequence[dict], *, n_bins: int = 10) -> dict[str, float]:
    """Every declared ``callback`` metric (:mod:`calibrl.metrics.registry`; the module docstring lists calibrl's
    own) of sampled rows in ``calibrl generate``'s format (``prompt_id``, ``correct``, ``logprob_mean``, and
    ``decision_prob`` for decision tasks), and ``n_samples``; NaN where undefined (AUROC with one class)."""
    from calibrl.metrics.registry import compute_metrics
    from calibrl.tasks.abstention import is_abstention
    from calibrl.tasks.rewards import marks_unanswerable

    if not rows:
        raise ValueError("calibration_record: no rows to score")
    _, prompt_index = np.unique([str(r["prompt_id"]) for r in rows], return_inverse=True)
    logprob_mean = np.array([float(r["logprob_mean"]) for r in rows])
    inputs = {"correct": np.array([bool(r["correct"]) for r in rows]), "prompt_index": prompt_index,
              "score": logprob_mean, "confidence": np.exp(logprob_mean), "logprob_mean": logprob_mean,
              # read from the text on every record (all false when nothing declines), so the keys never change
              "abstained": np.array([r.get("completion") is not None and is_abstention(r["completion"])
                                     for r in rows]),
              "answerable": np.array([not marks_unanswerable(r.get("answerable")) for r in rows])}
    if "decision_prob" in rows[0]:
        inputs["decision_prob"] = np.array([np.nan if r.get("decision_prob") is None else float(r["decision_prob"])
                                            for r in rows])
    return {**compute_metrics("callback", inputs, settings={"n_bins": n_bins}), "n_samples": float(len(rows))}


def record_keys() -> list[str]:
    """The keys of a :func:`calibration_record`: every declared ``callback`` metric and ``n_samples``."""
    from calibrl.metrics.registry import metrics_for

    return [m.name for m in metrics_for("callback")] + ["n_samples"]


def pareto_best(records: Sequence[dict], *, metric: str = "auroc", rule: str = "accuracy", margin: float = 0.02,
                start: dict | None = None, accuracy_key: str = "accuracy") -> dict | None:
    """The record the Pareto rule picks among ``records`` (each a dict with ``step``, ``accuracy_key`` and
    ``metric``), or None when none qualifies.

    * ``rule="accuracy"``: the highest accuracy among the records whose ``metric`` is no worse than the start's by
      more than ``margin`` (the start: ``start``, else the first record; the first with a finite ``metric`` when
      its value is undefined);
    * ``rule="calibration"``: the best ``metric`` among the records whose accuracy is at least the best accuracy
      minus ``margin``.

    Records with an undefined (NaN) value of a compared quantity never qualify. Ties go to the better other
    quantity, then to the earlier step.
    """
    if rule not in ("accuracy", "calibration"):
        raise ValueError(f"pareto_best: rule must be 'accuracy' or 'calibration', got {rule!r}")
    sign = 1.0 if higher_is_better(metric) else -1.0
    candidates = [r for r in records if _finite(r.get(accuracy_key)) and _finite(r.get(metric))]
    if not candidates:
        return None
    if rule == "accuracy":
        pool = ([start] if start is not None else []) + list(records)
        reference = next((r for r in pool if _finite(r.get(metric))), None)
        eligible = [r for r in candidates if sign * (reference[metric] - r[metric]) <= margin + _EPS]
        return max(eligible, key=lambda r: (r[accuracy_key], sign * r[metric], -r["step"]), default=None)
    best_accuracy = max(r[accuracy_key] for r in candidates)
    eligible = [r for r in candidates if r[accuracy_key] >= best_accuracy - margin - _EPS]
    return max(eligible, key=lambda r: (sign * r[metric], r[accuracy_key], -r["step"]))


def should_stop_early(records: Sequence[dict], *, metric: str = "auroc", margin: float = 0.05, patience: int = 3,
                      reference: str = "best", accuracy_min_delta: float = 0.0,
                      accuracy_key: str = "accuracy") -> str | None:
    """Why training should stop after the last of ``records`` (in step order), or None to go on.

    Stop when BOTH hold: the last record's ``metric`` is worse than the reference (``"best"``: the best finite
    value of all records; ``"start"``: the first finite one) by more than ``margin``; and accuracy has stopped
    rising: the best accuracy of the last ``patience`` records exceeds the best accuracy before them by at most
    ``accuracy_min_delta``. Needs ``patience + 1`` records; a last record with an undefined ``metric`` never stops.
    """
    if reference not in ("best", "start"):
        raise ValueError(f"should_stop_early: reference must be 'best' or 'start', got {reference!r}")
    if patience < 1:
        raise ValueError(f"should_stop_early: patience must be >= 1, got {patience!r}")
    if len(records) < patience + 1 or not _finite(records[-1].get(metric)):
        return None
    sign = 1.0 if higher_is_better(metric) else -1.0
    defined = [r for r in records if _finite(r.get(metric))]
    ref = max(defined, key=lambda r: sign * r[metric]) if reference == "best" else defined[0]
    value = records[-1][metric]
    drop = sign * (ref[metric] - value)
    if drop <= margin + _EPS:
        return None
    accuracies = [r.get(accuracy_key) for r in records]
    before = max((a for a in accuracies[:-patience] if _finite(a)), default=None)
    recent = max((a for a in accuracies[-patience:] if _finite(a)), default=None)
    if before is None or recent is None or recent > before + accuracy_min_delta:
        return None
    return (f"{metric} {value:.4f} at step {records[-1]['step']} is {drop:.4f} worse than its {reference} "
            f"{ref[metric]:.4f} (step {ref['step']}), more than {margin}, and accuracy has not risen in {patience} "
            f"evaluations (best {recent:.4f} since, {before:.4f} before)")


# ---------------------------------------------------------------------------------------------------- sampling


def _correctness_function(trainer):
    """The trainer's correctness reward function (``correctness_reward``; the first one by default)."""
    import torch

    index = getattr(trainer, "_correctness_index", 0)
    fn = trainer.reward_funcs[index]
    if not callable(fn) or isinstance(fn, torch.nn.Module):
        raise ValueError(f"calibration_eval: the correctness reward {trainer.reward_func_names[index]!r} is a reward "
                         "model; held-out grading needs a reward function (set correctness_reward to one)")
    return fn


def sample_completions(trainer, problems: Sequence[dict], *, config: CalibrationEvalConfig) -> list[dict]:
    """``config.k`` completions of each problem under the trainer's current weights, as ``calibrl generate`` rows
    (:func:`calibrl.evaluation.generate.problem_rows`: ``prompt_id``, ``correct``, ``logprob_mean``, ...).

    Sampling is the transformers backend of ``calibrl generate`` (plain temperature sampling, log-probs read during
    ``generate``) on the model TRL unwraps for its own generation (``trl.models.utils.unwrap_model_for_generation``);
    grading is the trainer's correctness reward function, called exactly as TRL calls it
    (:func:`calibrl.evaluation.generate.call_reward`: every argument by keyword, the problem's other columns,
    ``trainer_state``). Under several processes each samples a share of the
    prompts and the rows are gathered, so every process returns all rows (a batch's seed depends only on
    ``config.seed`` and its prompt ids, so the draw does not depend on the number of processes). The global RNG
    and the model's train/eval mode are restored afterwards.
    """
    import torch
    from trl.models.utils import unwrap_model_for_generation

    from calibrl.evaluation.backends import open_backend
    from calibrl.evaluation.generate import GenerateConfig, batches, problem_rows, seed_for

    args = trainer.args
    reward_fn = _correctness_function(trainer)
    decision = bool(problems) and "classes" in problems[0]
    classes = list(problems[0]["classes"]) if decision else None
    if decision and any(list(p["classes"]) != classes for p in problems):
        raise ValueError("calibration_eval: all held-out problems of a decision task must share one class list")
    generate_config = GenerateConfig(
        model="<training model>", dataset="calibration_eval", out=os.devnull, n=config.k,
        temperature=float(config.temperature if config.temperature is not None else trainer.temperature),
        max_new_tokens=int(config.max_new_tokens or args.max_completion_length), backend="transformers",
        batch_size=config.batch_size, progress=False,
    )
    accelerator = trainer.accelerator
    mine = list(problems)[accelerator.process_index::accelerator.num_processes]
    rows: list[dict] = []
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices), unwrap_model_for_generation(
        trainer.model_wrapped, accelerator, gather_deepspeed3_params=args.ds3_gather_for_generation,
        gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
    ) as model:
        was_training = model.training
        try:
            backend, variants = open_backend(generate_config, model=model, tokenizer=trainer.processing_class,
                                             classes=classes)
            for batch in batches(mine, config.batch_size):
                prompt_ids = [str(p["prompt_id"]) for p in batch]
                groups = backend.generate([p["prompt"] for p in batch], config.k, seed_for(config.seed, prompt_ids))
                for problem, group in zip(batch, groups):
                    texts = [backend.decode(sample.ids) for sample in group]
                    rows.extend(problem_rows(problem, group, texts, reward_fn, dataset="calibration_eval",
                                              variants=variants, trainer_state=trainer.state))
        finally:
            model.train(was_training)
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        rows = gather_object(rows)
    return rows


def heldout_problems(dataset, *, n: int) -> list[dict]:
    """The first ``n`` rows of ``dataset`` (a ``datasets.Dataset`` or a list of dicts with a ``prompt``), each with a
    ``prompt_id`` (``heldout-<i>`` when the dataset has none)."""
    rows = dataset.select(range(min(n, len(dataset)))).to_list() if hasattr(dataset, "select") else list(dataset)[:n]
    if not rows:
        raise ValueError("calibration_eval: the held-out dataset has no rows")
    if "prompt" not in rows[0]:
        raise ValueError(f"calibration_eval: the held-out dataset has no 'prompt' column (columns: {sorted(rows[0])})")
    return [{**row, "prompt_id": row.get("prompt_id", f"heldout-{i}")} for i, row in enumerate(rows)]


# ---------------------------------------------------------------------------------------------------- callback


def _owned_best_metric(args) -> str | None:
    """``metric_for_best_model`` as transformers looks it up (``eval_`` prefixed unless present), when it is one of
    this callback's keys; else None."""
    name = getattr(args, "metric_for_best_model", None)
    if not name:
        return None
    name = name if name.startswith("eval_") else f"eval_{name}"
    return name if name.startswith(LOG_PREFIX) else None


def check_best_metric_settings(args, *, every: int) -> None:
    """Refuse a ``metric_for_best_model`` naming an ``eval_calibration/`` key that this callback does not log, or
    together with the trainer's own evaluation (``eval_strategy`` other than ``"no"``: it logs its telemetry
    under the same ``eval_calibration/`` names and would feed them to the same best-metric bookkeeping); warn when
    ``greater_is_better`` contradicts the metric (transformers infers True for any name not ending in "loss")."""
    owned = _owned_best_metric(args)
    if owned is None:
        return
    logged = [k for k in record_keys() if k != "n_samples" and metric(k).higher is not None]
    if owned not in {LOG_PREFIX + k for k in logged}:
        raise ValueError(f"metric_for_best_model={args.metric_for_best_model!r}: calibration_eval logs "
                         f"{', '.join(LOG_PREFIX + k for k in logged)}")
    if args.eval_strategy != "no":
        raise ValueError(
            f"metric_for_best_model={args.metric_for_best_model!r} is measured by calibration_eval every {every} "
            f"steps, but eval_strategy={str(getattr(args.eval_strategy, 'value', args.eval_strategy))!r} also runs "
            "the trainer's evaluation, which logs its own eval_calibration/ values under the same names: set "
            "eval_strategy 'no' (load_best_model_at_end works with save_strategy 'best')")
    if args.greater_is_better != higher_is_better(owned):
        warnings.warn(f"metric_for_best_model={owned!r} with greater_is_better={args.greater_is_better}: "
                      f"{'higher' if higher_is_better(owned) else 'lower'} is better calibration", UserWarning,
                      stacklevel=3)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


class CalibrationEvalCallback(TrainerCallback):
    """Held-out calibration evaluation, best-checkpoint bookkeeping and early stopping (module docstring).

    Hooks (transformers 5.23 ``TrainerCallback``): ``on_train_begin`` (checks, resume, the start evaluation),
    ``on_step_end`` (evaluations; it runs before ``Trainer._maybe_log_save_evaluate``, so a ``should_save`` or
    ``should_training_stop`` it sets takes effect at the same step), ``on_save`` and ``on_train_end`` (rewrite
    ``calibration_eval.json`` with the checkpoint folders that now exist).

    Args:
        config: the settings.
        problems: the held-out problems (dicts with ``prompt``, ``prompt_id`` and the reward's columns), e.g.
            :func:`heldout_problems`; only the first ``config.prompts`` are used.
        trainer: the :class:`~calibrl.trl.CalibratedGRPOTrainer` (or set ``callback.trainer`` before training).

    After training, ``records`` holds one dict per evaluation (``step`` and the metrics), ``best`` the Pareto
    rule's record, ``stopped`` the early stop (``{"step", "reason"}``) or None, ``last_samples`` the rows of the
    last evaluation.
    """

    def __init__(self, *, config: CalibrationEvalConfig, problems: Sequence[dict], trainer=None):
        self.config = config
        self.problems = list(problems)[: config.prompts]
        if not self.problems:
            raise ValueError("calibration_eval: no held-out problems")
        self.trainer = trainer
        self.records: list[dict] = []
        self.best: dict | None = None
        self.stopped: dict | None = None
        self.last_samples: list[dict] = []

    # ------------------------------------------------------------------------------------------- hooks

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is None:
            raise ValueError("CalibrationEvalCallback needs the trainer: pass trainer= or set callback.trainer")
        check_best_metric_settings(args, every=self.config.every)
        self.records, self.best, self.stopped = [], None, None
        if state.global_step > 0:  # resumed: keep the evaluations up to the checkpoint (the start among them)
            saved = self._read_file(args)
            self.records = [r for r in saved.get("records", []) if r.get("step", 0) <= state.global_step]
            self._choose()
        elif self.config.at_start:
            self._evaluate(args, state, control, start=True)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        due = step % self.config.every == 0 or (self.config.at_end and step >= state.max_steps)
        if due and not any(r["step"] == step for r in self.records):
            self._evaluate(args, state, control, start=False)
        return control

    def on_save(self, args, state, control, **kwargs):
        self._write_file(args, state)

    def on_train_end(self, args, state, control, **kwargs):
        self._write_file(args, state)

    # ------------------------------------------------------------------------------------------- work

    def _evaluate(self, args, state, control, *, start: bool) -> dict:
        """One evaluation: sample, score, log, then the best-metric, Pareto and early-stop decisions."""
        trainer = self.trainer
        self.last_samples = sample_completions(trainer, self.problems, config=self.config)
        record = {"step": int(state.global_step), **calibration_record(self.last_samples, n_bins=self.config.n_bins)}
        self.records.append(record)
        logs = {LOG_PREFIX + k: v for k, v in record.items() if k != "step" and _finite(v)}
        owned = _owned_best_metric(args)
        if owned is not None and not start and owned in logs:
            # what Trainer._maybe_log_save_evaluate does with an evaluation's metrics (transformers 5.23)
            is_new_best = trainer._determine_best_metric(metrics=logs, trial=None)
            if args.save_strategy == SaveStrategy.BEST:
                control.should_save = is_new_best
        self._choose()
        if self.best is not None:
            logs[LOG_PREFIX + "best_checkpoint_step"] = float(self.best["step"])
        if self.config.early_stop and not start:
            reason = should_stop_early(self.records, metric=self.config.metric, margin=self.config.stop_margin,
                                       patience=self.config.patience, reference=self.config.stop_reference,
                                       accuracy_min_delta=self.config.accuracy_min_delta)
            if reason is not None:
                control.should_training_stop = True
                self.stopped = {"step": record["step"], "reason": reason}
                logs[LOG_PREFIX + "early_stop"] = 1.0
        # Trainer.log, not GRPOTrainer.log: TRL's would fold (and clear) the training metrics it is collecting for
        # this step's log line into this one; transformers' appends to log_history and reaches every logger. Its
        # CallbackHandler.on_log clears control.should_log, which would drop this step's training log line.
        should_log = control.should_log
        Trainer.log(trainer, logs)
        control.should_log = should_log
        self._write_file(args, state)
        return record

    def _choose(self) -> None:
        """``best``: the Pareto rule over the evaluations after the start (the start has no checkpoint)."""
        start = next((r for r in self.records if r["step"] == 0), None)
        candidates = [r for r in self.records if r["step"] > 0]
        self.best = pareto_best(candidates, metric=self.config.metric, rule=self.config.pareto,
                                margin=self.config.pareto_margin, start=start)

    def _path(self, args) -> Path:
        return Path(args.output_dir) / CALIBRATION_EVAL_FILE

    def _read_file(self, args) -> dict:
        try:
            return json.loads(self._path(args).read_text())
        except (OSError, ValueError):
            return {}

    def _write_file(self, args, state) -> None:
        """``calibration_eval.json`` (main process): settings, records, ``best_checkpoint`` (its step, its
        ``checkpoint-<step>`` folder when saved, else null, and its metrics), ``early_stop``."""
        if not state.is_world_process_zero:
            return
        best = None
        if self.best is not None:
            folder = Path(args.output_dir) / f"checkpoint-{self.best['step']}"
            best = {"step": self.best["step"], "checkpoint": str(folder) if folder.is_dir() else None,
                    "rule": self.config.pareto, "metric": self.config.metric, "margin": self.config.pareto_margin,
                    "metrics": {k: v for k, v in self.best.items() if k != "step"}}
        content = {"config": asdict(self.config), "records": self.records, "best_checkpoint": best,
                   "early_stop": self.stopped}
        path = self._path(args)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_then_rename(path, json.dumps(_jsonable(content), indent=2) + "\n")


def attach_calibration_eval(trainer, *, config: CalibrationEvalConfig, dataset) -> CalibrationEvalCallback:
    """Add a :class:`CalibrationEvalCallback` on the first ``config.prompts`` rows of ``dataset`` to ``trainer``
    (what the recipe key ``calibration_eval:`` does) and return it."""
    callback = CalibrationEvalCallback(config=config, problems=heldout_problems(dataset, n=config.prompts),
                                       trainer=trainer)
    _correctness_function(trainer)  # a reward model as correctness: refuse before training starts
    check_best_metric_settings(trainer.args, every=config.every)
    trainer.add_callback(callback)
    return callback
