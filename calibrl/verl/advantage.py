"""calibrl's advantage estimators as verl advantage estimators: a verl batch in, verl's (advantages, returns) out.

How a verl batch becomes a :class:`calibrl.RolloutBatch` (our choices):

- ``rewards``: ``token_level_rewards.sum(-1)``, as verl's outcome estimators do. With
  ``algorithm.use_kl_in_reward=True`` that sum includes the KL penalty; CAPO's correct/incorrect split
  (``reward > threshold``) expects the raw 0/1 score, so keep ``use_kl_in_reward=False`` (the CAPO paper uses no
  KL at all).
- ``group_ids``: the ``uid`` strings (``index``) mapped to integers. Without ``uid`` every row is its own group.
- ``logprob_mean``: the masked mean over ``response_mask`` of ``old_log_probs`` (the proximal/old policy verl
  recomputes before the update); in bypass mode verl stores the rollout log-probs there itself, and if only
  ``rollout_log_probs`` exists we use those.
- ``ref_logprob_mean``: the same of ``ref_log_prob``, present when verl runs the reference policy
  (``actor_rollout_ref.actor.use_kl_loss=True``; ``kl_loss_coef=0.0`` keeps the loss KL-free). CAPO's noise mask
  (``capo`` with a mask, ``grpo_mask``) needs it.
- ``lengths``: ``response_mask.sum(-1)``. Rows with none (verl's rollout-correction rejection sampling zeroes
  their mask) get advantage 0 and are left out of the estimator's statistics and diagnostics
  (:func:`calibrl.compute_advantages` does this for every estimator).
- ``embeddings`` (gcpo): ``data.batch["embeddings"]`` [N, D] if some worker put it there; verl computes none.
  ``answer_ids`` (seed_grpo): the reward function's ``answer`` (it returns ``{"score": ..., "answer": ...}``):
  ``data.non_tensor_batch["answer"]`` (legacy trainer), else the V1 trainer's queue
  (:func:`calibrl.verl.v1.queue_answers`); clustered within each group by the grader's equivalence
  (:func:`calibrl.selection.answers.group_answer_ids`: ``12`` and ``12.0`` are one answer).
- Advantages [N] are broadcast over the response (``A[:, None] * response_mask``) and returned as both
  advantages and returns, exactly as verl's GRPO does.
- Estimator parameters: the mapping ``algorithm.calibrl`` (hydra: ``+algorithm.calibrl.tau=0.6``), passed as
  keyword arguments to the estimator; else the JSON object in the environment variable ``CALIBRL_VERL_PARAMS``.
  verl's GRPO uses epsilon 1e-6, calibrl's (TRL's) 1e-4: ``+algorithm.calibrl.eps=1e-6`` reproduces verl.
- CAPO's ``mask="quantile"`` (estimators ``capo`` and ``grpo_mask``): the reference-perplexity quantiles of the
  first batch(es) this process computes advantages for are frozen
  (:class:`calibrl.advantages.capo.FrozenQuantileMask`), one state per estimator and quantile configuration, held at
  module level in the driver process that runs verl's advantage step (:func:`quantile_mask_state`,
  :func:`reset_quantile_masks`). verl 0.9.1 gives plugins no checkpoint hook, so the plugin wraps both trainers'
  ``_save_checkpoint`` / ``_load_checkpoint`` (:mod:`calibrl.verl.hooks`): every checkpoint folder ``global_step_N``
  gets ``calibrl_capo_mask.json`` (:func:`save_quantile_masks`), and a resumed run reads it back
  (:func:`load_quantile_masks`); a checkpoint without it (saved without the plugin, or with another mask) leaves the
  thresholds to the first batch after the resume. Passing the logged values (``ref_high`` / ``ref_low`` in the
  diagnostics) as ``+algorithm.calibrl.ref_high=... +algorithm.calibrl.ref_low=...`` with ``mask=quantile`` also
  freezes them from the start.
- Diagnostics (e.g. CAPO's ``mask_fraction``, the thresholds ``ref_high`` / ``ref_low``) go to ``data.meta_info["calibrl/advantage"]``, to the logger
  ``calibrl.verl`` (INFO) and to :func:`last_info`; verl's trackers do not see them.

The log-probs, embeddings and answers are not among the arguments verl passes an estimator; they are read from
the batch held by the wrapped advantage step (:func:`calibrl.verl.hooks.current_data`).
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Callable

import numpy as np
import torch

import calibrl
from calibrl.advantages import estimator_spec
from calibrl.advantages.capo import (QUANTILE_MASK_FILE, FrozenQuantileMask, frozen_quantile_params, mask_settings,
                                     read_mask_states, write_mask_states)
from calibrl.batch import RolloutBatch, RolloutBatchError, masked_row_mean
from calibrl.selection.answers import group_answer_ids
from calibrl.verl.hooks import RAY_TRAINER, current_data
from calibrl.verl.v1 import queue_answers

logger = logging.getLogger("calibrl.verl")

PARAMS_ENV = "CALIBRL_VERL_PARAMS"

_LAST_INFO: dict[str, float] = {}

# (estimator, its quantile settings) -> the frozen thresholds of CAPO's mask="quantile" in this process
_QUANTILE_MASKS: dict[tuple[str, str], FrozenQuantileMask] = {}


def quantile_mask_state(name: str, params: dict[str, Any]) -> FrozenQuantileMask | None:
    """The :class:`FrozenQuantileMask` of estimator ``name`` with ``params`` in this process (created on first use),
    or None unless ``name`` takes CAPO's noise mask (capo, grpo_mask) and ``mask="quantile"``. One state per
    estimator and quantile configuration (quantile levels, K, thresholds given), so two estimators never share
    thresholds."""
    try:
        spec = estimator_spec(name)
    except KeyError:  # a saved state of an estimator this run did not register
        return None
    if spec.noise_mask == "no" or params.get("mask") != "quantile":
        return None
    key = (name, json.dumps(mask_settings(params), sort_keys=True, default=str))
    state = _QUANTILE_MASKS.get(key)
    if state is None:
        state = _QUANTILE_MASKS[key] = FrozenQuantileMask.from_params(params)
    return state


def reset_quantile_masks() -> None:
    """Forget every frozen quantile threshold of this process (a new run in the same process starts afresh)."""
    _QUANTILE_MASKS.clear()


def save_quantile_masks(folder: str) -> None:
    """Write every quantile-mask state of this process to ``folder/calibrl_capo_mask.json``
    (:func:`calibrl.advantages.capo.write_mask_states`, the format TRL's checkpoints share); nothing when there is
    none."""
    if _QUANTILE_MASKS:
        write_mask_states(folder, [(name, json.loads(settings), state)
                                   for (name, settings), state in _QUANTILE_MASKS.items()])


def load_quantile_masks(folder: str) -> bool:
    """Restore the states :func:`save_quantile_masks` wrote in ``folder``; False (and nothing changed) when the file
    is absent."""
    entries = read_mask_states(folder)
    if entries is None:
        return False
    for entry in entries:
        if entry["estimator"] is None:  # a TRL checkpoint of an earlier calibrl: no estimator to give it to
            continue
        state = quantile_mask_state(entry["estimator"], {**entry["settings"], "mask": "quantile"})
        if state is not None:
            state.load_state_dict(entry["state"])
    logger.info("calibrl: restored CAPO's frozen quantile thresholds from %s", os.path.join(folder, QUANTILE_MASK_FILE))
    return True


def _dense_ids(labels: Any) -> torch.Tensor:
    """Arbitrary hashable labels [N] (uid strings, answers) -> integer ids [N], equal label = equal id."""
    _, inverse = np.unique(np.asarray(labels).astype(str), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def _answer_strings(answers: Any) -> list[str | None]:
    """The reward function's answers [N] as strings; None (and NaN, how a missing value comes back from a
    ``non_tensor_batch`` object array) stays None: no extractable answer."""
    out = []
    for a in np.asarray(answers, dtype=object).reshape(-1).tolist():
        missing = a is None or (isinstance(a, float) and math.isnan(a))
        out.append(None if missing else str(a))
    return out


def rollout_batch_from_verl(*, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                            old_log_probs: torch.Tensor | None = None, ref_log_prob: torch.Tensor | None = None,
                            embeddings: torch.Tensor | None = None, answers: Any = None,
                            stated_confidence: Any = None, confidence_start: Any = None) -> RolloutBatch:
    """Build a :class:`RolloutBatch` from verl's per-token tensors [N, T] (see the module docstring)."""
    mask = response_mask.bool()
    rewards = token_level_rewards.sum(-1)
    n = rewards.shape[0]
    group_ids = _dense_ids(index) if index is not None else torch.arange(n)
    return RolloutBatch(
        rewards=rewards.detach().float(),
        group_ids=group_ids.to(rewards.device),
        logprob_mean=None if old_log_probs is None else masked_row_mean(old_log_probs.detach().float(), mask),
        ref_logprob_mean=None if ref_log_prob is None else masked_row_mean(ref_log_prob.detach().float(), mask),
        embeddings=None if embeddings is None else embeddings.detach().float(),
        answer_ids=None if answers is None else torch.as_tensor(
            group_answer_ids(_answer_strings(answers), group_ids.tolist()), dtype=torch.long, device=rewards.device),
        lengths=mask.sum(-1),
        stated_confidence=None if stated_confidence is None else torch.as_tensor(
            np.asarray(stated_confidence, dtype=np.float32), device=rewards.device),
        confidence_start=None if confidence_start is None else torch.as_tensor(
            np.asarray(confidence_start, dtype=np.int64), device=rewards.device),
    )


