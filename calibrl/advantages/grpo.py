"""GRPO, Dr.GRPO and RLOO: the reward-only group baselines every calibration method is compared with.

Shapes: every function takes flat per-completion vectors [N] and a dense group index [N] (see ``_groups``).
"""

from __future__ import annotations

import torch

from calibrl.advantages._groups import dense_group_index, group_mean, group_std
from calibrl.advantages.registry import register_estimator
from calibrl.batch import RolloutBatch


def grpo_advantages(*, rewards: torch.Tensor, group_index: torch.Tensor, n_groups: int, scale: bool = True,
                    eps: float = 1e-4) -> torch.Tensor:
    """GRPO (Shao et al. 2024): A_i = (r_i - mean_g(r)) / (std_g(r) + eps).

    std uses Bessel's correction and eps = 1e-4, exactly as TRL's GRPOTrainer (``scale_rewards="group"``), so the
    numbers match TRL. ``scale=False`` skips the division (Dr.GRPO).
    rewards [N] float, group_index [N] long -> [N].
    """
    mean = group_mean(rewards, group_index, n_groups)  # [G]
    centred = rewards - mean[group_index]  # [N]
    if not scale:
        return centred
    std = group_std(rewards, group_index, n_groups, unbiased=True)  # [G]
    return centred / (std[group_index] + eps)


@register_estimator("grpo")
def grpo(batch: RolloutBatch, *, eps: float = 1e-4) -> torch.Tensor:
    """Registered ``grpo``: group-normalised advantage (see :func:`grpo_advantages`)."""
    index, n_groups = dense_group_index(batch.group_ids)
    return grpo_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups, eps=eps)


@register_estimator("dr_grpo")
def dr_grpo(batch: RolloutBatch) -> torch.Tensor:
    """Registered ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-like training"): A_i = r_i - mean_g(r)."""
    index, n_groups = dense_group_index(batch.group_ids)
    return grpo_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups, scale=False)
