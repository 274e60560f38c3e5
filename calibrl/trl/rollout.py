r"""From TRL's generation output to a :class:`calibrl.RolloutBatch`: everything the advantage step gathers.

TRL 1.16's ``GRPOTrainer._generate_and_score_completions`` returns, for THIS process's completions, a dict with
``prompt_ids``, ``prompt_mask``, ``completion_ids``, ``completion_mask`` (and ``tool_mask``), ``advantages``,
``old_per_token_logps`` / ``ref_per_token_logps`` when it computed them. Rewards come from ``_calculate_rewards``
(already gathered over processes, ``[N_total, n_funcs]``, NaN where a function returned ``None``).
:func:`collect_rollout` turns these into one :class:`Rollout` for the WHOLE generation batch:

* rewards: TRL's weighted sum of the reward functions (``reward_weights``). A completion every reward function
  returned ``None`` for ("unscorable") forms a group of its own and gets advantage 0, as in TRL.
* ``lengths``: tokens of the training mask. A completion without any (TRL's ``mask_truncated_completions`` zeroes
  a truncated one's mask) is left out of every estimator statistic by :func:`calibrl.compute_advantages`, gets
  advantage 0 and is left out of the telemetry: its
  masked mean log-prob (0) is no confidence.
* correctness: the UNWEIGHTED value of ONE reward function (``correctness_reward``, default the first) > 0.5, not
  the weighted total, so with ``[math, format]`` a wrong answer in ``\boxed{}`` (total 1.0) stays wrong.
  Estimators registered with ``ranks_by="correctness"`` (``capo``, and ``grpo_mask``, whose mask splits correct
  from incorrect) receive that column as their ``rewards``; the others receive the weighted total.
* ``logprob_mean`` (the rollout policy's mean token log-prob over the completion mask, tool tokens excluded), from
  the first available source: TRL's ``old_per_token_logps``; the log-probs recorded during ``model.generate``
  (:mod:`calibrl.trl.generation`, plain temperature sampling only); one extra no-grad forward (the ``forward``
  argument: :func:`calibrl.trl.forward.rollout_forward`). When only the telemetry needs it, it is read later
  from the loss pass TRL does anyway (``logprobs_deferred``).
* ``ref_logprob_mean`` (CAPO's noise mask, ``capo`` and ``grpo_mask``): TRL's ``ref_per_token_logps`` when
  ``beta > 0``, else the frozen reference (the ``reference`` argument: :func:`calibrl.trl.forward.ref_per_token_logps`;
  :mod:`calibrl.trl.reference` loads it).
* ``embeddings`` (GCPO): the completion-mean of the policy's last hidden states, captured during the same forward.
* ``answer_ids`` (SEED-GRPO): :func:`extract_answer` of each completion, equivalent answers clustered within a prompt
  (:func:`calibrl.selection.answers.group_answer_ids`, the grader's equivalence);
  -1 (a cluster of its own) for a completion with no extractable answer (:func:`has_answer`).
* gathering: every per-row field is gathered over processes, so a group split over ranks is handled;
  ``process_slice`` is this process's rows, taken exactly as TRL takes them. Whether the extra forward runs is
  decided for all ranks at once (:func:`on_every_rank`): if one rank's recorded log-probs are unusable, every
  rank runs it, as sharded training (FSDP, ZeRO-3) needs.

What it needs of the trainer arrives as arguments (:class:`RolloutState` and two forward functions), so the step
reads one way: trainer -> rollout -> trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from calibrl.batch import RolloutBatch, masked_row_mean
# the text the correctness reward grades (assistant messages only): SEED-GRPO's answers and DCPO's stated
# confidence are read from the same text
from calibrl.tasks.rewards import completion_text

__all__ = [
    "Rollout",
    "RolloutState",
    "collect_rollout",
    "extract_answer",
    "has_answer",
    "on_every_rank",
]


# ---------------------------------------------------------------------------------------------------- answers


def extract_answer(text: str, classes: list[str] | None = None) -> str:
    """Final answer of a completion: the last ``\\boxed{...}`` / ``\\fbox{...}`` content
    (:func:`calibrl.tasks.rewards.last_boxed`, the same extraction the ``math`` reward scores), else the decision
    (:func:`calibrl.tasks.rewards.extract_decision`, the ``decision`` reward's) for decision tasks, else the
    stripped last non-empty line ("" if none). The last-line fallback always returns a string; whether the answer
    was really extractable (boxed, or a decision) is :func:`has_answer`, which SEED-GRPO's clustering uses."""
    from calibrl.tasks.rewards import extract_decision, last_boxed

    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if classes:
        decision, _ = extract_decision(text, classes)
        if decision is not None:
            return decision
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def has_answer(text: str, classes: list[str] | None = None) -> bool:
    """Whether ``text`` states an answer :func:`extract_answer` finds without its last-line fallback: a
    ``\\boxed{...}`` / ``\\fbox{...}``, or (``classes`` given) a decision class."""
    from calibrl.tasks.rewards import extract_decision, last_boxed

    if last_boxed(text) is not None:
        return True
    return bool(classes) and extract_decision(text, classes)[0] is not None


def answer_ids(answers: list[str | None], group_ids: list[int]) -> list[int]:
    """Dense ids (0, 1, ...) of equivalent answers WITHIN a group (:func:`calibrl.selection.answers.group_answer_ids`:
    the grader's equivalence, so ``12`` and ``12.0`` are one cluster; the same answer in two groups gets two ids);
    -1 where the answer is None (the estimator makes each such completion a cluster of its own)."""
    from calibrl.selection.answers import group_answer_ids

    return group_answer_ids(answers, group_ids)


def answer_ids_for(texts: list[str], *, group_ids: list[int], classes: list[str] | None,
                   last_line: bool = False) -> list[int]:
    """SEED-GRPO's ``answer_ids`` [N] of completion ``texts``: equivalent extracted answers share an id within a group;
    a completion with no extractable answer (:func:`has_answer`) gets -1, a cluster of its own, rather than the
    cluster of its last line (two unanswered completions do not agree on an answer), unless ``last_line``
    (``CalibratedGRPOConfig.answer_last_line``) takes the last line as the answer."""
    answers = [extract_answer(t, classes) if last_line or has_answer(t, classes) else None for t in texts]
    return answer_ids(answers, group_ids)


# ---------------------------------------------------------------------------------------------------- rewards


@dataclass
class RewardColumns:
    """The reward signals of the whole generation batch, all [N_total]."""

    rewards: torch.Tensor  # weighted total of the reward functions (0 where unscorable)
    correct_signal: torch.Tensor  # the correctness function's own value (0 where None or unscorable)
    unscorable: torch.Tensor  # bool: every reward function returned None


def reward_columns(rewards_per_func: torch.Tensor, *, reward_weights: torch.Tensor,
                   correctness_index: int) -> RewardColumns:
    """[N, F] per-function rewards (NaN = None) -> weighted total, correctness column, unscorable rows."""
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards = rewards.masked_fill(unscorable, 0.0)
    # Correctness: one reward function's own value (before weighting) > 0.5; None (NaN) counts as wrong.
    correct_signal = torch.nan_to_num(rewards_per_func[:, correctness_index].float(), nan=0.0)
    correct_signal = correct_signal.masked_fill(unscorable, 0.0).to(rewards.dtype)
    return RewardColumns(rewards=rewards, correct_signal=correct_signal, unscorable=unscorable)


def group_ids_for(alone: torch.Tensor, *, num_generations: int) -> torch.Tensor:
    """[N] prompt group of each row (TRL lays out ``num_generations`` consecutive rows per prompt); a row marked
    ``alone`` [N] bool (unscorable) forms a group of its own (excluded from its prompt's baseline). Rows without
    tokens need no such group: :func:`calibrl.compute_advantages` leaves them out by their ``lengths``."""
    n_total = alone.numel()
    rows = torch.arange(n_total, device=alone.device)
    group_ids = rows // num_generations
    n_groups = (n_total + num_generations - 1) // num_generations
    return torch.where(alone, n_groups + rows, group_ids)


def training_mask(output: dict) -> torch.Tensor:
    """[B, T] tokens the loss trains on: the completion mask, times TRL's ``tool_mask`` (tool output excluded)."""
    mask = output["completion_mask"]
    if "tool_mask" in output:
        mask = mask * output["tool_mask"]
    return mask


# ---------------------------------------------------------------------------------------------------- the batch


@dataclass
class Rollout:
    """One generation batch as the advantage step sees it: the gathered :class:`RolloutBatch` and what the trainer
    needs beside it. Rows are the whole batch ([N_total]) unless named local ([n_local], this process)."""

    batch: RolloutBatch
    fields: dict[str, torch.Tensor]  # the RolloutBatch's keyword arguments (rebuilt when log-probs come later)
    rewards: torch.Tensor  # [N_total] weighted total
    correct: torch.Tensor  # [N_total] bool
    unscorable: torch.Tensor  # [N_total] bool
    empty: torch.Tensor  # [N_total] bool: no token to train on (TRL's mask_truncated_completions); advantage 0
    mask: torch.Tensor  # local [n_local, C] training mask
    process_slice: slice  # this process's rows of the whole batch
    mode: str  # "train" or "eval"
    logprobs_deferred: bool  # logprob_mean (telemetry only) is read from the loss pass later
    decision_hidden: torch.Tensor | None  # local [n_local, D] hidden states predicting the decision token

    @property
    def n_local(self) -> int:
        return self.process_slice.stop - self.process_slice.start


def on_every_rank(flag: bool, *, accelerator) -> bool:
    """``flag`` AND-ed over every process (a collective: every rank must call it at the same point); ``flag`` itself
    in a single process."""
    if accelerator.num_processes <= 1:
        return bool(flag)
    flags = accelerator.gather(torch.tensor([int(bool(flag))], device=accelerator.device))  # [num_processes]
    return bool(flags.min().item())


def stated_confidences(completions: list, completion_ids: list[list[int]], lengths: list[int],
                       tokenizer: Any, reader: Callable[[str], tuple] | None = None) -> tuple[list[float], list[int]]:
    """Per completion: the confidence it states, as ``reader`` reads it (default the last ``<confidence>`` tag,
    :func:`calibrl.tasks.verbalized.stated_confidence_span`; -1 where none or malformed, DCPO's value) and DCPO's
    split position (:func:`calibrl.advantages.dcpo.dcpo_split_position` at the character offset the reader gives,
    the tokens decoded one by one)."""
    from calibrl.advantages.dcpo import NO_CONFIDENCE, dcpo_split_position
    from calibrl.tasks.verbalized import stated_confidence_span

    reader = reader or stated_confidence_span
    stated, starts = [], []
    for completion, ids, length in zip(completions, completion_ids, lengths):
        confidence, char_start = reader(completion_text(completion))
        stated.append(NO_CONFIDENCE if confidence is None else confidence)
        pieces = [] if char_start is None else [tokenizer.decode([token]) for token in ids[:length]]
        starts.append(dcpo_split_position(pieces, char_start, length))
    return stated, starts


@dataclass(frozen=True)
class RolloutState:
    """What :func:`collect_rollout` needs of the trainer for one generation batch (built by
    ``CalibratedGRPOTrainer._rollout_state``)."""

    accelerator: Any
    mode: str  # "train" or "eval"
    num_generations: int  # completions per prompt in this mode
    rewards_per_func: torch.Tensor  # [N_total, F] gathered per-function rewards (NaN = None)
    reward_weights: torch.Tensor  # [F]
    correctness_index: int  # the column whose own value > 0.5 means correct
    completions: list  # this process's completions (text or conversational)
    needed: frozenset[str]  # optional RolloutBatch fields: the estimator's, plus logprob_mean for the telemetry
    estimator_reads_logprobs: bool  # logprob_mean is the estimator's (not only the telemetry's)
    ranks_by_correctness: bool  # the estimator's rewards are the correctness column
    logs_confidence: bool  # telemetry or the completions table read confidences
    generation_logps: torch.Tensor | None  # [B, n_steps] recorded during generation, if any
    decision_tokens: tuple[torch.Tensor, torch.Tensor] | None  # ([K] class token ids, [K] class of each), if any
    decision_classes: list[str] | None
    answer_last_line: bool
    tokenizer: Any = None  # decodes completion tokens one by one (stated_confidence / confidence_start: DCPO)
    confidence_reader: Callable[[str], tuple] | None = None  # text -> (stated, char offset); None: the tag


def collect_rollout(state: RolloutState, output: dict, *, forward: Callable[..., dict[str, torch.Tensor]],
                    reference: Callable[[dict], torch.Tensor]) -> Rollout:
    """Gather everything the estimator, the decision term and the telemetry read (see the module docstring).

    ``forward(output, mask, want_embeddings=, want_decision=, decision_positions=)`` runs the policy's no-grad
    forward (:func:`calibrl.trl.forward.rollout_forward`); ``reference(output)`` gives the reference's per-token
    log-probs [B, C] (:func:`calibrl.trl.forward.ref_per_token_logps`)."""
    from accelerate.utils import gather_object

    accelerator, mode = state.accelerator, state.mode
    device = accelerator.device
    n_local = output["completion_ids"].size(0)
    process_slice = slice(accelerator.process_index * n_local, (accelerator.process_index + 1) * n_local)

    columns = reward_columns(state.rewards_per_func, reward_weights=state.reward_weights.to(device),
                             correctness_index=state.correctness_index)
    mask = training_mask(output)
    lengths = accelerator.gather(mask.sum(dim=1))  # [N_total]; 0 for a row TRL masked out (truncated)
    empty = lengths == 0
    group_ids = group_ids_for(columns.unscorable, num_generations=state.num_generations)
    needed = set(state.needed)
    want_dec = state.decision_tokens is not None and state.logs_confidence  # decision probabilities
    want_emb = "embeddings" in needed
    want_sc = "self_certainty" in needed  # INTUITOR: from the full next-token distributions, one more forward

    fields: dict[str, torch.Tensor] = {}
    decision_hidden = None
    old = output.get("old_per_token_logps")
    recorded = state.generation_logps
    n_tokens = output["completion_ids"].size(1)
    usable = recorded is not None and recorded.size(0) == n_local and recorded.size(1) >= n_tokens
    # Whether to run the policy's forward must be one decision for all ranks (a forward on some ranks only hangs
    # FSDP / ZeRO-3): the recorded log-probs are used only when every rank's are usable.
    if old is None and on_every_rank(usable, accelerator=accelerator):
        old_like = recorded[:, :n_tokens].to(device)
    else:
        old_like = old
    # Telemetry-only log-probs, on-policy: no extra forward; they are read from the loss pass TRL does anyway
    # (per_token_logps there equal the rollout policy's until the optimizer steps) and logged once every row
    # of this generation batch went through the loss.
    deferred = (
        state.logs_confidence and not state.estimator_reads_logprobs and old_like is None
        and not want_emb and not want_dec and not want_sc
    )
    if deferred:
        needed.discard("logprob_mean")
    if "logprob_mean" in needed or want_emb or want_dec or want_sc:
        if old_like is not None and not want_emb and not want_dec and not want_sc:
            per_token = old_like
        else:
            positions = None
            if want_dec:  # the decision token of each completion: only its predictor's hidden state is kept
                from calibrl.trl import decision as dec

                token_ids, owner = state.decision_tokens
                positions, _ = dec.locate_decisions(
                    completion_ids=output["completion_ids"], completion_mask=mask, token_ids=token_ids, owner=owner,
                )
            fwd = forward(output, mask, want_embeddings=want_emb, want_decision=want_dec,
                          decision_positions=positions, **({"want_self_certainty": True} if want_sc else {}))
            per_token = old if old is not None else fwd["per_token_logps"]
            if want_emb:
                fields["embeddings"] = accelerator.gather(fwd["embeddings"].contiguous())
            decision_hidden = fwd.get("decision_hidden")
            if want_sc:
                fields["self_certainty"] = accelerator.gather(fwd["self_certainty"].contiguous())
        fields["logprob_mean"] = accelerator.gather(masked_row_mean(per_token, mask))
    if "ref_logprob_mean" in needed or "ref_per_token_logps" in output:
        fields["ref_logprob_mean"] = accelerator.gather(masked_row_mean(reference(output), mask))
    if "answer_ids" in needed:
        texts = gather_object([completion_text(c) for c in state.completions])
        ids = answer_ids_for(texts, group_ids=group_ids.tolist(), classes=state.decision_classes,
                             last_line=state.answer_last_line)
        fields["answer_ids"] = torch.tensor(ids, device=device)
    if needed & {"stated_confidence", "confidence_start"}:
        local_lengths = mask.sum(dim=1).tolist()
        stated, starts = stated_confidences(state.completions, output["completion_ids"].tolist(), local_lengths,
                                            state.tokenizer, state.confidence_reader)
        fields["stated_confidence"] = accelerator.gather(torch.tensor(stated, dtype=torch.float32, device=device))
        fields["confidence_start"] = accelerator.gather(torch.tensor(starts, dtype=torch.long, device=device))
    fields["lengths"] = lengths

    fields = dict(rewards=columns.correct_signal if state.ranks_by_correctness else columns.rewards,
                  group_ids=group_ids, **fields)
    return Rollout(
        batch=RolloutBatch(**fields), fields=fields, rewards=columns.rewards, correct=columns.correct_signal > 0.5,
        unscorable=columns.unscorable, empty=empty, mask=mask, process_slice=process_slice, mode=mode,
        logprobs_deferred=deferred, decision_hidden=decision_hidden,
    )
