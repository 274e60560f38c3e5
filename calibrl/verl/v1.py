"""verl's default (V1) trainer, ``verl.trainer.ppo.v1.trainer_base.PPOTrainer`` (verl 0.9.1): what calibrl adds.

The V1 trainer keeps every rollout in a TransferQueue and builds each step's ``DataProto`` from a fixed field list,
so inputs that the legacy trainer carries in ``data.non_tensor_batch`` never reach the advantage step. The
wrappers on ``PPOTrainer`` methods (each calls verl's own method; nothing of verl's is copied):

- ``__init__``: refuses, before any rollout, estimators whose inputs verl cannot provide (gcpo: per-completion
  embeddings; verl computes no hidden states; intuitor: self-certainty, read from whole next-token distributions).
- ``_compute_advantage``: for calibrl's estimators, also reads each row's ``extra_fields["reward_extra_info"]
  ["answer"]`` (what the reward function returned) from the queue, for seed_grpo's semantic clusters
  (:func:`queue_answers`).
- ``_validate`` / ``_dump_generations``: before validation clears its rows from the queue, reads their
  ``rollout_log_probs`` (the rollout engine's token log-probs, ``rollout.calculate_log_probs=True``, verl's
  default; validation computes no other log-probs), and adds their masked mean as ``logprob_mean`` to each row of
  ``trainer.validation_data_dir/<step>.jsonl``. The queue calls are seen through :class:`_QueueProxy`, which
  replaces the module's ``tq`` name and changes nothing outside validation.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from typing import Any, Callable

import numpy as np
import torch

from calibrl.advantages import estimator_inputs
from calibrl.batch import masked_row_mean

V1_TRAINER = "verl.trainer.ppo.v1.trainer_base"

logger = logging.getLogger("calibrl.verl")

_ANSWERS: contextvars.ContextVar[Any] = contextvars.ContextVar("calibrl_verl_v1_answers", default=None)
_VAL_LOGPROBS: contextvars.ContextVar[Any] = contextvars.ContextVar("calibrl_verl_v1_val_logprobs", default=None)


def queue_answers(n_rows: int) -> Any:
    """The ``answer`` of each row of the V1 advantage step in progress (an object array [n_rows], None where the
    reward function returned none), else None (no V1 step running, no answers, or another number of rows)."""
    answers = _ANSWERS.get()
    if answers is None or len(answers) != n_rows:
        return None
    return answers


def _calibrl_estimator(verl_name: Any) -> str | None:
    """The calibrl estimator registered in verl under ``verl_name`` (``algorithm.adv_estimator``), else None."""
    from verl.trainer.ppo import core_algos

    fn = core_algos.ADV_ESTIMATOR_REGISTRY.get(str(getattr(verl_name, "value", verl_name)))
    return getattr(fn, "calibrl_estimator", None)


def check_v1_config(*, config: Any) -> None:
    """Raise a ValueError naming what to use instead if ``config.algorithm.adv_estimator`` is a calibrl estimator
    the V1 trainer cannot feed (one reading ``embeddings``: :func:`calibrl.advantages.estimator_inputs`)."""
    verl_name = config.algorithm.adv_estimator
    name = _calibrl_estimator(verl_name)
    if name is not None and "self_certainty" in estimator_inputs(name, {}):
        raise ValueError(
            f"calibrl estimator {name!r} (algorithm.adv_estimator={verl_name}) needs each completion's self-certainty, "
            "read from the policy's whole next-token distributions; verl 0.9.1 computes none (the authors patch "
            f"verl's actor for it, verl-intuitor). Train {name} with calibrl's TRL trainer (`calibrl train "
            "intuitor_qwen2.5-3b_deepscaler`).")
    if name is not None and "embeddings" in estimator_inputs(name, {}):
        raise ValueError(
            f"calibrl estimator {name!r} (algorithm.adv_estimator={verl_name}) needs embeddings, one per completion "
            "(e.g. mean-pooled last hidden states); verl 0.9.1 computes none, and its V1 trainer (trainer.use_v1=True, "
            "the default) builds the advantage step's batch from a fixed field list, so none can reach it. Train "
            f"{name} with calibrl's TRL trainer (`calibrl train`, which pools the policy's hidden states), or with "
            "verl's legacy trainer (trainer.use_v1=False) and a worker that writes data.batch['embeddings'] [N, D]."
        )


def wrap_init(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``PPOTrainer.__init__(self, config)`` (verl 0.9.1) preceded by :func:`check_v1_config`: refuse at start-up."""

    @functools.wraps(fn)
    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        check_v1_config(config=config)
        fn(self, config, *args, **kwargs)

    return __init__


def _answers_from_queue(queue: Any, batch: Any) -> Any:
    """``extra_fields["reward_extra_info"]["answer"]`` of every row of ``batch`` (a ``KVBatchMeta``), read as
    verl 0.9.1's ``PPOTrainer._validate`` reads ``extra_fields``; None if no row has an answer."""
    data = queue.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    extra_fields = data.pop("extra_fields", None)
    if extra_fields is None:
        return None
    answers = []
    for extra in extra_fields.tolist():
        info = extra.get("reward_extra_info", {}) if isinstance(extra, dict) else {}
        answers.append(info.get("answer") if isinstance(info, dict) else None)
    if all(answer is None for answer in answers):
        return None
    return np.array(answers, dtype=object)


