"""calibrl's estimators and losses inside verl (>= 0.9), loaded by verl itself in every process.

    VERL_USE_EXTERNAL_MODULES=calibrl.verl python -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=capo +algorithm.calibrl.tau=0.6 ...

What importing this module does (idempotent; :func:`install` does it again if you call it):

1. Advantage estimators. Every name in :func:`calibrl.available_estimators` (read at import, so estimators a
   user registered before importing this module come along) is registered in verl's ``register_adv_est``
   registry as ``calibrl_<name>``, and also as plain ``<name>`` where verl has no estimator of that name
   (verl's own ``grpo`` and ``rloo`` keep their names; calibrl's are ``calibrl_grpo`` and ``calibrl_rloo``).
2. Policy losses. ``calibrl_ppo`` (token-level PPO-clip) and ``calibrl_gspo`` (sequence-level ratio, GSPO) in
   ``register_policy_loss``: calibrl's :func:`calibrl.losses.ppo.policy_loss`, the same objective the TRL trainer
   uses, rescaled to verl's data-parallel-global normalisation (see :func:`_global_rescale`).
   Select with ``actor_rollout_ref.actor.policy_loss.loss_mode=calibrl_ppo``. verl's own ``vanilla`` loss works
   just as well with calibrl's advantages; it adds dual-clip (ratio bound 3 for negative advantages).
3. The advantage step. verl calls a registered estimator with ``token_level_rewards``, ``response_mask``,
   ``index`` (the ``uid`` of each prompt) and ``config`` only: no log-probs. We wrap
   ``verl.trainer.ppo.ray_trainer.compute_advantage`` (the function both the legacy and the V1 trainer call;
   ``verl.trainer.ppo.v1.utils`` and ``verl.experimental.separation.ray_trainer`` import it from there) so that,
   while it runs, the batch it was given (the ``DataProto``) is visible to calibrl's estimators through a context
   variable. The wrapper changes nothing else: verl's own code then calls the registered estimator and writes
   ``advantages`` and ``returns`` into ``data.batch``. If ``ray_trainer`` is not imported yet (the usual case:
   verl imports this module from its ``__init__``), a one-name import hook wraps it the moment it loads.

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
  needs it.
- ``lengths``: ``response_mask.sum(-1)``. ``embeddings`` (gcpo): ``data.batch["embeddings"]`` [N, D] if some
  worker put it there; verl computes none. ``answer_ids`` (seed_grpo): ``data.non_tensor_batch["answer"]``
  (strings, e.g. returned by the reward function as ``reward_extra_info["answer"]``), clustered per equal string.
- Advantages [N] are broadcast over the response (``A[:, None] * response_mask``) and returned as both
  advantages and returns, exactly as verl's GRPO does.
- Estimator parameters: the mapping ``algorithm.calibrl`` (hydra: ``+algorithm.calibrl.tau=0.6``), passed as
  keyword arguments to the estimator; else the JSON object in the environment variable ``CALIBRL_VERL_PARAMS``.
  verl's GRPO uses epsilon 1e-6, calibrl's (TRL's) 1e-4: ``+algorithm.calibrl.eps=1e-6`` reproduces verl.
- Diagnostics (e.g. CAPO's ``mask_fraction``) go to ``data.meta_info["calibrl/advantage"]``, to the logger
  ``calibrl.verl`` (INFO) and to :func:`last_info`; verl's trackers do not see them.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import json
import logging
import os
import sys
from typing import Any, Callable

import numpy as np
import torch

import calibrl
from calibrl.batch import RolloutBatch, RolloutBatchError

logger = logging.getLogger("calibrl.verl")

PREFIX = "calibrl_"
PARAMS_ENV = "CALIBRL_VERL_PARAMS"
RAY_TRAINER = "verl.trainer.ppo.ray_trainer"
# Modules that bind ``compute_advantage`` by ``from verl.trainer.ppo.ray_trainer import compute_advantage``.
_DEPENDENTS = ("verl.trainer.ppo.v1.utils", "verl.experimental.separation.ray_trainer")
POLICY_LOSSES = {"calibrl_ppo": "token", "calibrl_gspo": "sequence"}

_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("calibrl_verl_data", default=None)
_REGISTERED: dict[str, str] = {}  # verl name -> calibrl estimator name
_LAST_INFO: dict[str, float] = {}


# ----------------------------------------------------------------------------------------------- the batch

def masked_row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` [N, T] over ``mask`` [N, T] per row -> [N] (0 for an empty row; pads never read)."""
    mask = mask.bool()
    summed = torch.where(mask, values, torch.zeros_like(values)).sum(-1)
    return summed / mask.sum(-1).clamp(min=1).to(summed.dtype)


