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
  Estimators that rank completions by correctness (``capo``, and ``grpo_mask``, whose mask splits correct from
  incorrect) receive that column as their ``rewards``; the others receive the weighted total.
* ``logprob_mean`` (the rollout policy's mean token log-prob over the completion mask, tool tokens excluded), from
  the first available source: TRL's ``old_per_token_logps``; the log-probs recorded during ``model.generate``
  (:mod:`calibrl.trl.generation`, plain temperature sampling only); one extra no-grad forward
  (:func:`rollout_forward`). When only the telemetry needs it, it is read later from the loss pass TRL does anyway
  (``logprobs_deferred``).
* ``ref_logprob_mean`` (CAPO's noise mask, ``capo`` and ``grpo_mask``): TRL's ``ref_per_token_logps`` when
  ``beta > 0``, else the frozen reference run here (:func:`ref_per_token_logps`; :mod:`calibrl.trl.reference` loads it).
* ``embeddings`` (GCPO): the completion-mean of the policy's last hidden states, captured during the same forward.
* ``answer_ids`` (SEED-GRPO): :func:`extract_answer` of each completion, equivalent answers clustered within a prompt
  (:func:`calibrl.selection.answers.group_answer_ids`, the grader's equivalence);
  -1 (a cluster of its own) for a completion with no extractable answer (:func:`has_answer`).
* gathering: every per-row field is gathered over processes, so a group split over ranks is handled;
  ``process_slice`` is this process's rows, taken exactly as TRL takes them. Whether the extra forward runs is
  decided for all ranks at once (:func:`on_every_rank`): if one rank's recorded log-probs are unusable, every
  rank runs it, as sharded training (FSDP, ZeRO-3) needs.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from calibrl.advantages import estimator_inputs
from calibrl.batch import RolloutBatch, masked_row_mean
from calibrl.logprobs import FORWARD_BUDGET_BYTES

if TYPE_CHECKING:
    from calibrl.trl.trainer import CalibratedGRPOTrainer

__all__ = [
    "Rollout",
    "capture_hidden",
    "collect_rollout",
    "completion_logps",
    "estimator_inputs",
    "extract_answer",
    "has_answer",
    "on_every_rank",
    "ref_per_token_logps",
    "rollout_forward",
]


# ---------------------------------------------------------------------------------------------------- what to gather

# Estimators that use the rewards only through correctness (reward > 0.5): they receive the correctness
# function's column (``correctness_reward``) instead of the weighted total.
# grpo_mask too: its mask splits correct from incorrect, and the CAPO ablation it serves compares it with capo on
# the same rewards (with one 0/1 reward function, the correctness column IS the weighted total).
RANKS_BY_CORRECTNESS: frozenset[str] = frozenset({"capo", "grpo_mask"})

# Multimodal inputs of TRL's output that the policy's forward needs besides the token ids.
MODEL_KWARG_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)


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


def completion_text(completion: Any) -> str:
    """A TRL completion as text: a string as is; a conversational one (``[{"role", "content"}]``) joined."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        parts = []
        for message in completion:
            content = message.get("content", "") if isinstance(message, dict) else str(message)
            if isinstance(content, list):
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            parts.append(str(content))
        return "\n".join(parts)
    return str(completion)


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


# ---------------------------------------------------------------------------------------------------- log-prob sources


@contextmanager
def capture_hidden(module: torch.nn.Module, store: list, select: Callable[[torch.Tensor], torch.Tensor] | None = None):
    """Append the backbone's last hidden state [B, L, D] to ``store`` on every forward while active; with
    ``select``, only what it keeps of it (e.g. the decision positions' [B, D]), so the rest can be freed."""

    def hook(_module, _args, output):
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None:
            hidden = output[0] if isinstance(output, (tuple, list)) else output
        store.append(hidden if select is None else select(hidden))

    handle = module.register_forward_hook(hook)
    try:
        yield store
    finally:
        handle.remove()


def _forward_inputs(trainer: CalibratedGRPOTrainer, output: dict) -> tuple[torch.Tensor, torch.Tensor, int, int, dict]:
    """(input_ids, attention_mask, logits_to_keep, batch_size, multimodal kwargs) of a forward over TRL's output,
    as ``GRPOTrainer._generate_and_score_completions`` (TRL 1.16) builds them for its own log-prob passes."""
    prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    mode = "train" if trainer.model.training else "eval"
    args = trainer.args
    batch_size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
    kwargs = {k: output[k] for k in MODEL_KWARG_KEYS if k in output}
    return input_ids, attention_mask, completion_ids.size(1), batch_size, kwargs


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def _agreed_rows(rows: int, accelerator) -> int:
    """The smallest of every process's ``rows`` (a collective; ``rows`` itself in one process), so every rank runs
    the same number of forwards, as sharded training (FSDP, ZeRO-3) needs."""
    if accelerator.num_processes <= 1:
        return rows
    return int(accelerator.gather(torch.tensor([rows], device=accelerator.device)).min().item())


@torch.no_grad()
def completion_logps(trainer: CalibratedGRPOTrainer, model: torch.nn.Module, output: dict, *,
                     on_hidden: Callable[[torch.Tensor, slice], None] | None = None,
                     budget_bytes: int = FORWARD_BUDGET_BYTES) -> torch.Tensor | None:
    """[B, C] log-probs of the completion tokens of TRL's ``output`` under ``model`` at the sampling temperature
    (0 where the completion mask is 0), as TRL 1.16's ``_get_per_token_logps_and_entropies`` computes them, without
    whole-vocabulary logits for whole batches (:mod:`calibrl.logprobs`): :func:`~calibrl.logprobs.rows_per_forward`
    sequences per forward (at most TRL's batch size; agreed over processes), each forward asked for the last
    position's logits only (``logits_to_keep=1``) while the backbone's last hidden state [r, P+C, D] is captured, and
    the completion positions projected through the LM head (post-processed as the model's forward does:
    :func:`calibrl.trl.decision.logit_postprocessing`) :func:`~calibrl.logprobs.positions_per_chunk` at a time.
    ``on_hidden(hidden [r, P+C, D], rows)`` sees each forward's hidden states before they are freed. None when
    ``output`` has multimodal inputs (TRL's helper slices those per row: the caller uses it)."""
    from calibrl.logprobs import chunked_token_logps, positions_per_chunk, rows_per_forward
    from calibrl.trl import decision as dec

    input_ids, attention_mask, n_completion, batch_size, kwargs = _forward_inputs(trainer, output)
    if kwargs:
        return None
    backbone, lm_head = trainer._backbone_and_head(model)
    postprocess = dec.logit_postprocessing(trainer.accelerator.unwrap_model(model).config)
    n_rows, seq_len = input_ids.shape
    vocab_size = lm_head.weight.shape[0]
    rows = _agreed_rows(rows_per_forward(vocab_size=vocab_size, seq_len=seq_len, budget_bytes=budget_bytes,
                                         limit=batch_size), trainer.accelerator)
    chunk = positions_per_chunk(vocab_size=vocab_size, budget_bytes=budget_bytes)
    extra = {"use_cache": False}
    if _accepts_logits_to_keep(trainer.accelerator.unwrap_model(model)):
        extra["logits_to_keep"] = 1  # the model's own logits: [r, 1, V]

    def project(h: torch.Tensor) -> torch.Tensor:  # [n, D] -> [n, V] the model's logits (T = 1)
        return postprocess(lm_head(h.to(lm_head.weight.dtype)).float())

    completion = input_ids[:, -n_completion:]  # [B, C]
    valid = attention_mask[:, -n_completion:].bool()  # [B, C]
    logps = torch.zeros(n_rows, n_completion, dtype=torch.float32, device=input_ids.device)
    for start in range(0, n_rows, rows):
        part = slice(start, min(start + rows, n_rows))
        store: list = []
        with capture_hidden(backbone, store), trainer.accelerator.autocast():
            model(input_ids=input_ids[part], attention_mask=attention_mask[part], **extra)
            hidden = store[-1]  # [r, P+C, D]
            predictors = hidden[:, -n_completion - 1:-1]  # [r, C, D]: position t predicts token t+1
            keep = valid[part]
            values = chunked_token_logps(predictors[keep], completion[part][keep], project=project,
                                         temperature=trainer.temperature, chunk=chunk)
        logps[part] = logps[part].masked_scatter(keep, values.to(logps.device))
        if on_hidden is not None:
            on_hidden(hidden, part)
        del store, hidden, predictors
    return logps


@torch.no_grad()
def rollout_forward(trainer: CalibratedGRPOTrainer, output: dict, mask: torch.Tensor, *, want_embeddings: bool,
                    want_decision: bool, decision_positions: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One no-grad forward of the policy (:func:`completion_logps`; TRL's ``_get_per_token_logps_and_entropies``
    for multimodal inputs): per-token log-probs [B, C]; with ``want_embeddings`` the completion-mean last hidden
    states [B, D]; with ``want_decision`` the hidden states [B, D] that predict each completion's decision token
    (``decision_positions`` [B], -1 where none; the decision logits are read from them)."""
    from trl.models.utils import disable_gradient_checkpointing

    from calibrl.trl import decision as dec

    if want_decision and decision_positions is None:
        raise ValueError("rollout_forward: want_decision needs decision_positions")
    prompt_len = output["prompt_ids"].size(1)
    n_completion = output["completion_ids"].size(1)
    parts: dict[str, list] = {"embeddings": [], "decision_hidden": []}

    def reduce(hidden: torch.Tensor, rows) -> None:  # hidden [r, P+C, D] of the rows ``rows``
        if want_embeddings:
            comp_hidden = hidden[:, -n_completion:].float()
            m = mask[rows].unsqueeze(-1).float()
            parts["embeddings"].append((comp_hidden * m).sum(1) / m.sum(1).clamp(min=1.0))
        if want_decision:
            parts["decision_hidden"].append(dec.decision_hidden(hidden, prompt_len=prompt_len,
                                                                positions=decision_positions[rows]))

    with disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        logps = completion_logps(trainer, trainer.model, output, on_hidden=reduce)
        if logps is None:  # multimodal inputs: TRL's helper, the whole hidden state captured
            input_ids, attention_mask, logits_to_keep, batch_size, kwargs = _forward_inputs(trainer, output)
            hidden_store: list = []
            backbone, _ = trainer._backbone_and_head(trainer.model)
            with capture_hidden(backbone, hidden_store):
                logps, _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs
                )
            reduce(torch.cat(hidden_store, dim=0), slice(None))
    result: dict[str, torch.Tensor] = {"per_token_logps": logps}
    if want_embeddings:
        result["embeddings"] = torch.cat(parts["embeddings"], dim=0)
    if want_decision:
        result["decision_hidden"] = torch.cat(parts["decision_hidden"], dim=0)
    return result


@torch.no_grad()
def ref_per_token_logps(trainer: CalibratedGRPOTrainer, output: dict) -> torch.Tensor:
    """[B, C] reference log-probs: TRL's ``ref_per_token_logps`` when it computed them (beta > 0), else a forward
    of the frozen reference (calibrl's copy in ``trainer.ref_model``, or the PEFT adapter-disabled base / "ref"
    adapter, as TRL 1.16's ``_generate_and_score_completions`` does) by :func:`completion_logps` (TRL's
    ``_get_per_token_logps_and_entropies`` for multimodal inputs)."""
    if "ref_per_token_logps" in output:
        return output["ref_per_token_logps"]
    from trl.models.utils import disable_gradient_checkpointing

    def forward(model):
        logps = completion_logps(trainer, model, output)
        if logps is None:
            input_ids, attention_mask, logits_to_keep, batch_size, kwargs = _forward_inputs(trainer, output)
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs
            )
        return logps

    if trainer.ref_model is not None:
        return forward(trainer.ref_model)
    from trl.trainer.utils import use_adapter

    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    if not hasattr(unwrapped, "peft_config"):
        raise RuntimeError("calibrl: the estimator needs a reference model but none was loaded")
    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None), \
            disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        return forward(trainer.model)


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


def collect_rollout(trainer: CalibratedGRPOTrainer, output: dict) -> Rollout:
    """Gather everything the estimator, the decision term and the telemetry read (see the module docstring)."""
    from accelerate.utils import gather_object

    args, accelerator = trainer.args, trainer.accelerator
    mode = "train" if trainer.model.training else "eval"
    device = accelerator.device
    n_local = output["completion_ids"].size(0)
    process_slice = slice(accelerator.process_index * n_local, (accelerator.process_index + 1) * n_local)
    num_generations = trainer.num_generations if mode == "train" else trainer.num_generations_eval

    columns = reward_columns(trainer._calibrl_rewards_per_func, reward_weights=trainer.reward_weights.to(device),
                             correctness_index=trainer._correctness_index)
    mask = training_mask(output)
    lengths = accelerator.gather(mask.sum(dim=1))  # [N_total]; 0 for a row TRL masked out (truncated)
    empty = lengths == 0
    group_ids = group_ids_for(columns.unscorable, num_generations=num_generations)
    needed = trainer._needed_fields(mode)
    logs_confidence = args.calibration_logging or trainer.log_completions  # telemetry / the completions table
    want_dec = trainer._decision_class_ids is not None and logs_confidence  # decision probabilities
    want_emb = "embeddings" in needed

    fields: dict[str, torch.Tensor] = {}
    decision_hidden = None
    old = output.get("old_per_token_logps")
    recorded, trainer._calibrl_gen_logps = trainer._calibrl_gen_logps, None
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
        logs_confidence and "logprob_mean" not in trainer._calibrl_inputs and old_like is None
        and not want_emb and not want_dec
    )
    if deferred:
        needed.discard("logprob_mean")
    if "logprob_mean" in needed or want_emb or want_dec:
        if old_like is not None and not want_emb and not want_dec:
            per_token = old_like
        else:
            positions = None
            if want_dec:  # the decision token of each completion: only its predictor's hidden state is kept
                from calibrl.trl import decision as dec

                positions, _ = dec.locate_decisions(
                    completion_ids=output["completion_ids"], completion_mask=mask,
                    token_ids=trainer._decision_class_ids, owner=trainer._decision_owner,
                )
            fwd = trainer._rollout_forward(
                output, mask, want_logps=True, want_embeddings=want_emb, want_decision=want_dec,
                decision_positions=positions,
            )
            per_token = old if old is not None else fwd["per_token_logps"]
            if want_emb:
                fields["embeddings"] = accelerator.gather(fwd["embeddings"].contiguous())
            decision_hidden = fwd.get("decision_hidden")
        fields["logprob_mean"] = accelerator.gather(masked_row_mean(per_token, mask))
    if "ref_logprob_mean" in needed or "ref_per_token_logps" in output:
        fields["ref_logprob_mean"] = accelerator.gather(masked_row_mean(ref_per_token_logps(trainer, output), mask))
    if "answer_ids" in needed:
        texts = gather_object([completion_text(c) for c in trainer._calibrl_completions])
        ids = answer_ids_for(texts, group_ids=group_ids.tolist(), classes=args.decision_classes,
                             last_line=args.answer_last_line)
        fields["answer_ids"] = torch.tensor(ids, device=device)
    fields["lengths"] = lengths

    ranks_by_correctness = args.advantage_estimator in RANKS_BY_CORRECTNESS
    fields = dict(rewards=columns.correct_signal if ranks_by_correctness else columns.rewards, group_ids=group_ids,
                  **fields)
    return Rollout(
        batch=RolloutBatch(**fields), fields=fields, rewards=columns.rewards, correct=columns.correct_signal > 0.5,
        unscorable=columns.unscorable, empty=empty, mask=mask, process_slice=process_slice, mode=mode,
        logprobs_deferred=deferred, decision_hidden=decision_hidden,
    )
