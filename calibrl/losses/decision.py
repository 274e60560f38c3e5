"""Decision-token calibration loss (arXiv 2601.13284, "calibration-aware RL for decision-making LLMs").

RLVR makes the final decision token of a classification-style completion almost deterministic (p > 0.99 right
or wrong), because the reasoning before it already fixed the answer. The method keeps the GRPO loss on every
completion token except the decision token (its advantage is zeroed, :func:`zero_decision_advantages`) and adds

    lam * mean over completions with a decision of CE(target, q),   q = softmax over the class tokens C

with target = one-hot(chosen class) when the rollout was correct and uniform 1/|C| when it was wrong.

Our readings (the paper's full text was not available to us), each a keyword where it matters:
- q is the softmax of the decision logits restricted to the |C| class tokens (renormalised over C), so the loss
  acts on the relative confidence among classes, which is what "confidence = probability of the decision" measures
  once almost all mass sits on class tokens. ``renormalize=False`` uses the full-vocabulary log-probs of the class
  tokens instead (the uniform target then also pulls probability mass onto the class tokens).
- "Reasoning-decision consistency: the decision probability is kept within [1/|C|, 1]": for a wrong rollout whose
  q(chosen) <= 1/|C| the uniform term is switched off (zero loss, zero gradient), so the uniform target never
  pushes the chosen class below 1/|C| and never flips the argmax away from what the reasoning concluded.
- The mean runs over rows that have a decision (``chosen_class >= 0``); rows without one contribute nothing.
  With none at all the loss is an exact zero that still depends on ``decision_logits`` (so distributed
  backward passes see every parameter).
"""

from __future__ import annotations

import torch


def find_decision_positions(*, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                            class_token_ids: torch.Tensor | list[int]) -> torch.Tensor:
    """Position of the decision token in each completion: the LAST masked position holding a class token.

    completion_ids [N,T] long, completion_mask [N,T] 0/1, class_token_ids [C] -> [N] long, -1 where none.
    """
    class_ids = torch.as_tensor(class_token_ids, device=completion_ids.device, dtype=completion_ids.dtype)
    is_class = torch.isin(completion_ids, class_ids) & completion_mask.bool()  # [N,T]
    positions = torch.arange(completion_ids.shape[1], device=completion_ids.device).expand_as(completion_ids)
    return torch.where(is_class, positions, torch.full_like(positions, -1)).max(dim=1).values


def chosen_classes(*, completion_ids: torch.Tensor, decision_positions: torch.Tensor,
                   class_token_ids: torch.Tensor | list[int]) -> torch.Tensor:
    """Index (0..C-1) into ``class_token_ids`` of the token at each decision position; -1 where no decision.

    completion_ids [N,T], decision_positions [N] (from :func:`find_decision_positions`) -> [N] long.
    """
    class_ids = torch.as_tensor(class_token_ids, device=completion_ids.device, dtype=completion_ids.dtype)
    has = decision_positions >= 0
    tokens = completion_ids.gather(1, decision_positions.clamp(min=0).unsqueeze(1)).squeeze(1)  # [N]
    match = tokens.unsqueeze(1) == class_ids.unsqueeze(0)  # [N,C]
    index = match.long().argmax(dim=1)
    return torch.where(has & match.any(dim=1), index, torch.full_like(index, -1))


def gather_decision_logits(logits: torch.Tensor, decision_positions: torch.Tensor) -> torch.Tensor:
    """Logits that PREDICT the decision token: logits [N,T,V] aligned with the completion tokens (row t scores
    token t, as TRL's per-token log-probs are) -> [N,V]. Rows without a decision get position 0 (masked later)."""
    index = decision_positions.clamp(min=0).view(-1, 1, 1).expand(-1, 1, logits.shape[-1])
    return logits.gather(1, index).squeeze(1)


