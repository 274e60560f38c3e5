"""INTUITOR (arXiv 2505.19590; code sunblaze-ucb/Intuitor, open-r1-intuitor/src/open_r1/intuitor_trainer.py):
GRPO with the completion's self-certainty as its reward, no verifier.

    A_i = (sc_i - mean_g(sc)) / (std_g(sc) + eps)   [+ GRPO advantage of the rewards, when add_reward_advantage]

``sc_i`` is ``batch.self_certainty`` (:mod:`calibrl.self_certainty`: the mean over the completion's tokens of
KL(uniform || p_t), the rollout policy's next-token distributions at the sampling temperature). The std is unbiased
and eps = 1e-4, as the code's. The code adds the rewards' GRPO advantage when some reward weight is not 0
(``add_reward_advantage=True`` here); its default, the paper's method, has none.

Readings: the code's open-r1 trainer reads the logits of the positions ``[-logits_to_keep:]`` of the full
sequence (shifted by one from the positions that predict the completion tokens) without the temperature; its verl
trainer reads those that predict the completion tokens, divided by the temperature. We follow the verl trainer.
"""

from __future__ import annotations

import torch

from calibrl.advantages._groups import dense_group_index
from calibrl.advantages.grpo import grpo_advantages
from calibrl.advantages.registry import register_estimator
from calibrl.batch import RolloutBatch


@register_estimator("intuitor", inputs={"self_certainty"})
def intuitor(batch: RolloutBatch, *, eps: float = 1e-4, add_reward_advantage: bool = False) -> tuple[torch.Tensor, dict]:
    """Registered ``intuitor``: the group-normalised self-certainty (module docstring). Info:
    ``self_certainty_mean``."""
    batch.require("self_certainty", estimator="intuitor")
    index, n_groups = dense_group_index(batch.group_ids)
    advantages = grpo_advantages(rewards=batch.self_certainty, group_index=index, n_groups=n_groups, eps=eps)
    if add_reward_advantage:
        advantages = advantages + grpo_advantages(rewards=batch.rewards, group_index=index, n_groups=n_groups,
                                                  eps=eps).to(advantages.dtype)
    return advantages, {"self_certainty_mean": float(batch.self_certainty.mean())}
