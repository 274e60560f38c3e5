"""calibrl's PPO / GSPO policy loss as verl policy losses, normalised the way verl normalises.

``calibrl_ppo`` (token-level ratio) and ``calibrl_gspo`` (sequence-level ratio, GSPO) run
:func:`calibrl.losses.ppo.policy_loss`, the objective the TRL trainer uses, and rescale it to verl's
data-parallel-global aggregation (:func:`_global_rescale`), so loss and gradients equal verl's ``vanilla`` /
``gspo`` (which add dual-clip for negative advantages; calibrl's loss, like TRL's, has none).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

POLICY_LOSSES = {"calibrl_ppo": "token", "calibrl_gspo": "sequence"}  # verl loss_mode -> calibrl ratio_level


def _global_rescale(mask: torch.Tensor, mode: str, info: dict[str, Any]) -> float:
    """Factor turning calibrl's micro-batch-local aggregation into verl's ``agg_loss`` with global batch info.

    Mirrors the normalisation of ``verl.trainer.ppo.core_algos.agg_loss`` in verl 0.9.1. calibrl's "token-mean"
    divides by this micro-batch's token count and the "seq-mean-*" modes by its row count; verl divides by
    ``batch_num_tokens`` / ``global_batch_size`` (the data-parallel-global totals, or the local non-empty counts
    when absent) and multiplies by ``dp_size``, so gradients do not depend on how the batch is split. The ratio of
    the two denominators restores verl's behaviour exactly.
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
    """verl-signature policy loss running :func:`calibrl.losses.ppo.policy_loss` at ``ratio_level``.

    Mirrors verl 0.9.1's ``verl.trainer.ppo.core_algos.compute_policy_loss_vanilla`` (``ratio_level="token"``)
    and ``compute_policy_loss_gspo`` (``"sequence"``), as registered with ``core_algos.register_policy_loss``:
    the same arguments, the clip range read from the actor config (``clip_ratio``, ``clip_ratio_low``,
    ``clip_ratio_high``, ``global_batch_info``) and the same ``actor/*`` metric keys.
    """
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
