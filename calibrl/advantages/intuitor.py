"""INTUITOR (arXiv 2505.19590; code sunblaze-ucb/Intuitor at 3f0cdd7): GRPO with the completion's self-certainty as
its reward, no verifier. The default follows the authors' verl trainer (``verl-intuitor``: the self-certainty
enters verl's ``compute_grpo_outcome_advantage`` as the score):

    A_i = (sc_i - mean_g(sc)) / (std_g(sc) + eps)   [+ the same of the rewards, when add_reward_advantage]

with verl's rules (:func:`calibrl.advantages.grpo.verl_grpo_advantages`): unbiased std, eps = 1e-6, a group of one
row keeps mean 0 and std 1 (its advantage is its own self-certainty / (1 + eps)), and ``norm_by_std=False``
(verl's ``algorithm.norm_adv_by_std_in_grpo=False``) only centres. ``sc_i`` is ``batch.self_certainty``
(:mod:`calibrl.self_certainty`: the mean over the completion's tokens of KL(uniform || p_t), the rollout policy's
next-token distributions at the sampling temperature, as verl-intuitor divides the logits by it).

The authors' open-r1 trainer (``open-r1-intuitor/src/open_r1/intuitor_trainer.py``) differs: eps = 1e-4 (``eps``),
a one-row group's std is NaN there (TRL refuses such groups), and it adds the rewards' GRPO advantage when some
reward weight is not 0 (``add_reward_advantage=True``); its default, the paper's method, has none. It also reads
the logits of the positions ``[-logits_to_keep:]`` of the full sequence (shifted by one from the positions that
predict the completion tokens) without the temperature; we follow the verl trainer.
"""

from __future__ import annotations

import torch

from calibrl.advantages._groups import dense_group_index
from calibrl.advantages.grpo import verl_grpo_advantages
from calibrl.advantages.registry import register_estimator
from calibrl.batch import RolloutBatch


@register_estimator("intuitor", inputs={"self_certainty"})
def intuitor(batch: RolloutBatch, *, eps: float = 1e-6, norm_by_std: bool = True,
             add_reward_advantage: bool = False) -> tuple[torch.Tensor, dict]:
    """Registered ``intuitor``: the group-normalised self-certainty (module docstring). Info:
    ``self_certainty_mean``."""
    batch.require("self_certainty", estimator="intuitor")
    index, n_groups = dense_group_index(batch.group_ids)
    advantages = verl_grpo_advantages(batch.self_certainty, index, n_groups, eps=eps, norm_by_std=norm_by_std)
    if add_reward_advantage:
        advantages = advantages + verl_grpo_advantages(batch.rewards, index, n_groups, eps=eps,
                                                       norm_by_std=norm_by_std).to(advantages.dtype)
    return advantages, {"self_certainty_mean": float(batch.self_certainty.mean())}
