"""GRPO, Dr.GRPO and RLOO: the reward-only group baselines every calibration method is compared with.

Formulas (per group g of n_g completions of one prompt, rewards r):
    grpo     A_i = (r_i - mean_g(r)) / (std_g(r) + eps)      Shao et al. 2024 (DeepSeekMath); std with Bessel's
                                                            correction and eps = 1e-4, exactly as TRL's GRPOTrainer
    dr_grpo  A_i = r_i - mean_g(r)                           Liu et al. 2025 ("Understanding R1-Zero-like training")
    rloo     A_i = r_i - (1/(n_g - 1)) * sum_{j != i} r_j    Ahmadian et al. 2024 (leave-one-out baseline);
                                                            0 for a group of size 1 (no other sample to compare with).
                                                            Equivalently A_i = n_g/(n_g - 1) * (r_i - mean_g(r)).

Shapes: every function takes flat per-completion vectors [N] and a dense group index [N] (see ``_groups``);
groups may differ in size and need not be contiguous. Output dtype = rewards dtype; the group sums are taken in
at least float32 (bf16 sums over a group of a few hundred samples would be off by tenths).
"""

from __future__ import annotations

import torch

from calibrl.advantages._groups import dense_group_index, group_count, group_mean, group_std, segment_sum
from calibrl.advantages.registry import register_estimator
from calibrl.batch import RolloutBatch


def grpo_advantages(*, rewards: torch.Tensor, group_index: torch.Tensor, n_groups: int, scale: bool = True,
                    eps: float = 1e-4) -> torch.Tensor:
    """GRPO (Shao et al. 2024): A_i = (r_i - mean_g(r)) / (std_g(r) + eps).

    std uses Bessel's correction and eps = 1e-4, exactly as TRL's GRPOTrainer (``scale_rewards="group"``), so the
    numbers match TRL. ``scale=False`` skips the division (Dr.GRPO).
    rewards [N] float, group_index [N] long -> [N] (rewards dtype).
    """
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    mean = group_mean(r, group_index, n_groups)  # [G]
    centred = r - mean[group_index]  # [N]
    if not scale:
        return centred.to(rewards.dtype)
    std = group_std(r, group_index, n_groups, unbiased=True)  # [G]
    return (centred / (std[group_index] + eps)).to(rewards.dtype)


def verl_grpo_advantages(scores: torch.Tensor, group_index: torch.Tensor, n_groups: int, *, eps: float = 1e-6,
                         norm_by_std: bool = True) -> torch.Tensor:
    """verl's GRPO normalisation (``verl/trainer/ppo/core_algos.py`` ``compute_grpo_outcome_advantage``, v0.9.1):
    ``(x - mean_g) / (std_g + eps)`` with the unbiased std and eps = 1e-6, where a group of ONE keeps mean 0 and
    std 1 (so its row gets ``x / (1 + eps)``, not 0); ``norm_by_std=False`` (verl's
    ``norm_adv_by_std_in_grpo=False``) only centres, a one-row group keeping ``x``. [N] -> [N] (scores' dtype,
    summed in at least float32). TRL's GRPO (:func:`grpo_advantages`) differs in eps (1e-4) and in one-row
    groups."""
    x = scores.to(torch.promote_types(scores.dtype, torch.float32))
    single = (group_count(group_index, n_groups, x.dtype) == 1)[group_index]
    mean = torch.where(single, torch.zeros_like(x), group_mean(x, group_index, n_groups)[group_index].to(x.dtype))
    if not norm_by_std:
        return (x - mean).to(scores.dtype)
    std = torch.where(single, torch.ones_like(x),
                      group_std(x, group_index, n_groups, unbiased=True)[group_index].to(x.dtype))
    return ((x - mean) / (std + eps)).to(scores.dtype)


def rloo_advantages(*, rewards: torch.Tensor, group_index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """RLOO: A_i = r_i - mean of the other n_g - 1 rewards of its group; 0 in groups of size 1.

    rewards [N] float, group_index [N] long -> [N] (rewards dtype).
    """
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    count = group_count(group_index, n_groups, r.dtype)  # [G]
    total = segment_sum(r, group_index, n_groups)  # [G]
    n = count[group_index]  # [N]
    others = (total[group_index] - r) / (n - 1.0).clamp_min(1.0)
    return torch.where(n > 1.0, r - others, torch.zeros_like(r)).to(rewards.dtype)


@register_estimator("grpo", inputs=())
def grpo(batch: RolloutBatch, *, eps: float = 1e-4) -> torch.Tensor:
    """Registered ``grpo``: group-normalised advantage (see :func:`grpo_advantages`)."""
    index, n_groups = dense_group_index(batch.group_ids)
    return grpo_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups, eps=eps)


@register_estimator("dr_grpo", inputs=())
def dr_grpo(batch: RolloutBatch) -> torch.Tensor:
    """Registered ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-like training"): A_i = r_i - mean_g(r)."""
    index, n_groups = dense_group_index(batch.group_ids)
    return grpo_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups, scale=False)


@register_estimator("rloo", inputs=())
def rloo(batch: RolloutBatch) -> torch.Tensor:
    """Registered ``rloo``: leave-one-out baseline (see :func:`rloo_advantages`)."""
    index, n_groups = dense_group_index(batch.group_ids)
    return rloo_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups)
