"""calibrl's no-grad forward passes over TRL's generation output, in one place: the policy's token log-probs
(with the hidden states GCPO's embeddings and the decision term read from the same forward) and the frozen
reference's. They take a :class:`PolicyForward`, what they need of the trainer, so the rollout
(:mod:`calibrl.trl.rollout`) calls them through plain arguments and never reads the trainer.

Every forward follows TRL 1.16's ``GRPOTrainer._get_per_token_logps_and_entropies`` (same inputs, temperature and
logit post-processing) without whole-vocabulary logits for whole batches (:mod:`calibrl.logprobs`); multimodal
inputs go through TRL's own helper (``PolicyForward.trl_logps``).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import torch

from calibrl.logprobs import FORWARD_BUDGET_BYTES

__all__ = [
    "MODEL_KWARG_KEYS", "PolicyForward", "backbone_and_head", "capture_hidden", "completion_logps", "forward_inputs",
    "ref_per_token_logps", "rollout_forward",
]

# Multimodal inputs of TRL's output that the policy's forward needs besides the token ids.
MODEL_KWARG_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)


@dataclass(frozen=True)
class PolicyForward:
    """What the forwards need of the trainer (built by ``CalibratedGRPOTrainer._policy_forward`` per batch)."""

    model: torch.nn.Module  # the (wrapped) policy
    ref_model: torch.nn.Module | None  # calibrl's or TRL's frozen reference; None: PEFT's adapter-disabled base
    accelerator: Any
    temperature: float  # the sampling temperature the log-probs divide by
    batch_size: int  # TRL's per-device batch size of this mode: the most rows per forward
    gradient_checkpointing_kwargs: dict | None
    trl_logps: Callable[..., Any]  # TRL's _get_per_token_logps_and_entropies (multimodal inputs)


def backbone_and_head(accelerator: Any, model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the transformer body whose output is the last hidden state, the LM head) of the unwrapped model."""
    unwrapped = accelerator.unwrap_model(model)
    base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
    backbone = getattr(base, "base_model", base)
    return backbone, base.get_output_embeddings()


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


def forward_inputs(policy: PolicyForward, output: dict) -> tuple[torch.Tensor, torch.Tensor, int, int, dict]:
    """(input_ids, attention_mask, logits_to_keep, batch_size, multimodal kwargs) of a forward over TRL's output,
    as ``GRPOTrainer._generate_and_score_completions`` (TRL 1.16) builds them for its own log-prob passes."""
    prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    kwargs = {k: output[k] for k in MODEL_KWARG_KEYS if k in output}
    return input_ids, attention_mask, completion_ids.size(1), policy.batch_size, kwargs


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


def logits_projection(policy: PolicyForward, model: torch.nn.Module
                      ) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """(``project``: hidden states [n, D] -> the model's float32 logits [n, V] at T = 1, through its LM head and
    post-processed as its forward does (:func:`calibrl.trl.decision.logit_postprocessing`); V)."""
    from calibrl.trl import decision as dec

    _, lm_head = backbone_and_head(policy.accelerator, model)
    postprocess = dec.logit_postprocessing(policy.accelerator.unwrap_model(model).config)

    def project(h: torch.Tensor) -> torch.Tensor:
        return postprocess(lm_head(h.to(lm_head.weight.dtype)).float())

    return project, lm_head.weight.shape[0]


