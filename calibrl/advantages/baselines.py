"""Confidence-aware baselines CAPO compares against: CoDaPO and CDE.

CoDaPO (Zhou et al., "The Easy, the Hard, and the Learnable", ICML 2026; OpenReview O9CYgZFtm7; code
tmlr-group/CoDaPO, ``compute_codapo_advantage`` in alphaapollo/core/generation/verl/trainer/ppo/core_algos.py):
    A_i' = A_i(grpo) * w_g,   w_g = c_g * d_w + weight_offset (0.1)
    c_g  = exp(mean over the group of lpm)          (confidence: exp of the group mean of the responses'
                                                    token-mean log-probs under the old policy; we clamp the
                                                    mean at 0, a no-op for real log-probs, so c <= 1)
    d    = 1 - group accuracy,  d_w = 1 - 4 (d - 0.5)^2   (U-shaped: 1 at d = 0.5, 0 at d = 0 or 1)
What we checked in the reference code (read through the search tool): the GRPO part uses unbiased torch.std and
epsilon = 1e-6 (verl's default), with ``norm_adv_by_std_in_grpo`` choosing Dr.GRPO centring instead; accuracy
counts rewards == 1.0; c uses the masked token mean per response, then the plain mean over the group's
responses, then exp; a group of size 1 keeps mean 0 / std 1 (verl's rule, :func:`verl_grpo_advantages`), so its
row gets r / (1 + eps), as here. Our deviation: "correct" is reward > ``threshold`` (0.5; identical for 0/1
rewards). CoDaPO's resampling of high-value questions (CoDaSampling / CoDaLearning) is a trainer feature and not
part of this advantage.

CDE (Dai et al., arXiv 2509.09675, "Curiosity-Driven Exploration"), actor-wise bonus, as we have it:
    r_i' = r_i + omega * min(|r_i| / kappa, alpha * B_i),   B_i = -lpm_i  (log-perplexity of the response)
then GRPO on r'. The clip |r| / kappa keeps the bonus a bounded fraction of the reward; note that it zeroes the
bonus where r = 0, so with {0, 1} rewards only correct responses receive it (use {-1, 1} rewards for a bonus on
both). omega is annealed over training in the paper: that schedule is the trainer's job (pass the current
omega each step). The paper's default values were not available to us; our defaults omega = 1, kappa = 2,
alpha = 1 cap the bonus at half the reward magnitude. The critic-side (multi-head value variance) bonus needs a
critic and is not implemented here.

Shapes: rewards, logprob_mean, group_index [N] -> advantages [N] in the rewards dtype. Vectorised segment sums.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from calibrl.advantages._groups import dense_group_index, group_mean
from calibrl.advantages.grpo import grpo_advantages, verl_grpo_advantages
from calibrl.advantages.registry import register_estimator
from calibrl.batch import RolloutBatch


def codapo_advantages(*, rewards: torch.Tensor, group_index: torch.Tensor, n_groups: int,
                      logprob_mean: torch.Tensor, weight_offset: float = 0.1, scale: bool = True, eps: float = 1e-6,
                      threshold: float = 0.5) -> tuple[torch.Tensor, dict[str, Any]]:
    """CoDaPO: GRPO advantage * (exp(group mean lpm) * (1 - 4 (d - 1/2)^2) + weight_offset), d = 1 - accuracy.

    -> (advantages [N], info {"weight_mean", "confidence_mean"} over groups).
    """
    work = torch.promote_types(torch.promote_types(rewards.dtype, logprob_mean.dtype), torch.float32)
    accuracy = group_mean((rewards > threshold).to(work), group_index, n_groups)  # [n_groups]
    d = 1.0 - accuracy
    d_w = 1.0 - 4.0 * (d - 0.5) ** 2
    # log-probs are <= 0, so c is a probability; clamping at 0 keeps c <= 1 (and finite) for any input
    confidence = torch.exp(group_mean(logprob_mean.to(work), group_index, n_groups).clamp_max(0.0))
    weight = confidence * d_w + weight_offset  # [n_groups]
    base = verl_grpo_advantages(rewards.to(work), group_index, n_groups, eps=eps, norm_by_std=scale)  # the code's
    advantages = (base * weight[group_index]).to(rewards.dtype)
    present = ~torch.isnan(accuracy)  # a caller-provided n_groups may include empty groups
    return advantages, {"weight_mean": float(weight[present].mean()),
                        "confidence_mean": float(confidence[present].mean())}


def cde_rewards(*, rewards: torch.Tensor, logprob_mean: torch.Tensor, omega: float = 1.0, kappa: float = 2.0,
                alpha: float = 1.0) -> torch.Tensor:
    """CDE shaped reward r' = r + omega * min(|r| / kappa, alpha * (-lpm)) -> [N]."""
    bonus = torch.minimum(rewards.abs() / kappa, alpha * (-logprob_mean))
    return rewards + omega * bonus


def cde_advantages(*, rewards: torch.Tensor, group_index: torch.Tensor, n_groups: int, logprob_mean: torch.Tensor,
                   omega: float = 1.0, kappa: float = 2.0, alpha: float = 1.0, scale: bool = True,
                   eps: float = 1e-4) -> tuple[torch.Tensor, dict[str, Any]]:
    """CDE: GRPO (``scale=False``: Dr.GRPO) on the perplexity-bonus-shaped reward. -> (advantages [N], info)."""
    if not (kappa > 0 and math.isfinite(omega) and math.isfinite(alpha)):
        raise ValueError(f"cde: kappa must be > 0 and omega, alpha finite, got {omega!r}, {kappa!r}, {alpha!r}")
    work = torch.promote_types(torch.promote_types(rewards.dtype, logprob_mean.dtype), torch.float32)
    r = rewards.to(work)
    shaped = cde_rewards(rewards=r, logprob_mean=logprob_mean.to(work), omega=omega, kappa=kappa, alpha=alpha)
    advantages = grpo_advantages(rewards=shaped, group_index=group_index, n_groups=n_groups, scale=scale, eps=eps)
    return advantages.to(rewards.dtype), {"bonus_mean": float((shaped - r).mean())}


@register_estimator("codapo", inputs={"logprob_mean"})
def codapo(batch: RolloutBatch, *, weight_offset: float = 0.1, scale: bool = True, eps: float = 1e-6,
           threshold: float = 0.5) -> tuple[torch.Tensor, dict[str, Any]]:
    """Registered ``codapo`` (needs ``logprob_mean``); see :func:`codapo_advantages`."""
    batch.require("logprob_mean", estimator="codapo")
    index, n_groups = dense_group_index(batch.group_ids)
    return codapo_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups,
                             logprob_mean=batch.logprob_mean, weight_offset=weight_offset, scale=scale, eps=eps,
                             threshold=threshold)


@register_estimator("cde", inputs={"logprob_mean"}, annealed="omega")
def cde(batch: RolloutBatch, *, omega: float = 1.0, kappa: float = 2.0, alpha: float = 1.0, scale: bool = True,
        eps: float = 1e-4) -> tuple[torch.Tensor, dict[str, Any]]:
    """Registered ``cde`` (needs ``logprob_mean``); see :func:`cde_advantages`. Anneal ``omega`` in the trainer."""
    batch.require("logprob_mean", estimator="cde")
    index, n_groups = dense_group_index(batch.group_ids)
    return cde_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups, logprob_mean=batch.logprob_mean,
                          omega=omega, kappa=kappa, alpha=alpha, scale=scale, eps=eps)
