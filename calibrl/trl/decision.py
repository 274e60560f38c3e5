"""Decision-token plumbing for the TRL trainer (arXiv 2601.13284): class tokens, positions, logits, probabilities.

A decision task names its classes (``decision_classes``, e.g. ``["A", "B", "C", "D"]``). Each class may be written
with several single-token spellings ("B" and " B": BPE tokenizers such as Qwen's write "Answer: B" with the token
" B"); a class's probability is the SUM of its spellings'. The decision token of a completion is its last class
token. The math (positions, the zeroed advantage, the cross-entropy) is in :mod:`calibrl.losses.decision`; this
module maps the tokenizer's spellings to classes and reads the logits from hidden states the trainer captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "LogitPostprocessing", "class_logits", "class_tokens", "decision_hidden", "decision_logits", "head_logits",
    "locate_decisions", "logit_postprocessing", "probability_of_chosen",
]


def class_tokens(tokenizer, classes: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of every single-token spelling of each class, [K], and the class index of each, [K].

    Spellings come from :func:`calibrl.tasks.rewards.class_token_variants` (the rule ``calibrl generate`` uses).
    A ``ValueError`` names ``decision_classes`` when a class has no single-token spelling or shares its tokens.
    """
    from calibrl.tasks.rewards import class_token_variants

    try:
        ids, owner = class_token_variants(tokenizer, classes)
    except ValueError as exc:
        raise ValueError(f"decision_classes: {exc}") from None
    missing = sorted(set(range(len(classes))) - set(owner))
    if missing:  # a spelling of this class is already another class's token
        raise ValueError(f"decision_classes: {[classes[i] for i in missing]} share token ids with other classes")
    return torch.tensor(ids, dtype=torch.long), torch.tensor(owner, dtype=torch.long)


def class_logits(logits: torch.Tensor, *, token_ids: torch.Tensor, owner: torch.Tensor, n_classes: int) -> torch.Tensor:
    """[N, V] vocabulary logits -> [N, C] class logits: logsumexp over each class's spellings, so the class
    probability (softmax over classes) is the SUM of its spellings' probabilities."""
    selected = logits[:, token_ids.to(logits.device)]  # [N, K]
    owner = owner.to(logits.device)
    return torch.stack([torch.logsumexp(selected[:, owner == c], dim=-1) for c in range(n_classes)], dim=-1)


@dataclass(frozen=True)
class LogitPostprocessing:
    """What a causal LM does to its LM head's output before returning ``logits``: multiply by ``scale``, then
    soft-cap (``softcap * tanh(logits / softcap)``) when ``softcap`` is set."""

    scale: float = 1.0
    softcap: float | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] LM-head output -> [..., V] the model's logits."""
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits


def logit_postprocessing(config) -> LogitPostprocessing:
    """The post-processing of the head's output that ``config``'s model applies, read as TRL 1.16's fused LM head
    reads it (trl/trainer/utils.py ``add_fused_lm_head``): Gemma 2/3 ``final_logit_softcapping``; Cohere
    ``logit_scale`` (or ``output_multiplier``); Falcon-H1 ``lm_head_multiplier``; Granite / MiniCPM3 divide by
    ``logits_scaling`` (HyperCLOVA X multiplies by it). Without it the decision probability of these models would
    be computed from the wrong logits."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    scale = getattr(text, "logit_scale", None)
    if scale is None:
        scale = getattr(text, "output_multiplier", None)
    if scale is None:
        scale = getattr(text, "lm_head_multiplier", None)
    if scale is None and getattr(text, "logits_scaling", None) is not None:
        scaling = float(text.logits_scaling)
        scale = scaling if getattr(text, "model_type", None) == "hyperclovax" else 1.0 / scaling
    softcap = getattr(text, "final_logit_softcapping", None)
    return LogitPostprocessing(scale=1.0 if scale is None else float(scale),
                               softcap=None if softcap is None else float(softcap))


def decision_hidden(hidden: torch.Tensor, *, prompt_len: int, positions: torch.Tensor) -> torch.Tensor:
    """[N, D] the hidden states that predict the completion token at ``positions`` [N], read from the last hidden
    states [N, P+C, D] of a forward over prompt + completion (position p is predicted at P+p-1; a row without a
    decision, position -1, reads position 0's predictor)."""
    rows = torch.arange(hidden.size(0), device=hidden.device)
    seq_pos = (prompt_len + positions.clamp(min=0) - 1).to(hidden.device)
    return hidden[rows, seq_pos]  # [N, D]


def head_logits(h: torch.Tensor, *, lm_head: torch.nn.Module, temperature: float,
                postprocess: LogitPostprocessing | None = None) -> torch.Tensor:
    """[N, V] float32 logits at the sampling temperature of hidden states ``h`` [N, D]: the LM head, then
    ``postprocess`` (:func:`logit_postprocessing` of the model's config) as the model's own forward does, over T."""
    logits = lm_head(h.to(lm_head.weight.dtype) if hasattr(lm_head, "weight") else h).float()  # [N, V]
    if postprocess is not None:
        logits = postprocess(logits)
    return logits / temperature


def decision_logits(hidden: torch.Tensor, *, prompt_len: int, positions: torch.Tensor, lm_head: torch.nn.Module,
                    temperature: float, postprocess: LogitPostprocessing | None = None) -> torch.Tensor:
    """[N, V] logits at the sampling temperature predicting the completion token at ``positions`` [N], read from
    the last hidden states [N, P+C, D] of a forward over prompt + completion (position p is predicted at P+p-1):
    :func:`head_logits` of :func:`decision_hidden`. Only the N decision positions are projected."""
    h = decision_hidden(hidden, prompt_len=prompt_len, positions=positions)
    return head_logits(h, lm_head=lm_head, temperature=temperature, postprocess=postprocess)


def locate_decisions(*, completion_ids: torch.Tensor, completion_mask: torch.Tensor, token_ids: torch.Tensor,
                     owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [N], chosen class [N]) of each completion's decision token; -1 where it has none."""
    from calibrl.losses.decision import chosen_classes, find_decision_positions

    device = completion_ids.device
    token_ids, owner = token_ids.to(device), owner.to(device)
    positions = find_decision_positions(
        completion_ids=completion_ids, completion_mask=completion_mask, class_token_ids=token_ids
    )
    chosen_variant = chosen_classes(
        completion_ids=completion_ids, decision_positions=positions, class_token_ids=token_ids
    )  # index into the spellings [K]; mapped to the class index [C]
    chosen = torch.where(chosen_variant >= 0, owner[chosen_variant.clamp(min=0)], chosen_variant)
    return positions, chosen


def probability_of_chosen(class_logits: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """[N] probability of the chosen class under softmax(class_logits [N, C]); NaN where there is no decision."""
    class_probs = torch.softmax(class_logits, dim=-1)
    rows = torch.arange(class_logits.size(0), device=class_logits.device)
    p_chosen = class_probs[rows, chosen.clamp(min=0)]
    return torch.where(chosen >= 0, p_chosen, torch.full_like(p_chosen, float("nan")))
