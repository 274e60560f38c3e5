"""DCPO: Decoupled Calibration Policy Optimization (arXiv 2603.09117), following the authors' code (icip-cas/DCPO:
``verl/trainer/ppo/core_algos.py`` ``compute_confidence_outcome_advantage`` and ``_grpo_normalize``;
``verl/workers/reward_manager/hybrid.py`` ``HybridRewardManager``, the reward manager of their training scripts).

The completion states a confidence q after its answer. Each completion gets two scores:

    accuracy          a_i = the verifier's score (0/1)
    calibration       c_i = -weight * (gamma * a_i + (1 - gamma) * mean_g(a) - q_i)^2      (q_i = -1 when none stated)

(weight 0.5, gamma 0.5 in ``HybridRewardManager``; its sibling ``ConfidenceRewardManager`` is gamma 0: the target
is the group's accuracy alone). Each is group-normalised on its own, GRPO-style:

    norm(x)_i = (x_i - mean_g(x)) / (std_g(x) + 1e-6)    (unbiased std; a group of one: mean 0, std 1)

and the completion's tokens are split at ``s_i``, the split position: one score's advantage on the tokens before
it, the other's from it to the end. ``s_i`` is the code's: the token before the one where the confidence statement
starts (its start minus one, at least 0), or the second-last token when none is stated.

Where the released code and the paper's text differ, ``assignment`` chooses; the default follows the code:

* ``assignment="code"``: the code writes the accuracy score at ``s_i`` and the calibration score on the last token,
  then gives the tokens ``t >= s_i`` the normalised score found AT ``s_i`` (the accuracy) and the tokens ``t < s_i``
  the normalised rest (the calibration score). So in the released code the reasoning tokens carry the calibration
  advantage and the confidence statement the accuracy advantage.
* ``assignment="paper"``: the paper's text (and its README): reasoning tokens ``t < s_i`` get the accuracy advantage,
  the confidence tokens ``t >= s_i`` the calibration advantage.

A one-token completion (``s_i`` and the last token coincide) gets, as in the code, ``a_i + c_i`` as its score at
``s_i`` and 0 as the rest.

Where calibrl keeps the paper's intent on purpose: the group accuracy mean_g(a) of the calibration target is over
the completion's own prompt group. The authors' ``HybridRewardManager`` averages over 8 consecutive rows of the
batch, which are a prompt's 8 completions only in generation order; their trainer reorders the batch first (verl's
``balance_batch``, on by default in their scripts), so in their runs the 8 rows mix prompts (replayed with verl's
partitioner on a 256-row batch: no chunk held one prompt, and 61% of response tokens' advantages differ from the
true groups', at most by 2.59). ``target_group_rows=8`` gives the authors' chunks of the batch as it arrives (under
verl with ``balance_batch``, their reordered batch; in TRL, generation order, where they are the prompt groups
when ``num_generations`` is 8). The normalisation's groups are the prompt groups in both (their ``uid``).
"""

from __future__ import annotations

import torch

from calibrl.advantages._groups import dense_group_index, group_mean
from calibrl.advantages.grpo import verl_grpo_advantages
from calibrl.advantages.registry import register_estimator
from calibrl.batch import RolloutBatch

ASSIGNMENTS = ("code", "paper")
NO_CONFIDENCE = -1.0  # the code's value of q when a completion states none (its calibration score is then large)


def dcpo_split_position(token_texts: list[str], char_start: int | None, length: int) -> int:
    """s_i of one completion, as the code finds it (``token_reward_func`` and the reward manager): the first token
    whose decoded texts, accumulated, reach ``char_start`` (the character where the stated confidence begins),
    minus one, at least 0; ``max(length - 2, 0)`` when nothing is stated (``char_start`` None) or no token
    reaches it. ``token_texts``: each completion token decoded on its own."""
    if char_start is not None:
        total = 0
        for index, piece in enumerate(token_texts):
            total += len(piece)
            if total >= char_start:
                return max(index - 1, 0)
    return max(length - 2, 0)


def dcpo_calibration_scores(*, correct: torch.Tensor, confidence: torch.Tensor, group_index: torch.Tensor,
                            n_groups: int, gamma: float = 0.5, weight: float = 0.5,
                            target_group_rows: int | None = None) -> torch.Tensor:
    """c_i = -weight * (gamma * a_i + (1 - gamma) * mean_g(a) - q_i)^2 (module docstring). [N] -> [N].

    ``target_group_rows``: None, mean_g over the completion's prompt group (``group_index``); k, over the chunk of
    k consecutive rows in batch order it falls in (the authors' ``HybridRewardManager`` with k = 8, module
    docstring)."""
    a = correct.to(torch.promote_types(correct.dtype, torch.float32))
    if target_group_rows is not None:
        if target_group_rows < 1:
            raise ValueError(f"dcpo: target_group_rows must be >= 1 or None, got {target_group_rows}")
        group_index = torch.arange(a.numel(), device=a.device) // target_group_rows
        n_groups = int(group_index.max()) + 1 if a.numel() else 0
    target = gamma * a + (1.0 - gamma) * group_mean(a, group_index, n_groups)[group_index].to(a.dtype)
    return -weight * (target - confidence.to(a.dtype)) ** 2


