"""Self-certainty (INTUITOR, arXiv 2505.19590; code sunblaze-ucb/Intuitor): a completion's confidence read from its
full next-token distributions, the mean over its tokens of the KL divergence from the uniform distribution:

    KL(U || p_t) = sum_j (1/V) log((1/V) / p_t(j)) = logsumexp(z_t) - mean_j(z_t) - log V      (z_t: the logits)
    self_certainty(y) = (1 / |y|) sum_t KL(U || p_t)                                            >= 0

0 for a uniform next-token distribution, growing as it concentrates; unlike a log-probability it does not depend on
which token was sampled. INTUITOR uses it as the reward (no verifier).

The authors' code computes ``logsumexp(z) - mean(z)`` per token (``self_certainty_from_logits`` in
verl-intuitor/verl/utils/torch_functional.py; ``_get_per_token_self_certainty`` in open-r1-intuitor), without the
constant ``- log V`` ("equivalent to the original formula as we are going to normalize it in batch");
``subtract_log_vocab=False`` gives their values. verl-intuitor divides the logits by the sampling temperature first
(its actor does for every quantity it reads off the logits), open-r1-intuitor does not: ``temperature`` chooses.

Memory: :func:`chunked_token_self_certainty` projects ``chunk`` positions at a time through the LM head (as
:func:`calibrl.logprobs.chunked_token_logps`), so no [T, V] float32 logits live beyond one chunk.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

__all__ = ["chunked_token_self_certainty", "completion_self_certainty", "token_self_certainty"]


def token_self_certainty(logits: torch.Tensor, *, temperature: float = 1.0,
                         subtract_log_vocab: bool = True) -> torch.Tensor:
    """KL(U || softmax(logits / temperature)) over the last dimension: [..., V] -> [...] float32.

    ``subtract_log_vocab=False``: the authors' ``logsumexp(z) - mean(z)`` (the same minus the constant log V)."""
    if temperature <= 0:
        raise ValueError(f"token_self_certainty: temperature must be > 0, got {temperature}")
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    value = torch.logsumexp(z, dim=-1) - z.mean(dim=-1)
    return value - math.log(logits.shape[-1]) if subtract_log_vocab else value


def chunked_token_self_certainty(hidden: torch.Tensor, *, project: Callable[[torch.Tensor], torch.Tensor],
                                 chunk: int, temperature: float = 1.0,
                                 subtract_log_vocab: bool = True) -> torch.Tensor:
    """:func:`token_self_certainty` of ``project(hidden)``, ``chunk`` positions at a time.

    Args:
        hidden: [N, D] hidden states, each predicting one token.
        project: [n, D] -> [n, V] the model's logits of a chunk (LM head and its post-processing).
        chunk: positions per projection (:func:`calibrl.logprobs.positions_per_chunk` sizes it to a budget).

    Returns:
        [N] float32; the whole [N, V] logits are never built.
    """
    if hidden.dim() != 2:
        raise ValueError(f"chunked_token_self_certainty: hidden must be [N, D], got {tuple(hidden.shape)}")
    if chunk < 1:
        raise ValueError(f"chunked_token_self_certainty: chunk must be >= 1, got {chunk}")
    out = torch.empty(hidden.size(0), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.size(0), chunk):
        end = min(start + chunk, hidden.size(0))
        out[start:end] = token_self_certainty(project(hidden[start:end]), temperature=temperature,
                                              subtract_log_vocab=subtract_log_vocab)
    return out


def completion_self_certainty(per_token: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Self-certainty of each completion: the mean of ``per_token`` [B, T] over its masked tokens -> [B] (0 for a
    completion without tokens)."""
    from calibrl.batch import masked_row_mean

    return masked_row_mean(per_token, completion_mask)