def _from_current_data(n_rows: int) -> dict[str, Any]:
    """The extra inputs calibrl's estimators read from the DataProto that the wrapped advantage step holds.

    Key names are those of verl 0.9.1's ``DataProto`` in the PPO trainers (``old_log_probs``,
    ``rollout_log_probs``, ``ref_log_prob``); ``embeddings`` only if a custom worker put them there; ``answer``
    from ``non_tensor_batch`` (the legacy trainer copies the reward's extra info there), else from the V1
    trainer's queue (:func:`calibrl.verl.v1.queue_answers`). Empty when no wrapped step is running or its batch
    has another size.
    """
    data = current_data()
    if data is None or len(data) != n_rows:
        return {}
    batch, non_tensor = data.batch, data.non_tensor_batch
    keys = set(batch.keys())
    old = batch["old_log_probs"] if "old_log_probs" in keys else (
        batch["rollout_log_probs"] if "rollout_log_probs" in keys else None)
    answers = non_tensor.get("answer")
    # DCPO's inputs: calibrl's names, else those DCPO's own reward managers write (confidence, confidence_pos)
    stated = non_tensor.get("stated_confidence", non_tensor.get("confidence"))
    starts = non_tensor.get("confidence_start", non_tensor.get("confidence_pos"))
    return {
        "stated_confidence": stated,
        "confidence_start": starts,
        "old_log_probs": old,
        "ref_log_prob": batch["ref_log_prob"] if "ref_log_prob" in keys else None,
        "embeddings": batch["embeddings"] if "embeddings" in keys else None,
        "answers": answers if answers is not None else queue_answers(n_rows),
    }