def wrap_compute_advantage(fn: Callable[..., Any], *, module: Any) -> Callable[..., Any]:
    """``PPOTrainer._compute_advantage(self, batch, metrics)`` (verl 0.9.1) with the rows' answers available to
    calibrl's estimators (:func:`queue_answers`) while it runs; other estimators read nothing more."""

    @functools.wraps(fn)
    def _compute_advantage(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if _calibrl_estimator(self.config.algorithm.adv_estimator) is None:
            return fn(self, batch, *args, **kwargs)
        token = _ANSWERS.set(_answers_from_queue(module.tq, batch))
        try:
            return fn(self, batch, *args, **kwargs)
        finally:
            _ANSWERS.reset(token)

    return _compute_advantage


def _rollout_logprob_means(data: Any) -> list[float] | None:
    """Masked mean of ``rollout_log_probs`` over ``response_mask`` per row of a queue read, else None."""
    if "rollout_log_probs" not in data.keys() or "response_mask" not in data.keys():
        return None
    logprobs, mask = data["rollout_log_probs"], data["response_mask"]
    if logprobs.is_nested:
        logprobs, mask = logprobs.to_padded_tensor(0.0), mask.to_padded_tensor(0)
    return masked_row_mean(logprobs, mask.to(torch.bool)).tolist()


class _QueueProxy:
    """Stands for ``transfer_queue`` in ``verl.trainer.ppo.v1.trainer_base`` (verl 0.9.1). Every attribute is the
    module's own, looked up at each call; only ``kv_clear`` during a wrapped ``_validate`` first reads the rows'
    rollout log-probs (validation clears its rows before it dumps them)."""

    def __init__(self, queue: Any) -> None:
        self._queue = queue

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    def kv_clear(self, *args: Any, **kwargs: Any) -> Any:
        collected = _VAL_LOGPROBS.get()
        keys, partition_id = kwargs.get("keys"), kwargs.get("partition_id")
        if collected is not None and keys is not None and partition_id == "val":
            _collect_logprobs(self._queue, keys=list(keys), partition_id=partition_id, into=collected)
        return self._queue.kv_clear(*args, **kwargs)


def _collect_logprobs(queue: Any, *, keys: list[str], partition_id: str, into: dict[str, float]) -> None:
    """Add ``key -> logprob_mean`` for ``keys`` to ``into``; rows without rollout log-probs add nothing."""
    try:
        data = queue.kv_batch_get(keys=keys, partition_id=partition_id,
                                  select_fields=["rollout_log_probs", "response_mask"])
    except (KeyError, ValueError, RuntimeError) as exc:
        logger.warning("calibrl.verl: no rollout log-probs for the validation dump (%s)", exc)
        return
    means = _rollout_logprob_means(data)
    if means is not None:
        into.update(zip(keys, means))


def wrap_validate(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``PPOTrainer._validate(self)`` (verl 0.9.1) collecting each validation row's rollout ``logprob_mean``,
    unless ``actor_rollout_ref.rollout.calculate_log_probs`` is false (the rollout then returns none)."""

    @functools.wraps(fn)
    def _validate(self: Any, *args: Any, **kwargs: Any) -> Any:
        rollout = self.config.actor_rollout_ref.rollout
        if not rollout.get("calculate_log_probs", True):
            return fn(self, *args, **kwargs)
        token = _VAL_LOGPROBS.set({})
        try:
            return fn(self, *args, **kwargs)
        finally:
            _VAL_LOGPROBS.reset(token)

    return _validate


def wrap_dump_generations(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``PPOTrainer._dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)``
    (verl 0.9.1) with a ``logprob_mean`` column, matched by queue key (the dict's ``uid``), during validation."""

    @functools.wraps(fn)
    def _dump_generations(self: Any, *args: Any, **kwargs: Any) -> Any:
        collected = _VAL_LOGPROBS.get()
        extra = kwargs.get("reward_extra_infos_dict")
        if collected and isinstance(extra, dict) and "uid" in extra and "logprob_mean" not in extra:
            kwargs["reward_extra_infos_dict"] = {**extra, "logprob_mean": [collected.get(k) for k in extra["uid"]]}
        return fn(self, *args, **kwargs)

    return _dump_generations


def patch_v1_trainer(module: Any) -> None:
    """Apply the wrappers to ``module.PPOTrainer`` (``verl.trainer.ppo.v1.trainer_base``, verl 0.9.1) and put
    :class:`_QueueProxy` in place of its ``tq``. Idempotent."""
    cls = getattr(module, "PPOTrainer", None)
    if cls is None or getattr(cls, "_calibrl_patched", False):
        return
    cls.__init__ = wrap_init(cls.__init__)
    cls._compute_advantage = wrap_compute_advantage(cls._compute_advantage, module=module)
    cls._validate = wrap_validate(cls._validate)
    cls._dump_generations = wrap_dump_generations(cls._dump_generations)
    if not isinstance(module.tq, _QueueProxy):
        module.tq = _QueueProxy(module.tq)
    cls._calibrl_patched = True
