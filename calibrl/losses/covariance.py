"""Clip-Cov and KL-Cov (arXiv 2505.22617, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models"), as verl 0.9.1's ``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov``
(verl/trainer/ppo/core_algos.py, adapted there from PRIME-RL/Entropy-Mechanism-of-RL).

Entropy collapses through the tokens whose log-prob and advantage covary most: a confident token with a high
advantage (or an unlikely one with a low advantage) gets sharpened further. Both losses score every masked token of
the (micro-)batch by the centred product

    cov_t = (A_t - mean(A)) * (logp_t - mean(logp))        (means over the masked tokens of the batch)

and restrain a small share of them:

Clip-Cov: PPO-clip, l_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high)), except that
    ``max(int(clip_cov_ratio * n_tokens), 1)`` tokens drawn at random among those with
    ``clip_cov_lb < cov_t < clip_cov_ub`` that the PPO clip has not already clipped get l_t = 0 (no loss, no
    gradient).
KL-Cov: the unclipped policy gradient l_t = -A_t r_t, plus ``ppo_kl_coef * |logp_t - old_logp_t|`` on the
    ``max(1, int(kl_cov_ratio * n_tokens))`` tokens of largest cov_t (no clip at all, as verl).

Then ``aggregate_loss``. Readings of verl's code, kept here:
- The means, the token count and the selection are those of the tensors passed in: in verl and in the TRL trainer
  that is one micro-batch.
- Clip-Cov's mean of logp is over the masked tokens with verl's ``masked_mean`` (sum / (count + 1e-8)); a token is
  "clipped by the PPO clip" when the clipped term is strictly larger, and such tokens are never drawn. KL-Cov's
  means are plain means over the masked tokens, and its selection runs on the CPU, as verl's.
- Clip-Cov's random draw is ``torch.randperm(n_candidates, generator=generator)`` over the candidates in
  row-major order (``torch.nonzero``), the first ``n_clip`` kept: with ``generator=None`` that is verl's call on
  torch's global CPU generator, so the same seed draws the same tokens.
- ``rollout_is_weights`` [N, T] multiplies the per-token loss before aggregation, as verl's.
"""

from __future__ import annotations

import torch

from calibrl.losses.ppo import aggregate_loss, broadcast_advantages, masked_mean, on_mask, work_dtype

# verl 0.9.1's ActorConfig.policy_loss defaults (verl/workers/config/actor.py). The authors' 7B scripts
# (PRIME-RL/Entropy-Mechanism-of-RL at 8850579, recipe/dapo/7b_*.sh) use Clip-Cov 2e-4 with the PPO clip opened to
# [0, 2], and KL-Cov k_percent 0.2 (a percentage: ratio 2e-3) with coefficient 1, as the shipped recipes do
CLIP_COV_RATIO, CLIP_COV_LB, CLIP_COV_UB = 2e-4, 1.0, 5.0
KL_COV_RATIO, PPO_KL_COEF = 2e-4, 0.1


def _verl_masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl's ``masked_mean``: sum(x m) / (sum(m) + 1e-8), so a selection at a bound's edge matches verl's."""
    return (x * mask).sum() / (mask.sum() + 1e-8)


def _check(name: str, shape: torch.Size, **tensors: torch.Tensor | None) -> None:
    if len(shape) != 2:
        raise ValueError(f"{name}: logprobs must be [N, T], got {tuple(shape)}")
    for key, tensor in tensors.items():
        if tensor is not None and tensor.shape != shape:
            raise ValueError(f"{name}: {key} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")