def _dense_ids(labels: Any) -> torch.Tensor:
    """Arbitrary hashable labels [N] (uid strings, answers) -> integer ids [N], equal label = equal id."""
    _, inverse = np.unique(np.asarray(labels).astype(str), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def rollout_batch_from_verl(*, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                            old_log_probs: torch.Tensor | None = None, ref_log_prob: torch.Tensor | None = None,
                            embeddings: torch.Tensor | None = None, answers: Any = None) -> RolloutBatch:
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
        answer_ids=None if answers is None else _dense_ids(answers).to(rewards.device),
        lengths=mask.sum(-1),
    )


def _from_current_data(n_rows: int) -> dict[str, Any]:
    """The extra inputs calibrl's estimators read from the DataProto that the wrapped advantage step holds."""
    data = _CURRENT.get()
    if data is None or len(data) != n_rows:
        return {}
    batch, non_tensor = data.batch, data.non_tensor_batch
    keys = set(batch.keys())
    old = batch["old_log_probs"] if "old_log_probs" in keys else (
        batch["rollout_log_probs"] if "rollout_log_probs" in keys else None)
    return {
        "old_log_probs": old,
        "ref_log_prob": batch["ref_log_prob"] if "ref_log_prob" in keys else None,
        "embeddings": batch["embeddings"] if "embeddings" in keys else None,
        "answers": non_tensor.get("answer"),
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


def make_adv_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """verl-signature advantage function for calibrl estimator ``name``: -> (advantages, returns), both [N, T]."""

    def calibrl_adv_estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                              config: Any = None, **_unused: Any) -> tuple[torch.Tensor, torch.Tensor]:
        extras = _from_current_data(token_level_rewards.shape[0])
        batch = rollout_batch_from_verl(token_level_rewards=token_level_rewards, response_mask=response_mask,
                                        index=index, **extras)
        try:
            advantages, info = calibrl.compute_advantages(batch, name, return_info=True, **estimator_params(config))
        except RolloutBatchError as exc:
            if not extras:
                raise RolloutBatchError(
                    f"{exc}. calibrl.verl: verl passes estimators no log-probs; they come from the wrapped "
                    f"advantage step, which did not run. Load the plugin with VERL_USE_EXTERNAL_MODULES=calibrl.verl "
                    f"(or import calibrl.verl before {RAY_TRAINER}), and call ray_trainer.compute_advantage."
                ) from exc
            raise
        _record_info(name, info)
        with torch.no_grad():
            scores = advantages.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask.to(token_level_rewards.dtype)
        return scores, scores

    calibrl_adv_estimator.__name__ = f"calibrl_{name}_adv_estimator"
    calibrl_adv_estimator.__qualname__ = calibrl_adv_estimator.__name__
    calibrl_adv_estimator.calibrl_estimator = name  # type: ignore[attr-defined]
    return calibrl_adv_estimator


def _record_info(name: str, info: dict[str, Any]) -> None:
    flat = {}
    for key, value in info.items():
        try:
            flat[key] = float(value)
        except (TypeError, ValueError):
            continue
    _LAST_INFO.clear()
    _LAST_INFO.update(flat)
    data = _CURRENT.get()
    if data is not None and flat:
        data.meta_info["calibrl/advantage"] = {"estimator": name, **flat}
    if flat:
        logger.info("calibrl advantage %s: %s", name, ", ".join(f"{k}={v:.4g}" for k, v in flat.items()))


def last_info() -> dict[str, float]:
    """Diagnostics of the last calibrl advantage computation in this process (a copy)."""
    return dict(_LAST_INFO)


# ----------------------------------------------------------------------------------------------- losses

def _global_rescale(mask: torch.Tensor, mode: str, info: dict[str, Any]) -> float:
    """Factor turning calibrl's micro-batch-local aggregation into verl's ``agg_loss`` with global batch info.

    calibrl's "token-mean" divides by this micro-batch's token count and the "seq-mean-*" modes by its row count;
    verl divides by ``batch_num_tokens`` / ``global_batch_size`` (the data-parallel-global totals, or the local
    non-empty counts when absent) and multiplies by ``dp_size``, so gradients do not depend on how the batch is
    split. The ratio of the two denominators restores verl's behaviour exactly.
    """
    dp_size = info.get("dp_size") or 1
    if mode == "token-mean":
        local = max(float(mask.sum()), 1.0)
        total = info.get("batch_num_tokens")
        total = float(mask.sum()) if total is None else float(total)
    elif mode.startswith("seq-mean"):
        local = float(mask.shape[0])
        total = info.get("global_batch_size")
        total = float((mask.sum(-1) > 0).sum()) if total is None else float(total)
    else:
        return 1.0
    return local * dp_size / max(total, 1e-12)


