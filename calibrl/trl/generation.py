"""Log-probs of the sampled tokens, recorded while transformers generates: no extra forward pass.

When TRL 1.16 keeps no ``old_per_token_logps`` (generation and optimisation in step, no vLLM importance sampling)
and sampling is plain temperature sampling, the rollout policy's token log-probs are
``log_softmax(logits / T)`` at the sampled tokens, read from the model's FINAL logits during ``generate`` (so
Granite's scaling, Gemma's soft-capping and Cohere's ``logit_scale`` are included). :func:`is_plain_sampling`
judges "plain" from the generation config ``generate`` really uses (TRL's, with unset fields filled from the
model's ``generation_config`` and transformers' defaults); otherwise :mod:`calibrl.trl.rollout` runs a forward.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from calibrl.trl.trainer import CalibratedGRPOTrainer

__all__ = [
    "GenerationLogprobs",
    "can_record_generation_logprobs",
    "effective_generation_config",
    "is_plain_sampling",
    "recording_generation_logprobs",
]


class GenerationLogprobs:
    """Records log_softmax(logits / T) of each sampled token during ``model.generate`` with two hooks: the causal
    LM's forward output (its final ``logits`` of step t, after any post-processing of the head's output: Granite's
    ``logits_scaling``, Gemma's soft-capping, Cohere's ``logit_scale``) and the input embedding's input (the token
    chosen at step t, fed at step t+1). Only the current step's [B, V] log-probs are held: memory O(B * V)."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.prev: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def on_embed(self, _module, args, kwargs=None):
        input_ids = args[0] if args else (kwargs or {}).get("input")
        if self.prev is not None and input_ids is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:].to(self.prev.device)).squeeze(1))
            self.prev = None

    def on_forward(self, _module, _args, output):
        logits = getattr(output, "logits", None)
        if logits is None:
            logits = output[0] if isinstance(output, (tuple, list)) else output
        logits = logits[:, -1] if logits.dim() == 3 else logits  # [B, V] the last position's
        self.prev = torch.log_softmax(logits.float() / self.temperature, dim=-1)

    def finish(self, completion_ids: list[list[int]], pad_id: int) -> torch.Tensor | None:
        """[B, n_steps] token log-probs aligned with the completion tokens (garbage after EOS: mask it)."""
        if self.prev is None:
            return None
        n = len(self.steps) + 1
        last = torch.tensor([ids[n - 1] if len(ids) >= n else pad_id for ids in completion_ids], device=self.prev.device)
        self.steps.append(self.prev.gather(1, last.unsqueeze(1)).squeeze(1))
        self.prev = None
        if any(len(ids) > n for ids in completion_ids):
            return None  # not the plain single-call generation we understand
        return torch.stack(self.steps, dim=1)


@contextmanager
def recording_generation_logprobs(model: torch.nn.Module, temperature: float):
    """Hooks a :class:`GenerationLogprobs` onto ``model``'s input embedding and onto the causal LM whose forward
    ``generate`` calls (the base model under PEFT) while the block runs."""
    recorder = GenerationLogprobs(temperature)
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    handles = [
        model.get_input_embeddings().register_forward_pre_hook(recorder.on_embed, with_kwargs=True),
        causal_lm.register_forward_hook(recorder.on_forward),
    ]
    try:
        yield recorder
    finally:
        for handle in handles:
            handle.remove()


# Generation settings whose values leave the sampled distribution softmax(logits / T): anything else adds a
# logits processor (top-k, nucleus, penalties, suppressed or forced tokens...) that the recording would ignore.
_NEUTRAL_SAMPLING: dict[str, tuple] = {
    "top_k": (None, 0), "top_p": (None, 1.0), "min_p": (None, 0.0), "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0), "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,), "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,), "sequence_bias": (None,), "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,), "exponential_decay_length_penalty": (None,), "min_length": (None, 0),
    "min_new_tokens": (None, 0), "guidance_scale": (None, 1.0), "watermarking_config": (None,),
    "num_beams": (None, 1), "diversity_penalty": (None, 0.0), "remove_invalid_values": (None, False),
}


def effective_generation_config(model: torch.nn.Module, requested) -> Any | None:
    """The generation config ``model.generate(generation_config=requested)`` really samples with: transformers 5
    fills every unset (None) field from ``model.generation_config``, then from its global defaults (``top_k``:
    50). None when it cannot be worked out."""
    if requested is None:
        return None
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        config, _ = causal_lm._prepare_generation_config(requested)
    except (AttributeError, TypeError, ValueError):
        return None
    return config


def is_plain_sampling(config) -> bool:
    """Whether ``config`` samples from softmax(logits / temperature) with no other logits processor."""
    if config is None or not getattr(config, "do_sample", False):
        return False
    for name, neutral in _NEUTRAL_SAMPLING.items():
        value = getattr(config, name, None)
        if value not in neutral and value not in ([], {}):
            return False
    return True


def can_record_generation_logprobs(trainer: CalibratedGRPOTrainer) -> bool:
    """Whether the sampled tokens' log-probs can be recorded during generation: transformers generation (no vLLM,
    no tools, no continuous batching, no custom rollout) with plain temperature sampling as judged from the
    generation config ``generate`` really uses (TRL's, completed from the model's; :func:`is_plain_sampling`), and
    an estimator that reads ``logprob_mean``."""
    args = trainer.args
    return (
        args.rollout_logprobs == "auto" and not trainer.use_vllm and not trainer.tools
        and trainer.environment_factories is None and trainer.rollout_func is None
        and not getattr(args, "use_transformers_continuous_batching", False)
        and not getattr(args, "use_transformers_paged", False)  # deprecated alias (TRL < 2)
        and not getattr(trainer, "use_transformers_continuous_batching", False)
        and not args.generation_kwargs and bool(trainer._calibrl_inputs & {"logprob_mean"})
        and is_plain_sampling(effective_generation_config(
            trainer.accelerator.unwrap_model(trainer.model), getattr(trainer, "generation_config", None)
        ))
    )
