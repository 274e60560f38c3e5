"""SimKO: Simple Pass@K Optimization (arXiv 2510.14807), following the authors' code
(CLR-Lab/SimKO, verl/trainer/ppo/core_algos.py ``compute_policy_loss_simko`` and workers/actor/dp_actor.py).

PPO-clip with two token-level changes, both only at "forking" tokens: tokens whose entropy is above the
``entropy_quantile`` quantile of the entropies of their own completion (per row, over the masked tokens,
linear interpolation as ``torch.quantile``, strict ``>``).

1. Correct completions (reward 1): the importance ratio becomes
       r~_t = (1 - lam) r_t + (lam / K) sum_{k in top-K} sg[r_t] / sg[r_k] * r_k,      r_k = pi(k) / pi_old(k)
   Its VALUE is r_t (every top-K term evaluates to r_t), so clipping and the loss value are PPO's; its GRADIENT
   is (1 - lam) r_t grad log pi(y_t) + (lam / K) r_t sum_k grad log pi(k): a fraction lam of the positive update
   is spread over the K most likely tokens instead of sharpening only the sampled one. ``pi_old(k)`` cancels
   exactly (SimKO adds 1e-8 to sg[r_k]; we reproduce that when ``old_topk_logprobs`` is given and use the
   cancelled form when it is None, which differs by at most ~1e-8 relative).
2. Completions with a negative advantage: at forking tokens where the sampled token is the current policy's top-1,
   the advantage is multiplied by ``neg_scale`` (1.1): a stronger push down on over-confident top-1 errors.

Then the usual -min(r~ A, clip(r~, 1 - eps_low, 1 + eps_high) A), aggregated ("token-mean" in SimKO).

Where the code differs from the paper's summary (we follow the code):
- the negative branch is selected by the SIGN OF THE ADVANTAGE (sum over the completion's tokens < 0), not by
  "incorrect"; with GRPO and binary rewards the two coincide except in all-wrong groups (A = 0, no effect).
- "correct" is reward == 1 exactly (``token_level_scores.sum(-1) == 1``); pass ``correct`` accordingly.
- top-K log-probs, the top-1 indicator and the entropies are those of the CURRENT forward pass (dp_actor computes
  them from the logits being trained; entropies are detached); the rollout policy's top-K log-probs only enter
  through the cancelled sg[r_k].
- the clip is symmetric (``cliprange``) in the code; ``eps_high`` is our addition (None -> eps_low).
- the entropy quantile is 0.8 in the first release (hard-coded ``q=0.80``); a later commit made it a parameter
  ``tau`` with default 1.0, which with the strict ``>`` switches both changes off unless a caller sets it.
  We keep 0.8 (the paper's "top 20% entropy tokens").
"""

from __future__ import annotations

import torch

from calibrl.losses.ppo import (aggregate_loss, broadcast_advantages, clip_metrics, clipped_surrogate, masked_mean,
                                on_mask, work_dtype)

_SIMKO_EPS = 1e-8  # SimKO's epsilon in sg[r_t] / (sg[r_k] + eps)


