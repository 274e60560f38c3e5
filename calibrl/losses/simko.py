"""SimKO (arXiv 2510.14807): provisional stub with the final signature; being aligned with CLR-Lab/SimKO."""

from __future__ import annotations

import torch

from calibrl.losses.ppo import policy_loss


def simko_policy_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, topk_logprobs: torch.Tensor,
                      old_topk_logprobs: torch.Tensor | None, entropies: torch.Tensor,
                      sampled_is_top1: torch.Tensor, advantages: torch.Tensor, completion_mask: torch.Tensor,
                      correct: torch.Tensor, lam: float = 0.01, top_k: int = 3, entropy_quantile: float = 0.8,
                      neg_scale: float = 1.1, eps_low: float = 0.2, eps_high: float | None = None,
                      aggregation: str = "token-mean") -> tuple[torch.Tensor, dict[str, float]]:
    """Provisional: plain PPO-clip (to be replaced by SimKO's redistribution)."""
    return policy_loss(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
                       completion_mask=completion_mask, eps_low=eps_low, eps_high=eps_high, aggregation=aggregation,
                       entropies=entropies)