@torch.no_grad()
def completion_logps(policy: PolicyForward, model: torch.nn.Module, output: dict, *,
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

    input_ids, attention_mask, n_completion, batch_size, kwargs = forward_inputs(policy, output)
    if kwargs:
        return None
    backbone, _ = backbone_and_head(policy.accelerator, model)
    project, vocab_size = logits_projection(policy, model)
    n_rows, seq_len = input_ids.shape
    rows = _agreed_rows(rows_per_forward(vocab_size=vocab_size, seq_len=seq_len, budget_bytes=budget_bytes,
                                         limit=batch_size), policy.accelerator)
    chunk = positions_per_chunk(vocab_size=vocab_size, budget_bytes=budget_bytes)
    extra = {"use_cache": False}
    if _accepts_logits_to_keep(policy.accelerator.unwrap_model(model)):
        extra["logits_to_keep"] = 1  # the model's own logits: [r, 1, V]

    completion = input_ids[:, -n_completion:]  # [B, C]
    valid = attention_mask[:, -n_completion:].bool()  # [B, C]
    logps = torch.zeros(n_rows, n_completion, dtype=torch.float32, device=input_ids.device)
    for start in range(0, n_rows, rows):
        part = slice(start, min(start + rows, n_rows))
        store: list = []
        with capture_hidden(backbone, store), policy.accelerator.autocast():
            model(input_ids=input_ids[part], attention_mask=attention_mask[part], **extra)
            hidden = store[-1]  # [r, P+C, D]
            predictors = hidden[:, -n_completion - 1:-1]  # [r, C, D]: position t predicts token t+1
            keep = valid[part]
            values = chunked_token_logps(predictors[keep], completion[part][keep], project=project,
                                         temperature=policy.temperature, chunk=chunk)
        logps[part] = logps[part].masked_scatter(keep, values.to(logps.device))
        if on_hidden is not None:
            on_hidden(hidden, part)
        del store, hidden, predictors
    return logps


@torch.no_grad()
def rollout_forward(policy: PolicyForward, output: dict, mask: torch.Tensor, *, want_embeddings: bool,
                    want_decision: bool, decision_positions: torch.Tensor | None = None,
                    want_self_certainty: bool = False) -> dict[str, torch.Tensor]:
    """One no-grad forward of the policy (:func:`completion_logps`; TRL's ``_get_per_token_logps_and_entropies``
    for multimodal inputs): per-token log-probs [B, C]; with ``want_embeddings`` the completion-mean last hidden
    states [B, D]; with ``want_decision`` the hidden states [B, D] that predict each completion's decision token
    (``decision_positions`` [B], -1 where none; the decision logits are read from them); with
    ``want_self_certainty`` each completion's self-certainty [B] at the sampling temperature
    (:func:`calibrl.self_certainty.chunked_token_self_certainty`, a chunk of positions' logits at a time)."""
    from trl.models.utils import disable_gradient_checkpointing

    from calibrl.trl import decision as dec

    if want_decision and decision_positions is None:
        raise ValueError("rollout_forward: want_decision needs decision_positions")
    prompt_len = output["prompt_ids"].size(1)
    n_completion = output["completion_ids"].size(1)
    parts: dict[str, list] = {"embeddings": [], "decision_hidden": [], "self_certainty": []}
    if want_self_certainty:
        from calibrl.logprobs import positions_per_chunk
        from calibrl.self_certainty import chunked_token_self_certainty, completion_self_certainty

        project, vocab_size = logits_projection(policy, policy.model)
        chunk = positions_per_chunk(vocab_size=vocab_size)

    def reduce(hidden: torch.Tensor, rows) -> None:  # hidden [r, P+C, D] of the rows ``rows``
        if want_embeddings:
            comp_hidden = hidden[:, -n_completion:].float()
            m = mask[rows].unsqueeze(-1).float()
            parts["embeddings"].append((comp_hidden * m).sum(1) / m.sum(1).clamp(min=1.0))
        if want_decision:
            parts["decision_hidden"].append(dec.decision_hidden(hidden, prompt_len=prompt_len,
                                                                positions=decision_positions[rows]))
        if want_self_certainty:
            keep = mask[rows].bool()
            per_token = torch.zeros(keep.shape, dtype=torch.float32, device=hidden.device)
            predictors = hidden[:, -n_completion - 1:-1]  # position t predicts completion token t
            per_token[keep] = chunked_token_self_certainty(predictors[keep], project=project, chunk=chunk,
                                                           temperature=policy.temperature)
            parts["self_certainty"].append(completion_self_certainty(per_token, keep))

    with disable_gradient_checkpointing(policy.model, policy.gradient_checkpointing_kwargs):
        logps = completion_logps(policy, policy.model, output, on_hidden=reduce)
        if logps is None:  # multimodal inputs: TRL's helper, the whole hidden state captured
            input_ids, attention_mask, logits_to_keep, batch_size, kwargs = forward_inputs(policy, output)
            hidden_store: list = []
            backbone, _ = backbone_and_head(policy.accelerator, policy.model)
            with capture_hidden(backbone, hidden_store):
                logps, _, _ = policy.trl_logps(
                    policy.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs
                )
            reduce(torch.cat(hidden_store, dim=0), slice(None))
    result: dict[str, torch.Tensor] = {"per_token_logps": logps}
    if want_embeddings:
        result["embeddings"] = torch.cat(parts["embeddings"], dim=0)
    if want_decision:
        result["decision_hidden"] = torch.cat(parts["decision_hidden"], dim=0)
    if want_self_certainty:
        result["self_certainty"] = torch.cat(parts["self_certainty"], dim=0)
    return result


@torch.no_grad()
def ref_per_token_logps(policy: PolicyForward, output: dict) -> torch.Tensor:
    """[B, C] reference log-probs: TRL's ``ref_per_token_logps`` when it computed them (beta > 0), else a forward
    of the frozen reference (calibrl's copy in ``policy.ref_model``, or the PEFT adapter-disabled base / "ref"
    adapter, as TRL 1.16's ``_generate_and_score_completions`` does) by :func:`completion_logps` (TRL's
    ``_get_per_token_logps_and_entropies`` for multimodal inputs)."""
    if "ref_per_token_logps" in output:
        return output["ref_per_token_logps"]
    from trl.models.utils import disable_gradient_checkpointing

    def forward(model):
        logps = completion_logps(policy, model, output)
        if logps is None:
            input_ids, attention_mask, logits_to_keep, batch_size, kwargs = forward_inputs(policy, output)
            logps, _, _ = policy.trl_logps(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs
            )
        return logps

    if policy.ref_model is not None:
        return forward(policy.ref_model)
    from trl.trainer.utils import use_adapter

    unwrapped = policy.accelerator.unwrap_model(policy.model)
    if not hasattr(unwrapped, "peft_config"):
        raise RuntimeError("calibrl: the estimator needs a reference model but none was loaded")
    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None), \
            disable_gradient_checkpointing(policy.model, policy.gradient_checkpointing_kwargs):
        return forward(policy.model)