def row_quantile(values: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """Per-row q-quantile of ``values`` [N,T] over the masked entries (linear interpolation, as torch.quantile).

    Rows without masked entries get +inf (nothing lies above it). -> [N].
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must lie in [0, 1], got {q}")
    mask = mask.bool()
    counts = mask.sum(-1)  # [N]
    filled = torch.where(mask, values, torch.full_like(values, float("inf")))
    ordered = filled.sort(dim=-1).values  # valid entries first, ascending
    pos = q * (counts - 1).clamp(min=0).to(values.dtype)  # [N]
    lo = pos.floor().long()
    hi = pos.ceil().long()
    v_lo = ordered.gather(1, lo.unsqueeze(1)).squeeze(1)
    v_hi = ordered.gather(1, hi.unsqueeze(1)).squeeze(1)
    frac = pos - lo.to(values.dtype)
    out = v_lo + (v_hi - v_lo) * frac
    out = torch.where(hi == lo, v_lo, out)  # avoid inf - inf
    return torch.where(counts > 0, out, torch.full_like(out, float("inf")))


def simko_policy_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, topk_logprobs: torch.Tensor,
                      old_topk_logprobs: torch.Tensor | None = None, entropies: torch.Tensor,
                      sampled_is_top1: torch.Tensor, advantages: torch.Tensor, completion_mask: torch.Tensor,
                      correct: torch.Tensor, lam: float = 0.01, top_k: int = 3, entropy_quantile: float = 0.8,
                      neg_scale: float = 1.1, eps_low: float = 0.2, eps_high: float | None = None,
                      aggregation: str = "token-mean", max_completion_length: int | None = None,
                      ) -> tuple[torch.Tensor, dict[str, float]]:
    """SimKO policy loss (see the module docstring for the formulas and how they follow CLR-Lab/SimKO).

    Args:
        logprobs: [N,T] current log-probs of the sampled tokens (carry the gradient).
        old_logprobs: [N,T] rollout-policy log-probs; None = on-policy (``logprobs.detach()``).
        topk_logprobs: [N,T,K'] current log-probs of the current policy's top-K' tokens (carry the gradient);
            the first ``top_k`` columns are used (SimKO: ``torch.topk(logits, top_k)``, most likely first).
        old_topk_logprobs: [N,T,K'] rollout log-probs of the same tokens, or None (they cancel; see above).
        entropies: [N,T] per-token entropies of the current policy (detached here).
        sampled_is_top1: [N,T] bool, the sampled token is the current argmax.
        advantages: [N] or [N,T].
        completion_mask: [N,T] 0/1.
        correct: [N] bool (SimKO: reward == 1); a float tensor counts as correct where it equals 1.
        lam: share of the positive update spread over the top-K (SimKO ``mix_topk_coef``, 0.01).
        top_k: K (SimKO ``top_k``, 3).
        entropy_quantile: per-completion entropy quantile above which a token is a forking token (0.8).
        neg_scale: advantage multiplier at top-1 forking tokens of negative-advantage completions (1.1).
        eps_low, eps_high, aggregation, max_completion_length: as :func:`calibrl.losses.ppo.policy_loss`.

    Returns:
        (loss, metrics): ``policy_loss``, ``clip_fraction`` (+ ``_low``/``_high``), ``ratio_mean``, ``entropy``,
        ``simko_frac_forking`` (masked tokens above the quantile), ``simko_frac_topk_mixed`` (masked tokens whose
        ratio is mixed), ``simko_frac_neg_scaled`` (masked tokens whose advantage is scaled).
    """
    shape = logprobs.shape
    if logprobs.dim() != 2:
        raise ValueError(f"simko_policy_loss: logprobs must be [N, T], got {tuple(shape)}")
    if topk_logprobs.dim() != 3 or topk_logprobs.shape[:2] != shape:
        raise ValueError(f"simko_policy_loss: topk_logprobs must be [N, T, K], got {tuple(topk_logprobs.shape)}")
    if not 1 <= top_k <= topk_logprobs.shape[-1]:
        raise ValueError(f"simko_policy_loss: top_k={top_k} but topk_logprobs has {topk_logprobs.shape[-1]} columns")
    for name, tensor in (("entropies", entropies), ("sampled_is_top1", sampled_is_top1),
                         ("completion_mask", completion_mask)):
        if tensor.shape != shape:
            raise ValueError(f"simko_policy_loss: {name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    if correct.shape != (shape[0],):
        raise ValueError(f"simko_policy_loss: correct must be [N]={shape[0]}, got {tuple(correct.shape)}")
    if old_logprobs is None:
        old_logprobs = logprobs.detach()
    if eps_high is None:
        eps_high = eps_low

    work = work_dtype(logprobs)
    mask = completion_mask.to(work)
    mask_bool = completion_mask.bool()
    logprobs, old_logprobs = on_mask(logprobs, mask, work), on_mask(old_logprobs, mask, work)
    topk_logprobs = on_mask(topk_logprobs, mask.unsqueeze(-1).expand_as(topk_logprobs), work)
    if old_topk_logprobs is not None and old_topk_logprobs.shape == topk_logprobs.shape:
        old_topk_logprobs = on_mask(old_topk_logprobs, mask.unsqueeze(-1).expand_as(topk_logprobs), work)
    entropies = on_mask(entropies.detach(), mask, work)
    adv = broadcast_advantages(advantages.to(work), shape)

    threshold = row_quantile(entropies, mask_bool, entropy_quantile)  # [N]
    forking = (entropies > threshold.unsqueeze(1)) & mask_bool  # [N,T]

    # 1. top-K redistribution on correct completions
    ratio_sampled = torch.exp(logprobs - old_logprobs)  # [N,T]
    topk = topk_logprobs[..., :top_k]
    if old_topk_logprobs is None:
        topk_terms = ratio_sampled.detach().unsqueeze(-1) * torch.exp(topk - topk.detach())
    else:
        if old_topk_logprobs.shape != topk_logprobs.shape:
            raise ValueError("simko_policy_loss: old_topk_logprobs must match topk_logprobs "
                             f"({tuple(old_topk_logprobs.shape)} vs {tuple(topk_logprobs.shape)})")
        ratio_k = torch.exp(topk - old_topk_logprobs[..., :top_k])
        topk_terms = ratio_sampled.detach().unsqueeze(-1) / (ratio_k.detach() + _SIMKO_EPS) * ratio_k
    # SimKO: correct = reward == 1; a float tensor is read that way (a partial reward of 0.5 is not correct)
    correct = (correct == 1) if correct.is_floating_point() else correct.bool()
    mixed = correct.to(mask_bool.device).unsqueeze(1) & forking  # [N,T]
    mix = lam * mixed.to(work)
    ratio = (1.0 - mix) * ratio_sampled + (mix / top_k) * topk_terms.sum(-1)

    # 2. stronger negative push at over-confident forking tokens
    negative = (adv * mask).sum(-1) < 0  # [N], SimKO: advantages.sum(-1) < 0
    scaled = negative.unsqueeze(1) & sampled_is_top1.bool() & forking
    adv = torch.where(scaled, adv * neg_scale, adv)

    per_token, low, high = clipped_surrogate(ratio, adv, eps_low, eps_high)
    loss = aggregate_loss(per_token, mask, aggregation, max_completion_length)

    metrics = clip_metrics(loss, ratio, low, high, mask)
    metrics["entropy"] = float(masked_mean(entropies.to(mask.dtype), mask))
    for name, indicator in (("forking", forking), ("topk_mixed", mixed), ("neg_scaled", scaled)):
        metrics[f"simko_frac_{name}"] = float(masked_mean(indicator.to(mask.dtype), mask))
    return loss, metrics