def dcpo_advantages(*, correct: torch.Tensor, confidence: torch.Tensor, split: torch.Tensor, lengths: torch.Tensor,
                    group_index: torch.Tensor, n_groups: int, width: int | None = None, gamma: float = 0.5,
                    weight: float = 0.5, eps: float = 1e-6, assignment: str = "code",
                    target_group_rows: int | None = None) -> torch.Tensor:
    """Per-token DCPO advantages [N, width] (module docstring).

    Args:
        correct: [N] accuracy scores a_i (0/1). confidence: [N] stated q_i, ``NO_CONFIDENCE`` (-1) where none.
        split: [N] long, s_i. lengths: [N] long, completion tokens (0 beyond them).
        group_index, n_groups: dense group ids (:func:`calibrl.advantages._groups.dense_group_index`).
        width: T (default max(lengths)). gamma, weight, eps: as the module docstring. assignment: "code" | "paper".
        target_group_rows: the rows mean_g(a) of the calibration target averages (:func:`dcpo_calibration_scores`).
    """
    if assignment not in ASSIGNMENTS:
        raise ValueError(f"dcpo: assignment must be one of {ASSIGNMENTS}, got {assignment!r}")
    a = correct.to(torch.promote_types(correct.dtype, torch.float32))
    c = dcpo_calibration_scores(correct=a, confidence=confidence, group_index=group_index, n_groups=n_groups,
                                gamma=gamma, weight=weight, target_group_rows=target_group_rows)
    one_token = split.to(lengths.device) == lengths - 1  # the code writes both scores on the same token
    at_split = torch.where(one_token, a + c, a)
    rest = torch.where(one_token, torch.zeros_like(c), c)
    adv_at_split = verl_grpo_advantages(at_split, group_index, n_groups, eps=eps)  # DCPO's _grpo_normalize
    adv_rest = verl_grpo_advantages(rest, group_index, n_groups, eps=eps)
    if assignment == "paper":  # reasoning <- accuracy, confidence statement <- calibration
        before, after = adv_at_split, adv_rest
    else:  # the released code: t >= s_i <- the score at s_i (accuracy), t < s_i <- the rest (calibration)
        before, after = adv_rest, adv_at_split
    width = int(lengths.max()) if width is None else width
    t = torch.arange(width, device=a.device)[None, :]
    out = torch.where(t >= split[:, None].to(a.device), after[:, None], before[:, None])
    return torch.where(t < lengths[:, None].to(a.device), out, torch.zeros((), dtype=out.dtype, device=out.device))


@register_estimator("dcpo", inputs={"stated_confidence", "confidence_start"}, ranks_by="correctness")
def dcpo(batch: RolloutBatch, *, gamma: float = 0.5, weight: float = 0.5, eps: float = 1e-6,
         assignment: str = "code", target_group_rows: int | None = None) -> tuple[torch.Tensor, dict]:
    """Registered ``dcpo``: per-token advantages [N, max(lengths)] (:func:`dcpo_advantages`), split at
    ``batch.confidence_start``; ``batch.rewards`` are the 0/1 correctness, ``batch.stated_confidence`` the stated
    confidence (-1 where none). Info: ``dcpo_calibration_mean`` (mean c_i), ``dcpo_stated_fraction``."""
    batch.require("stated_confidence", "confidence_start", "lengths", estimator="dcpo")
    index, n_groups = dense_group_index(batch.group_ids)
    advantages = dcpo_advantages(correct=batch.rewards, confidence=batch.stated_confidence,
                                 split=batch.confidence_start, lengths=batch.lengths, group_index=index,
                                 n_groups=n_groups, gamma=gamma, weight=weight, eps=eps, assignment=assignment,
                                 target_group_rows=target_group_rows)
    calibration = dcpo_calibration_scores(correct=batch.rewards, confidence=batch.stated_confidence,
                                          group_index=index, n_groups=n_groups, gamma=gamma, weight=weight,
                                          target_group_rows=target_group_rows)
    stated = (batch.stated_confidence != NO_CONFIDENCE).float()
    return advantages, {"dcpo_calibration_mean": float(calibration.mean()), "dcpo_stated_fraction": float(stated.mean())}