def make_policy_loss(ratio_level: str) -> Callable[..., tuple[torch.Tensor, dict[str, Any]]]:
    """verl-signature policy loss running :func:`calibrl.losses.ppo.policy_loss` at ``ratio_level``."""
    from calibrl.losses.ppo import policy_loss

    def calibrl_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                            response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Any = None,
                            rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        if rollout_is_weights is not None:
            raise ValueError("calibrl policy losses do not apply verl's rollout-correction IS weights; use verl's "
                             "'vanilla' / 'gspo' loss with algorithm.rollout_correction, or disable it")
        clip = getattr(config, "clip_ratio", 0.2) if config is not None else 0.2
        eps_low = getattr(config, "clip_ratio_low", None) if config is not None else None
        eps_high = getattr(config, "clip_ratio_high", None) if config is not None else None
        info = dict(getattr(config, "global_batch_info", None) or {})
        mask = response_mask.to(log_prob.dtype)
        loss, metrics = policy_loss(
            logprobs=log_prob, old_logprobs=old_log_prob, advantages=advantages, completion_mask=mask,
            eps_low=clip if eps_low is None else eps_low, eps_high=clip if eps_high is None else eps_high,
            ratio_level=ratio_level, aggregation=loss_agg_mode, max_completion_length=info.get("loss_scale_factor"))
        loss = loss * _global_rescale(mask, loss_agg_mode, info)
        with torch.no_grad():
            ppo_kl = float(((old_log_prob - log_prob) * mask).sum() / mask.sum().clamp(min=1))
        out = {
            "actor/pg_clipfrac": float(metrics.get("clip_fraction", 0.0)),
            "actor/ppo_kl": ppo_kl,
            "actor/pg_clipfrac_lower": 0.0,  # verl's dual-clip fraction: calibrl's loss has no dual clip
        }
        out.update({f"actor/calibrl/{k}": float(v) for k, v in metrics.items()})
        return loss, out

    calibrl_policy_loss.__name__ = f"calibrl_{ratio_level}_policy_loss"
    calibrl_policy_loss.__qualname__ = calibrl_policy_loss.__name__
    return calibrl_policy_loss


# ----------------------------------------------------------------------------------------------- wrapping

def wrap_compute_advantage(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (verl's compute_advantage) made to expose its ``data`` to calibrl's estimators while it runs."""
    if getattr(fn, "_calibrl_wrapped", False):
        return fn

    @functools.wraps(fn)
    def compute_advantage(data: Any, *args: Any, **kwargs: Any) -> Any:
        token = _CURRENT.set(data)
        try:
            return fn(data, *args, **kwargs)
        finally:
            _CURRENT.reset(token)

    compute_advantage._calibrl_wrapped = True  # type: ignore[attr-defined]
    return compute_advantage


def _patch_ray_trainer(module: Any) -> None:
    original = getattr(module, "compute_advantage", None)
    if original is None:
        return
    wrapped = wrap_compute_advantage(original)
    module.compute_advantage = wrapped
    # Modules that imported the unwrapped function before we got here.
    for name in _DEPENDENTS:
        dependent = sys.modules.get(name)
        if dependent is not None and getattr(dependent, "compute_advantage", None) is original:
            dependent.compute_advantage = wrapped


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then wraps ``compute_advantage`` in the freshly executed module."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _patch_ray_trainer(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)


class _RayTrainerHook(importlib.abc.MetaPathFinder):
    """Finds ``verl.trainer.ppo.ray_trainer`` with the other finders and hands it a patching loader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != RAY_TRAINER:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def is_wrapped() -> bool:
    """Whether verl's compute_advantage (if imported) is wrapped, or will be when it is imported."""
    module = sys.modules.get(RAY_TRAINER)
    if module is None:
        return any(isinstance(finder, _RayTrainerHook) for finder in sys.meta_path)
    return bool(getattr(module.compute_advantage, "_calibrl_wrapped", False))


# ----------------------------------------------------------------------------------------------- install

def registered_names() -> dict[str, str]:
    """verl estimator name -> calibrl estimator name, for everything this module registered."""
    return dict(_REGISTERED)


def install() -> dict[str, str]:
    """Register calibrl's estimators (all currently registered in calibrl) and losses in verl; wrap the advantage
    step. Idempotent; call again after registering more calibrl estimators. Returns :func:`registered_names`."""
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as exc:
        raise ImportError(
            f"calibrl.verl needs verl (tested with 0.9.1), which could not be imported ({exc}). Install it in its own "
            "environment: `bash scripts/setup_verl_env.sh` creates .venv-verl with verl 0.9.1 and calibrl."
        ) from exc

    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    for name in calibrl.available_estimators():
        for verl_name in (PREFIX + name, name):
            current = registry.get(verl_name)
            if current is None:
                core_algos.register_adv_est(verl_name)(make_adv_estimator(name))
                _REGISTERED[verl_name] = name
            elif getattr(current, "calibrl_estimator", None) == name:
                _REGISTERED[verl_name] = name
            # else: verl's own estimator of that name (grpo, rloo) stays; calibrl's is PREFIX + name.
    for loss_name, level in POLICY_LOSSES.items():
        if loss_name not in core_algos.POLICY_LOSS_REGISTRY:
            core_algos.register_policy_loss(loss_name)(make_policy_loss(level))

    module = sys.modules.get(RAY_TRAINER)
    if module is not None:
        _patch_ray_trainer(module)
    elif not any(isinstance(finder, _RayTrainerHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RayTrainerHook())
    return registered_names()


install()