def estimator_params(config: Any) -> dict[str, Any]:
    """Keyword parameters for the estimator: ``config.calibrl`` (verl's algorithm config), else $CALIBRL_VERL_PARAMS."""
    section = None
    if config is not None:
        try:
            section = config.get("calibrl", None)
        except (AttributeError, TypeError, KeyError):
            section = getattr(config, "calibrl", None)
    if section is not None:
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(section, DictConfig):
                section = OmegaConf.to_container(section, resolve=True)
        except ImportError:  # pragma: no cover - omegaconf ships with verl
            pass
        return dict(section)
    raw = os.environ.get(PARAMS_ENV, "").strip()
    if not raw:
        return {}
    params = json.loads(raw)
    if not isinstance(params, dict):
        raise ValueError(f"{PARAMS_ENV} must hold a JSON object of estimator parameters, got {raw!r}")
    return params


def _missing_input_hint(message: str, *, have_step: bool) -> str:
    """Where calibrl.verl looks for the field a :class:`RolloutBatchError` says is missing, and what to change."""
    if not have_step:
        return (". calibrl.verl: verl passes estimators no log-probs; they come from the wrapped advantage step, which "
                "did not run. Load the plugin with VERL_USE_EXTERNAL_MODULES=calibrl.verl (or import calibrl.verl "
                f"before {RAY_TRAINER}), and call ray_trainer.compute_advantage.")
    if "answer_ids" in message:
        return (". calibrl.verl reads answers from data.non_tensor_batch['answer'] (legacy trainer) or each row's "
                "extra_fields['reward_extra_info']['answer'] (V1 trainer): have the reward function return a dict "
                "{'score': ..., 'answer': <final answer string>}.")
    if "stated_confidence" in message or "confidence_start" in message:
        return (". calibrl.verl reads them from data.non_tensor_batch['stated_confidence'] / ['confidence_start'] "
                "(or DCPO's reward managers' 'confidence' / 'confidence_pos'): have the reward function's extra info "
                "carry the confidence each completion states (-1 where none) and DCPO's split token "
                "(calibrl.advantages.dcpo.dcpo_split_position).")
    if "self_certainty" in message:
        return (". verl 0.9.1 computes no self-certainty (it needs the full next-token distributions): use calibrl's "
                "TRL trainer (`calibrl train`) for intuitor.")
    if "embeddings" in message:
        return (". verl 0.9.1 computes no per-completion embeddings: use calibrl's TRL trainer (`calibrl train`), or "
                "verl's legacy trainer (trainer.use_v1=False) with a worker that writes data.batch['embeddings'].")
    return ""