def _prepared(logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, advantages: torch.Tensor,
              completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs, old_logprobs, advantages [N, T], mask) in the work dtype (at least float32), padding set to 0 so
    junk there (-inf log-probs) reaches neither the covariance means nor the loss; old None = on-policy."""
    work = work_dtype(logprobs)
    mask = completion_mask.to(work)
    old_logprobs = logprobs.detach() if old_logprobs is None else old_logprobs
    adv = broadcast_advantages(advantages.to(work), logprobs.shape)
    return on_mask(logprobs, mask, work), on_mask(old_logprobs, mask, work), on_mask(adv, mask, work), mask


def _metrics(loss: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, selected: torch.Tensor,
             name: str) -> dict[str, float]:
    """``policy_loss``, ``ppo_kl`` (masked mean of old - logp, verl's), ``ppo_kl_abs`` (of |logp - old|) and
    ``<name>_fraction`` (share of the masked tokens selected)."""
    with torch.no_grad():
        return {
            "policy_loss": float(loss),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
            "ppo_kl_abs": float(masked_mean(log_ratio.abs(), mask)),
            f"{name}_fraction": float(masked_mean(selected.to(mask.dtype), mask)),
        }


def clip_cov_selection(*, logprobs: torch.Tensor, advantages: torch.Tensor, completion_mask: torch.Tensor,
                       clipped: torch.Tensor, clip_cov_ratio: float = CLIP_COV_RATIO, clip_cov_lb: float = CLIP_COV_LB,
                       clip_cov_ub: float = CLIP_COV_UB, generator: torch.Generator | None = None) -> torch.Tensor:
    """The tokens Clip-Cov detaches: bool [N, T].

    Candidates: masked tokens with ``clip_cov_lb < cov_t < clip_cov_ub`` (cov_t of the module docstring) that the
    PPO clip has not clipped (``clipped`` [N, T] bool); ``max(int(clip_cov_ratio * n_tokens), 1)`` of them are drawn
    by ``torch.randperm(n_candidates, generator=generator)`` (all of them when there are fewer).
    """
    mask = completion_mask.to(advantages.dtype)
    logprobs = logprobs.detach()
    cov = (advantages - _verl_masked_mean(advantages, mask)) * (logprobs - _verl_masked_mean(logprobs, mask))
    valid = completion_mask.bool()
    candidates = torch.nonzero((cov < clip_cov_ub) & (cov > clip_cov_lb) & valid & ~clipped)  # [K, 2] row-major
    n_clip = max(int(clip_cov_ratio * completion_mask.sum().item()), 1)
    selected = torch.zeros_like(valid)
    if len(candidates) > 0:
        perm = torch.randperm(len(candidates), generator=generator)
        chosen = candidates[perm[: min(n_clip, len(candidates))].to(candidates.device)]
        selected[chosen[:, 0], chosen[:, 1]] = True
    return selected


def clip_cov_policy_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, advantages: torch.Tensor,
                         completion_mask: torch.Tensor, eps_low: float = 0.2, eps_high: float | None = None,
                         clip_cov_ratio: float = CLIP_COV_RATIO, clip_cov_lb: float = CLIP_COV_LB,
                         clip_cov_ub: float = CLIP_COV_UB, aggregation: str = "token-mean",
                         max_completion_length: int | None = None, rollout_is_weights: torch.Tensor | None = None,
                         generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov policy loss (module docstring), equal to verl 0.9.1's ``compute_policy_loss_clip_cov``.

    Args:
        logprobs: [N, T] current log-probs of the sampled tokens (carry the gradient).
        old_logprobs: [N, T] rollout-policy log-probs; None = on-policy (``logprobs.detach()``).
        advantages: [N] (broadcast over tokens) or [N, T].
        completion_mask: [N, T] 0/1.
        eps_low, eps_high: PPO clip range (verl ``clip_ratio_low`` / ``clip_ratio_high``); eps_high None -> eps_low.
        clip_cov_ratio, clip_cov_lb, clip_cov_ub: share of the tokens detached and the covariance window.
        aggregation, max_completion_length: as :func:`calibrl.losses.ppo.aggregate_loss` (verl ``loss_agg_mode``,
            ``loss_scale_factor``).
        rollout_is_weights: [N, T] weights multiplying the per-token loss, or None.
        generator: the random draw's generator; None = torch's global CPU generator, as verl.

    Returns:
        (loss, metrics): ``policy_loss``, ``ppo_kl``, ``ppo_kl_abs``, ``clip_cov_fraction`` (verl's
        ``actor/pg_clipfrac``: the share detached by Clip-Cov, not counting the PPO clip) and ``clip_fraction``
        (tokens the PPO clip clipped).
    """
    shape = logprobs.shape
    _check("clip_cov_policy_loss", shape, old_logprobs=old_logprobs, completion_mask=completion_mask,
           rollout_is_weights=rollout_is_weights)
    if not clip_cov_ratio > 0:
        raise ValueError(f"clip_cov_policy_loss: clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    eps_high = eps_low if eps_high is None else eps_high
    logprobs, old_logprobs, adv, mask = _prepared(logprobs, old_logprobs, advantages, completion_mask)

    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped_term = -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    clipped = (clipped_term > unclipped) & completion_mask.bool()
    selected = clip_cov_selection(logprobs=logprobs, advantages=adv, completion_mask=completion_mask, clipped=clipped,
                                  clip_cov_ratio=clip_cov_ratio, clip_cov_lb=clip_cov_lb, clip_cov_ub=clip_cov_ub,
                                  generator=generator)
    per_token = torch.maximum(unclipped, clipped_term) * (~selected).to(logprobs.dtype)
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    loss = aggregate_loss(per_token, mask, aggregation, max_completion_length)
    metrics = _metrics(loss, log_ratio.detach(), mask, selected, "clip_cov")
    metrics["clip_fraction"] = float(masked_mean(clipped.to(mask.dtype), mask))
    return loss, metrics


def kl_cov_selection(*, logprobs: torch.Tensor, advantages: torch.Tensor, completion_mask: torch.Tensor,
                     kl_cov_ratio: float = KL_COV_RATIO) -> torch.Tensor:
    """The tokens KL-Cov penalises: bool [N, T], the ``max(1, int(kl_cov_ratio * n_tokens))`` masked tokens of
    largest cov_t (plain means over the masked tokens; ``torch.topk`` on the CPU, as verl)."""
    valid = completion_mask.bool()
    selected = torch.zeros_like(valid)
    adv = advantages.detach()[valid].reshape(-1).cpu()
    logp = logprobs.detach()[valid].reshape(-1).cpu()
    if len(adv) == 0:
        return selected
    cov = (adv - adv.mean()) * (logp - logp.mean())
    top = torch.topk(cov, max(1, int(len(cov) * kl_cov_ratio)), largest=True).indices
    flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0][top.to(valid.device)]
    selected.view(-1)[flat] = True
    return selected


def kl_cov_policy_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, advantages: torch.Tensor,
                       completion_mask: torch.Tensor, kl_cov_ratio: float = KL_COV_RATIO,
                       ppo_kl_coef: float = PPO_KL_COEF, aggregation: str = "token-mean",
                       max_completion_length: int | None = None,
                       rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov policy loss (module docstring), equal to verl 0.9.1's ``compute_policy_loss_kl_cov``.

    Args:
        logprobs, old_logprobs, advantages, completion_mask, aggregation, max_completion_length,
            rollout_is_weights: as :func:`clip_cov_policy_loss`.
        kl_cov_ratio: share of the tokens penalised (top covariance).
        ppo_kl_coef: weight of ``|logp - old_logp|`` on them (verl's config default 0.1).

    Returns:
        (loss, metrics): ``policy_loss``, ``ppo_kl``, ``ppo_kl_abs`` (verl's ``actor/ppo_kl`` for this loss) and
        ``kl_cov_fraction`` (share of the tokens penalised).
    """
    shape = logprobs.shape
    _check("kl_cov_policy_loss", shape, old_logprobs=old_logprobs, completion_mask=completion_mask,
           rollout_is_weights=rollout_is_weights)
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov_policy_loss: kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    logprobs, old_logprobs, adv, mask = _prepared(logprobs, old_logprobs, advantages, completion_mask)

    log_ratio = logprobs - old_logprobs
    selected = kl_cov_selection(logprobs=logprobs, advantages=adv, completion_mask=completion_mask,
                                kl_cov_ratio=kl_cov_ratio)
    per_token = -adv * torch.exp(log_ratio) + ppo_kl_coef * log_ratio.abs() * selected.to(logprobs.dtype)
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    loss = aggregate_loss(per_token, mask, aggregation, max_completion_length)
    return loss, _metrics(loss, log_ratio.detach(), mask, selected, "kl_cov")
