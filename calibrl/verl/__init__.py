"""calibrl's estimators and losses inside verl (>= 0.9), loaded by verl itself in every process.

    VERL_USE_EXTERNAL_MODULES=calibrl.verl python -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=capo +algorithm.calibrl.tau=0.6 ...

What importing this module does (idempotent; :func:`install` does it again if you call it):

1. Advantage estimators. Every estimator of calibrl's registry (:func:`calibrl.advantages.estimator_specs`: the
   built-ins and any registered before this import) is registered in verl's ``register_adv_est`` registry as
   ``calibrl_<name>``, and also as plain ``<name>`` where verl has no estimator of that name (verl's own ``grpo``
   and ``rloo`` keep their names; calibrl's are ``calibrl_grpo`` and ``calibrl_rloo``). An estimator registered
   later is registered in verl the moment it is registered in calibrl
   (:func:`calibrl.advantages.registry.on_register`), so a user's estimator file listed in verl's own
   ``VERL_USE_EXTERNAL_MODULES`` (imported in every process that imports verl) reaches verl before or after this
   module, in any order (docs/custom-estimator.md).
   How a verl batch becomes a :class:`calibrl.RolloutBatch`, and where the estimator's parameters and
   diagnostics go: :mod:`calibrl.verl.advantage`.
2. Policy losses. ``calibrl_ppo`` (token-level PPO-clip) and ``calibrl_gspo`` (sequence-level ratio, GSPO) in
   ``register_policy_loss``: calibrl's :func:`calibrl.losses.ppo.policy_loss`, the same objective the TRL trainer
   uses, rescaled to verl's data-parallel-global normalisation (see :mod:`calibrl.verl.loss`).
   Select with ``actor_rollout_ref.actor.policy_loss.loss_mode=calibrl_ppo``. verl's own ``vanilla`` loss works
   just as well with calibrl's advantages; it adds dual-clip (ratio bound 3 for negative advantages).
3. The advantage step. verl calls a registered estimator with ``token_level_rewards``, ``response_mask``,
   ``index`` (the ``uid`` of each prompt) and ``config`` only: no log-probs. We wrap
   ``verl.trainer.ppo.ray_trainer.compute_advantage`` (the function both the legacy and the V1 trainer call;
   ``verl.trainer.ppo.v1.utils`` and ``verl.experimental.separation.ray_trainer`` import it from there) so that,
   while it runs, the batch it was given (the ``DataProto``) is visible to calibrl's estimators through a context
   variable. The wrapper changes nothing else: verl's own code then calls the registered estimator and writes
   ``advantages`` and ``returns`` into ``data.batch``. If ``ray_trainer`` is not imported yet (the usual case:
   verl imports this module from its ``__init__``), a one-name import hook wraps it the moment it loads
   (:mod:`calibrl.verl.hooks`).
4. verl's default (V1) trainer (``verl.trainer.ppo.v1.trainer_base.PPOTrainer``): its advantage step builds the
   batch from a fixed field list, so the plugin also reads the reward function's ``answer`` for seed_grpo from the
   rollout queue, and refuses gcpo when the trainer is constructed (verl computes no embeddings)
   (:mod:`calibrl.verl.v1`).
5. Validation dumps (``trainer.validation_data_dir``) of both trainers get ``logprob_mean``, the mean of the
   rollout's token log-probs (:mod:`calibrl.verl.v1`, :mod:`calibrl.verl.legacy`).

Importing needs verl; without it, the import raises an ImportError that says how to set verl up.
"""

from __future__ import annotations

from typing import Any

from calibrl.advantages.registry import EstimatorSpec, estimator_specs, on_register
from calibrl.verl.advantage import (
    PARAMS_ENV,
    estimator_params,
    last_info,
    logger,
    make_adv_estimator,
    masked_row_mean,
    rollout_batch_from_verl,
)
from calibrl.verl.hooks import RAY_TRAINER, is_wrapped, wrap_advantage_step, wrap_compute_advantage
from calibrl.verl.loss import POLICY_LOSSES, make_policy_loss

__all__ = [
    "PARAMS_ENV",
    "POLICY_LOSSES",
    "PREFIX",
    "RAY_TRAINER",
    "estimator_params",
    "install",
    "is_wrapped",
    "last_info",
    "logger",
    "make_adv_estimator",
    "make_policy_loss",
    "masked_row_mean",
    "registered_names",
    "rollout_batch_from_verl",
    "wrap_compute_advantage",
]

PREFIX = "calibrl_"

_REGISTERED: dict[str, str] = {}  # verl name -> calibrl estimator name


def registered_names() -> dict[str, str]:
    """verl estimator name -> calibrl estimator name, for everything this module registered."""
    return dict(_REGISTERED)


def _import_core_algos() -> Any:
    """verl's ``verl.trainer.ppo.core_algos``, or an ImportError that says how to install verl."""
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as exc:
        raise ImportError(
            f"calibrl.verl needs verl (tested with 0.9.1), which could not be imported ({exc}). Install it in its own "
            "environment: `bash scripts/setup_verl_env.sh` creates .venv-verl with verl 0.9.1 and calibrl."
        ) from exc
    return core_algos


def _register_estimators(core_algos: Any) -> None:
    """Every calibrl estimator in verl's registry (:func:`_register_estimator`)."""
    for spec in estimator_specs():
        _register_estimator(core_algos, spec)


def _register_estimator(core_algos: Any, spec: EstimatorSpec) -> None:
    """``spec`` as ``calibrl_<name>``, and as ``<name>`` where verl has no estimator of that name."""
    registry, name = core_algos.ADV_ESTIMATOR_REGISTRY, spec.name
    for verl_name in (PREFIX + name, name):
        current = registry.get(verl_name)
        if current is None:
            core_algos.register_adv_est(verl_name)(make_adv_estimator(name))
            _REGISTERED[verl_name] = name
        elif getattr(current, "calibrl_estimator", None) == name:
            _REGISTERED[verl_name] = name
        # else: verl's own estimator of that name (grpo, rloo) stays; calibrl's is PREFIX + name.


def _register_policy_losses(core_algos: Any) -> None:
    """``calibrl_ppo`` and ``calibrl_gspo`` in verl's policy-loss registry, unless already there."""
    for loss_name, level in POLICY_LOSSES.items():
        if loss_name not in core_algos.POLICY_LOSS_REGISTRY:
            core_algos.register_policy_loss(loss_name)(make_policy_loss(level))


_LISTENING: list[bool] = []


def install() -> dict[str, str]:
    """Register calibrl's estimators (every one registered in calibrl, now and later) and losses in verl; wrap the
    advantage step. Idempotent. Returns :func:`registered_names`."""
    core_algos = _import_core_algos()
    _register_estimators(core_algos)
    if not _LISTENING:  # estimators registered in calibrl from now on reach verl too
        on_register(lambda spec: _register_estimator(core_algos, spec))
        _LISTENING.append(True)
    _register_policy_losses(core_algos)
    wrap_advantage_step()
    return registered_names()


install()
