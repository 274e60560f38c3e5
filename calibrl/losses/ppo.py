"""PPO-clip policy loss with token- or sequence-level (GSPO) importance ratios, verl's aggregations and a k3 KL.

Pure torch, no trainer knowledge: every engine adapter (TRL, verl, the testbed) calls :func:`policy_loss` with
per-token tensors it already has.

Shapes: ``N`` completions, ``T`` completion positions (right-padded; ``completion_mask`` is 1 on real tokens).

Formulas
--------
Token ratio (PPO):      r_t = exp(logp_t - old_logp_t)
Sequence ratio (GSPO, arXiv 2507.18071):
                        s_i = exp( mean over the masked tokens of (logp_t - old_logp_t) )
    used in its token-level form  s_i,t = sg[s_i] * pi_t / sg[pi_t]  (value s_i at every token, gradient
    s_i * d logp_t), exactly as TRL's ``importance_sampling_level="sequence"`` and verl's ``gspo`` loss.
    With one advantage per completion this gives the same loss value and the same gradient as TRL 1.16's
    ``_compute_loss`` (which keeps the ratio as an [N, 1] tensor); with per-token advantages [N, T] the
    token-level form lets each token keep its own sign of advantage in the clip (GSPO-token, eq. 13 of the paper).
Clipped surrogate:      l_t = -min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)   (eps_high=None -> eps_low)
KL (k3, Schulman 2020): kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1 >= 0, added as kl_coef * agg(kl).
Aggregation (verl ``agg_loss`` names):
    "token-mean"              sum_{i,t} m l / sum_{i,t} m                       (DAPO; TRL "bnpo", and "dapo" for one
                                                                                process without accumulation: TRL's
                                                                                dapo divides by the whole generation
                                                                                batch's token count)
    "seq-mean-token-mean"     mean_i [ sum_t m l / max(1, sum_t m) ]            (GRPO; TRL loss_type="grpo")
    "seq-mean-token-sum"      mean_i [ sum_t m l ]
    "seq-mean-token-sum-norm" sum_{i,t} m l / (N * max_completion_length)       (Dr.GRPO; TRL "dr_grpo")
    "seq-mean" divides by all N rows (an all-masked row counts as a zero loss), as TRL does. verl 0.9's
    ``agg_loss`` divides by the non-empty rows (or its data-parallel ``global_batch_size``) instead; the verl
    adapter (:mod:`calibrl.verl`) rescales to exactly that. Old verl releases divided "seq-mean-token-sum-norm"
    by L only (no 1/N): the same direction, a learning rate N times larger.
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
RATIO_LEVELS = ("token", "sequence")


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1.  [N,T], [N,T] -> [N,T].

    Non-negative, zero where the two log-probs are equal; the same formula as TRL's GRPOTrainer (``beta > 0``).
    """
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def on_mask(x: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` [N,T] cast to ``dtype`` with the positions outside ``mask`` set to 0.

    Padding may hold anything (-inf log-probs included); zeroing it before any arithmetic keeps inf * 0 = NaN out
    of both the loss and its gradient (a ``torch.where`` after the arithmetic would still back-propagate NaN).
    """
    return torch.where(mask.bool(), x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))


def work_dtype(logprobs: torch.Tensor) -> torch.dtype:
    """The dtype the losses compute in: at least float32, so bf16 log-probs do not make bf16 sums and ratios
    (TRL keeps its advantages in float32, which promotes its per-token loss the same way)."""
    return torch.promote_types(logprobs.dtype, torch.float32)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` is 1 (0 for an empty mask)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                   max_completion_length: int | None = None) -> torch.Tensor:
    """Reduce a per-token loss [N,T] to a scalar under ``mask`` [N,T] (0/1); ``mode`` as verl's ``agg_loss``.

    ``max_completion_length`` is the constant divisor of "seq-mean-token-sum-norm" (Dr.GRPO); None uses T
    (``per_token.shape[-1]``), as verl does. Pass the generation limit to keep it constant across batches, as TRL
    does. Empty masks give 0, never NaN.
    """
    if per_token.shape != mask.shape:
        raise ValueError(f"aggregate_loss: per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} differ")
    mask = mask.to(per_token.dtype)
    if mode == "token-mean":
        return masked_mean(per_token, mask)
    masked = per_token * mask
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if mode == "seq-mean-token-sum":
        return masked.sum(-1).mean()
    if mode == "seq-mean-token-sum-norm":
        length = per_token.shape[-1] if max_completion_length is None else max_completion_length
        if length <= 0:
            raise ValueError(f"aggregate_loss: max_completion_length must be positive, got {length}")
        return masked.sum() / (per_token.shape[0] * length)
    raise ValueError(f"aggregate_loss: unknown mode {mode!r}; choose one of {AGGREGATIONS}")


def _check_2d(name: str, tensor: torch.Tensor, shape: torch.Size) -> None:
    if tensor.shape != shape:
        raise ValueError(f"policy_loss: {name} has shape {tuple(tensor.shape)}, expected {tuple(shape)} ([N, T])")