def decision_token_loss(*, decision_logits: torch.Tensor, class_token_ids: torch.Tensor | list[int],
                        chosen_class: torch.Tensor, correct: torch.Tensor, lam: float,
                        renormalize: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
    """lam * mean over rows with a decision of CE(target, q) on the class tokens (see the module docstring).

    Args:
        decision_logits: [N,V] logits at the step that emits the decision token.
        class_token_ids: [C] vocabulary ids of the class tokens.
        chosen_class: [N] long, index 0..C-1 of the class the rollout chose, -1 = no decision (row ignored).
        correct: [N] bool, whether the rollout was rewarded as correct.
        lam: coefficient (the paper: 1e-3; docs/results/testbed.md: 1 was needed on the tiny testbed model).
        renormalize: q = softmax over the class logits (True) or the full-vocabulary probabilities (False).

    Returns:
        (loss, metrics): metrics ``decision_prob_mean`` (mean q(chosen) over decision rows), ``decision_ce``
        (mean CE before lam, switched-off rows counted as 0), ``frac_uniform_active`` (fraction of wrong decision
        rows whose uniform term is on, q(chosen) > 1/C), ``frac_with_decision``. A mean over no rows is NaN
        (TRL's logger skips NaN values).
    """
    if decision_logits.dim() != 2:
        raise ValueError(f"decision_token_loss: decision_logits must be [N, V], got {tuple(decision_logits.shape)}")
    n = decision_logits.shape[0]
    class_ids = torch.as_tensor(class_token_ids, device=decision_logits.device, dtype=torch.long)
    n_classes = class_ids.numel()
    if n_classes < 2:
        raise ValueError(f"decision_token_loss: need at least 2 class tokens, got {n_classes}")
    chosen_class = chosen_class.to(decision_logits.device).long()
    correct = correct.to(decision_logits.device).bool()
    if chosen_class.shape != (n,) or correct.shape != (n,):
        raise ValueError(f"decision_token_loss: chosen_class {tuple(chosen_class.shape)} and correct "
                         f"{tuple(correct.shape)} must both be [N]={n}")
    if (chosen_class >= n_classes).any() or (chosen_class < -1).any():
        raise ValueError(f"decision_token_loss: chosen_class must lie in -1..{n_classes - 1}")

    logits = decision_logits.float() if decision_logits.dtype in (torch.float16, torch.bfloat16) else decision_logits
    if renormalize:
        log_q = torch.log_softmax(logits[:, class_ids], dim=-1)  # [N,C]
    else:
        log_q = torch.log_softmax(logits, dim=-1)[:, class_ids]  # [N,C]
    has = chosen_class >= 0
    safe_chosen = chosen_class.clamp(min=0)
    log_q_chosen = log_q.gather(1, safe_chosen.unsqueeze(1)).squeeze(1)  # [N]
    q_chosen = log_q_chosen.exp()

    ce_onehot = -log_q_chosen  # [N]
    ce_uniform = -log_q.mean(dim=-1)  # [N]
    uniform_active = has & ~correct & (q_chosen.detach() > 1.0 / n_classes)
    per_row = torch.where(correct, ce_onehot, torch.where(uniform_active, ce_uniform, torch.zeros_like(ce_uniform)))
    per_row = torch.where(has, per_row, torch.zeros_like(per_row))
    n_dec = int(has.sum())
    ce = per_row.sum() / max(n_dec, 1)
    loss = lam * ce
    if n_dec == 0:
        loss = loss + 0.0 * decision_logits.sum()

    with torch.no_grad():
        wrong = has & ~correct
        n_wrong = int(wrong.sum())
        metrics = {
            "decision_prob_mean": float(q_chosen[has].mean()) if n_dec else float("nan"),
            "decision_ce": float(ce.detach()),
            "frac_uniform_active": float(uniform_active.sum()) / n_wrong if n_wrong else float("nan"),
            "frac_with_decision": n_dec / n if n else 0.0,
        }
    return loss, metrics


def zero_decision_advantages(*, advantages: torch.Tensor, completion_mask: torch.Tensor,
                             decision_positions: torch.Tensor) -> torch.Tensor:
    """Per-token advantages [N,T] equal to ``advantages`` ([N] broadcast, or [N,T]) except 0 at each row's decision
    position (rows with position -1 are unchanged). A new tensor; the input is not modified."""
    shape = completion_mask.shape
    if advantages.dim() == 1:
        if advantages.shape[0] != shape[0]:
            raise ValueError(f"zero_decision_advantages: advantages [N]={advantages.shape[0]}, mask {tuple(shape)}")
        out = advantages.unsqueeze(1).expand(shape).clone()
    elif advantages.shape == shape:
        out = advantages.clone()
    else:
        raise ValueError(f"zero_decision_advantages: advantages {tuple(advantages.shape)} vs mask {tuple(shape)}")
    rows = (decision_positions >= 0).nonzero(as_tuple=True)[0]
    out[rows, decision_positions[rows]] = 0.0
    return out