def make_adv_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """verl-signature advantage function for calibrl estimator ``name``: -> (advantages, returns), both [N, T].

    Mirrors verl 0.9.1's outcome estimators registered with ``verl.trainer.ppo.core_algos.register_adv_est``
    (e.g. ``core_algos.compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, ...,
    config)``), which ``verl.trainer.ppo.ray_trainer.compute_advantage`` calls as ``adv_estimator_fn(**adv_kwargs)``;
    the keyword arguments it passes other estimators (``reward_baselines``, ...) are accepted and ignored.
    """

    def calibrl_adv_estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                              config: Any = None, **_unused: Any) -> tuple[torch.Tensor, torch.Tensor]:
        extras = _from_current_data(token_level_rewards.shape[0])
        batch = rollout_batch_from_verl(token_level_rewards=token_level_rewards, response_mask=response_mask,
                                        index=index, **extras)
        params = estimator_params(config)
        state = quantile_mask_state(name, params)
        if state is not None:  # verl computes advantages for training batches only: every call may set them
            params = frozen_quantile_params(params, batch=batch, state=state)
        try:
            advantages, info = calibrl.compute_advantages(batch, name, return_info=True, **params)
        except RolloutBatchError as exc:
            raise RolloutBatchError(f"{exc}{_missing_input_hint(str(exc), have_step=bool(extras))}") from exc
        _record_info(name, info)
        with torch.no_grad():
            mask = response_mask.to(token_level_rewards.dtype)
            if advantages.dim() == 2:  # per-token advantages [N, max length] (dcpo): to verl's width
                width = mask.shape[1]
                advantages = torch.nn.functional.pad(advantages, (0, max(0, width - advantages.shape[1])))[:, :width]
                scores = advantages.to(mask.dtype) * mask
            else:
                scores = advantages.to(mask.dtype).unsqueeze(-1) * mask
        return scores, scores

    calibrl_adv_estimator.__name__ = f"calibrl_{name}_adv_estimator"
    calibrl_adv_estimator.__qualname__ = calibrl_adv_estimator.__name__
    calibrl_adv_estimator.calibrl_estimator = name  # type: ignore[attr-defined]
    return calibrl_adv_estimator


def _record_info(name: str, info: dict[str, Any]) -> None:
    """Keep the estimator's numeric diagnostics: for :func:`last_info`, in the batch's meta_info, in the log."""
    flat = {}
    for key, value in info.items():
        try:
            flat[key] = float(value)
        except (TypeError, ValueError):
            continue
    _LAST_INFO.clear()
    _LAST_INFO.update(flat)
    data = current_data()
    if data is not None and flat:
        data.meta_info["calibrl/advantage"] = {"estimator": name, **flat}
    if flat:
        logger.info("calibrl advantage %s: %s", name, ", ".join(f"{k}={v:.4g}" for k, v in flat.items()))


def last_info() -> dict[str, float]:
    """Diagnostics of the last calibrl advantage computation in this process (a copy)."""
    return dict(_LAST_INFO)