def broadcast_advantages(advantages: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Advantages [N] (one per completion) or [N,T] (per token) -> [N,T]."""
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        return advantages.unsqueeze(1).expand(shape)
    if advantages.shape == shape:
        return advantages
    raise ValueError(f"advantages have shape {tuple(advantages.shape)}, expected [N]={shape[0]} or {tuple(shape)}")


def log_importance_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor,
                         level: str = "token") -> torch.Tensor:
    """log r [N,T]: token level ``logp - old``; sequence level (GSPO-token) ``sg[log s_i] + logp - sg[logp]``."""
    log_ratio = logprobs - old_logprobs
    if level == "token":
        return log_ratio
    if level == "sequence":
        mask = mask.to(log_ratio.dtype)
        seq = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # [N], log s_i
        return seq.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    raise ValueError(f"unknown ratio_level {level!r}; choose one of {RATIO_LEVELS}")


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float,
                      eps_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO-clip per-token loss -min(r A, clip(r) A) [N,T] and the low / high clip indicators [N,T] (bool).

    A token is "low clipped" when r < 1 - eps_low and A < 0, "high clipped" when r > 1 + eps_high and A > 0: the
    two cases where the clip removes the gradient (TRL's clip_ratio/low_mean and high_mean).
    """
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    low = (ratio < 1.0 - eps_low) & (advantages < 0)
    high = (ratio > 1.0 + eps_high) & (advantages > 0)
    return per_token, low, high


@torch.no_grad()
def clip_metrics(loss: torch.Tensor, ratio: torch.Tensor, low: torch.Tensor, high: torch.Tensor,
                 mask: torch.Tensor) -> dict[str, float]:
    """``policy_loss``, ``clip_fraction`` (= low + high), ``clip_fraction_low/high``, ``ratio_mean``: token means."""
    low_frac = float(masked_mean(low.to(mask.dtype), mask))
    high_frac = float(masked_mean(high.to(mask.dtype), mask))
    return {
        "policy_loss": float(loss),
        "clip_fraction": low_frac + high_frac,
        "clip_fraction_low": low_frac,
        "clip_fraction_high": high_frac,
        "ratio_mean": float(masked_mean(ratio, mask)),
    }


def policy_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, advantages: torch.Tensor,
                completion_mask: torch.Tensor, eps_low: float = 0.2, eps_high: float | None = None,
                ratio_level: str = "token", aggregation: str = "token-mean",
                max_completion_length: int | None = None, ref_logprobs: torch.Tensor | None = None,
                kl_coef: float = 0.0, entropies: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss (token ratio, or GSPO's sequence ratio) aggregated as verl names it, plus kl_coef * k3 KL.

    Args:
        logprobs: [N,T] current-policy log-probs of the sampled tokens (carries the gradient).
        old_logprobs: [N,T] rollout-policy log-probs (detached). None means on-policy: ``logprobs.detach()``.
        advantages: [N] (broadcast over tokens) or [N,T].
        completion_mask: [N,T] 0/1 (bool or float).
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high]; eps_high None -> eps_low.
        ratio_level: "token" (PPO/GRPO) or "sequence" (GSPO, TRL importance_sampling_level="sequence").
        aggregation: "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum" | "seq-mean-token-sum-norm".
        max_completion_length: divisor of "seq-mean-token-sum-norm" (None -> T).
        ref_logprobs: [N,T] reference-model log-probs; when given the KL is reported, and added if kl_coef != 0.
        kl_coef: weight of the aggregated k3 KL (TRL's beta).
        entropies: [N,T] per-token entropies, reported only (masked mean).

    Returns:
        (loss, metrics): scalar loss; metrics (floats) ``policy_loss``, ``clip_fraction`` (= low + high),
        ``clip_fraction_low``, ``clip_fraction_high``, ``ratio_mean`` (masked token mean of the ratio used in the
        clip; for "sequence" that is s_i at every token), ``kl`` (if ref_logprobs) and ``entropy`` (if entropies).
    """
    shape = logprobs.shape
    if logprobs.dim() != 2:
        raise ValueError(f"policy_loss: logprobs must be [N, T], got {tuple(shape)}")
    if old_logprobs is None:
        old_logprobs = logprobs.detach()
    _check_2d("old_logprobs", old_logprobs, shape)
    _check_2d("completion_mask", completion_mask, shape)
    if eps_high is None:
        eps_high = eps_low
    work = work_dtype(logprobs)
    mask = completion_mask.to(work)
    logprobs, old_logprobs = on_mask(logprobs, mask, work), on_mask(old_logprobs, mask, work)
    adv = broadcast_advantages(advantages.to(work), shape)

    ratio = torch.exp(log_importance_ratio(logprobs, old_logprobs, mask, ratio_level))
    per_token, low, high = clipped_surrogate(ratio, adv, eps_low, eps_high)
    pg_loss = aggregate_loss(per_token, mask, aggregation, max_completion_length)
    loss = pg_loss

    metrics = clip_metrics(pg_loss, ratio, low, high, mask)
    if ref_logprobs is not None:
        _check_2d("ref_logprobs", ref_logprobs, shape)
        kl = kl_k3(logprobs, on_mask(ref_logprobs, mask, work))
        kl_agg = aggregate_loss(kl, mask, aggregation, max_completion_length)
        if kl_coef != 0.0:
            loss = loss + kl_coef * kl_agg
        metrics["kl"] = float(masked_mean(kl.detach(), mask))
    elif kl_coef != 0.0:
        raise ValueError("policy_loss: kl_coef != 0 needs ref_logprobs")
    if entropies is not None:
        _check_2d("entropies", entropies, shape)
        metrics["entropy"] = float(masked_mean(on_mask(entropies.detach(), mask, work), mask))
    return loss, metrics
