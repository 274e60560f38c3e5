"""verl's legacy trainer, ``verl.trainer.ppo.ray_trainer.RayPPOTrainer`` (verl 0.9.1, ``trainer.use_v1=False``):
``logprob_mean`` in its validation dumps.

``RayPPOTrainer._validate`` generates each validation batch, scores it with ``extract_reward(test_batch)`` and,
with ``trainer.validation_data_dir`` set, dumps every row through ``_dump_generations``. Validation computes no
log-probs of its own; the generated batch carries the rollout engine's ``rollout_log_probs`` (when
``actor_rollout_ref.rollout.calculate_log_probs`` is true, verl's default). Three wrappers, each around verl's own
function: ``_validate`` opens a collector, the module's ``extract_reward`` (called once per validation batch, in
dump order) appends each row's masked mean of ``rollout_log_probs``, and ``_dump_generations`` adds the collected
values as ``logprob_mean``. verl's validation metrics do not see the column.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any, Callable

from calibrl.batch import masked_row_mean

_VAL_LOGPROBS: contextvars.ContextVar[Any] = contextvars.ContextVar("calibrl_verl_legacy_val_logprobs", default=None)


def wrap_extract_reward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``ray_trainer.extract_reward(batch)`` (verl 0.9.1), also collecting each row's rollout ``logprob_mean``
    while a wrapped ``_validate`` runs (``None`` for rows of a batch without rollout log-probs)."""
    if getattr(fn, "_calibrl_wrapped", False):
        return fn

    @functools.wraps(fn)
    def extract_reward(batch: Any, *args: Any, **kwargs: Any) -> Any:
        collected = _VAL_LOGPROBS.get()
        if collected is not None:
            keys = set(batch.batch.keys())
            if {"rollout_log_probs", "response_mask"} <= keys:
                collected.extend(masked_row_mean(batch.batch["rollout_log_probs"],
                                                 batch.batch["response_mask"].bool()).tolist())
            else:
                collected.extend([None] * len(batch))
        return fn(batch, *args, **kwargs)

    extract_reward._calibrl_wrapped = True  # type: ignore[attr-defined]
    return extract_reward


def wrap_validate(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``RayPPOTrainer._validate(self, merged=False)`` (verl 0.9.1) with a collector open while it runs."""

    @functools.wraps(fn)
    def _validate(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _VAL_LOGPROBS.set([])
        try:
            return fn(self, *args, **kwargs)
        finally:
            _VAL_LOGPROBS.reset(token)

    return _validate


def wrap_dump_generations(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``RayPPOTrainer._dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict,
    dump_path)`` (verl 0.9.1) with the collected ``logprob_mean`` column, if one value per dumped row and any."""

    @functools.wraps(fn)
    def _dump_generations(self: Any, *args: Any, **kwargs: Any) -> Any:
        collected = _VAL_LOGPROBS.get()
        extra, inputs = kwargs.get("reward_extra_infos_dict"), kwargs.get("inputs")
        if (collected and any(v is not None for v in collected) and isinstance(extra, dict) and inputs is not None
                and len(collected) == len(inputs) and "logprob_mean" not in extra):
            kwargs["reward_extra_infos_dict"] = {**extra, "logprob_mean": list(collected)}
        return fn(self, *args, **kwargs)

    return _dump_generations


def patch_legacy_trainer(module: Any) -> None:
    """Apply the wrappers to ``module`` (``verl.trainer.ppo.ray_trainer``, verl 0.9.1). Idempotent."""
    cls = getattr(module, "RayPPOTrainer", None)
    if cls is None or getattr(cls, "_calibrl_patched", False):
        return
    if hasattr(module, "extract_reward"):
        module.extract_reward = wrap_extract_reward(module.extract_reward)
    cls._validate = wrap_validate(cls._validate)
    cls._dump_generations = wrap_dump_generations(cls._dump_generations)
    cls._calibrl_patched = True
