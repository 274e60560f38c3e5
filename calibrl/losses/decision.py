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

Stationary points (derived and checked in docs/losses.md, "Stationary points of the decision-token term"; P(c) is
the probability that choosing class c is correct). The paper's target (``target="onehot_uniform"``) is calibrated,
q(c) = P(c), only for two classes sampled on-policy without the gate. The gate makes it overconfident (two classes:
q = (3P - 1) / (2P) for the majority class, 0.786 at P = 0.7); with more classes sampled on-policy it settles at
q(c) proportional to 1 / (1 - P(c)); when the decision copies the reasoning's conclusion, at q(c) = P + (1 - P)/|C|.
``target="binary"`` (our addition) is the binary cross-entropy of q(chosen) against 1[correct]:

    correct: -log q(c)        wrong: -log(1 - q(c))

Its only interior stationary point is q(c) = P(c), on-policy for any |C| and in the copy case (there whatever the
other classes do); with the gate on it settles at max(P, 1/|C|) in the copy case but is underconfident on-policy,
so its gate is off unless asked for.
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


DECISION_TARGETS = ("onehot_uniform", "binary")


def log_one_minus_prob(log_probs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log(1 - p[index]) = logsumexp over the other columns of ``log_probs``, exact even where p[index] -> 1.

    log_probs [N,M] (a normalised log-distribution over M entries), index [N] long in 0..M-1 -> [N].
    """
    others = log_probs.scatter(1, index.unsqueeze(1), float("-inf"))
    return torch.logsumexp(others, dim=-1)


def decision_token_loss(*, decision_logits: torch.Tensor, class_token_ids: torch.Tensor | list[int],
                        chosen_class: torch.Tensor, correct: torch.Tensor, lam: float,
                        renormalize: bool = True, target: str = "onehot_uniform",
                        consistency_gate: bool | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """lam * mean over rows with a decision of CE(target, q) on the class tokens (see the module docstring).

    Per row, with c the chosen class and q = the class distribution:

        target="onehot_uniform" (the paper):  correct: -log q(c)    wrong: -(1/|C|) sum_j log q(j)
        target="binary" (ours):               correct: -log q(c)    wrong: -log(1 - q(c))

    The consistency gate switches a wrong row's term off (zero loss and gradient) while q(c) <= 1/|C|.

    Args:
        decision_logits: [N,V] logits at the step that emits the decision token.
        class_token_ids: [C] vocabulary ids of the class tokens.
        chosen_class: [N] long, index 0..C-1 of the class the rollout chose, -1 = no decision (row ignored).
        correct: [N] bool, whether the rollout was rewarded as correct.
        lam: coefficient (the paper: 1e-3; docs/results/testbed.md: 1 was needed on the tiny testbed model).
        renormalize: q = softmax over the class logits (True) or the full-vocabulary probabilities (False; then
            1 - q(c) of the binary target is the probability of every other vocabulary token).
        target: ``"onehot_uniform"`` (the paper's; overconfident at its stationary points except for two classes
            sampled on-policy without the gate) or ``"binary"`` (stationary at q(c) = P(correct | c)).
        consistency_gate: switch off wrong rows with q(chosen) <= 1/|C| ("the decision probability is kept within
            [1/|C|, 1]"). None = the target's default: on for ``"onehot_uniform"`` (our reading of the paper), off
            for ``"binary"`` (on, it biases on-policy decisions; docs/losses.md).

    Returns:
        (loss, metrics): metrics ``decision_prob_mean`` (mean q(chosen) over decision rows), ``decision_ce``
        (mean CE before lam, switched-off rows counted as 0), the fraction of wrong decision rows whose term is
        on (``frac_uniform_active`` for the paper's target, ``frac_wrong_active`` for the binary one),
        ``frac_with_decision``. A mean over no rows is NaN (TRL's logger skips NaN values).
    """
    if target not in DECISION_TARGETS:
        raise ValueError(f"decision_token_loss: target must be one of {DECISION_TARGETS}, got {target!r}")
    if consistency_gate is None:
        consistency_gate = target == "onehot_uniform"
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
    has = chosen_class >= 0
    safe_chosen = chosen_class.clamp(min=0)
    if renormalize:
        log_dist = torch.log_softmax(logits[:, class_ids], dim=-1)  # [N,C]
        log_q = log_dist
        chosen_column = safe_chosen  # column of the chosen class in log_dist
    else:
        log_dist = torch.log_softmax(logits, dim=-1)  # [N,V]
        log_q = log_dist[:, class_ids]  # [N,C]
        chosen_column = class_ids[safe_chosen]
    log_q_chosen = log_q.gather(1, safe_chosen.unsqueeze(1)).squeeze(1)  # [N]
    q_chosen = log_q_chosen.exp()

    ce_correct = -log_q_chosen  # [N]
    if target == "onehot_uniform":
        ce_wrong = -log_q.mean(dim=-1)  # [N] CE against the uniform target over C
    else:
        ce_wrong = -log_one_minus_prob(log_dist, chosen_column)  # [N] -log(1 - q(c))
    wrong_active = has & ~correct
    if consistency_gate:
        wrong_active = wrong_active & (q_chosen.detach() > 1.0 / n_classes)
    per_row = torch.where(correct, ce_correct, torch.where(wrong_active, ce_wrong, torch.zeros_like(ce_wrong)))
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
            ("frac_uniform_active" if target == "onehot_uniform" else "frac_wrong_active"):
                float(wrong_active.sum()) / n_wrong if n_wrong else float("nan"),
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
