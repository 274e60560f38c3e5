"""TRL integration: ``CalibratedGRPOConfig`` and ``CalibratedGRPOTrainer``.

``CalibratedGRPOTrainer`` is TRL's ``GRPOTrainer`` with the advantage step replaced by any estimator registered in
:mod:`calibrl.advantages` (``capo``, ``gcpo``, ``seed_grpo``, ``codapo``, ``cde``, ``grpo``, ``dr_grpo``, ``rloo``,
or your own), an optional decision-token calibration term (arXiv 2601.13284), and calibration telemetry logged
through TRL's own metrics (TensorBoard / W&B / trackio, keys ``calibration/...``).

How it plugs into TRL (1.16), following the maintainers' recommended extension point:

* ``_generate_and_score_completions`` is overridden: it calls TRL's, then builds a :class:`calibrl.RolloutBatch`
  for the WHOLE generation batch (rewards, log-probs and embeddings are gathered across processes, so a group
  split over ranks is handled), runs :func:`calibrl.compute_advantages`, and replaces ``"advantages"`` in the
  returned dict by this process's slice, taken exactly as TRL takes it.
* rewards: TRL's weighted sum of the reward functions (``reward_weights``), captured from ``_calculate_rewards``.
  A completion every reward function returned ``None`` for ("unscorable") is put in a group of its own and gets
  advantage 0, as TRL does.
* correctness: a completion is correct when the UNWEIGHTED value of ONE reward function exceeds 0.5:
  ``correctness_reward`` (default: the first reward function), not the weighted total, so with
  ``[math, format]`` a wrong answer in ``\boxed{}`` (total 1.0) stays wrong. Estimators that rank completions by
  correctness (``capo``: its pairs and its noise mask) receive that function's column as their ``rewards``; the
  others (``grpo``, ``dr_grpo``, ``rloo``, ``gcpo``, ``seed_grpo``, ``codapo``, ``cde`` and user estimators)
  receive the weighted total. Telemetry and the decision term use the same correctness.
* log-probs of the ROLLOUT policy: TRL keeps ``old_per_token_logps`` only when generation and optimisation are out
  of step (or with vLLM importance sampling); otherwise we compute them with TRL's own
  ``_get_per_token_logps_and_entropies`` under ``no_grad`` (one extra forward pass, only when the estimator or
  the telemetry needs them). ``logprob_mean`` is their mean over the completion mask (tool tokens excluded).
* reference log-probs (CAPO's noise mask): TRL's ``ref_per_token_logps`` when ``beta > 0``; with ``beta == 0`` the
  trainer still loads a frozen reference: a copy of the initial model, or, with PEFT, the adapter-disabled base
  (TRL's own mechanism), and runs it only for the mask.
* embeddings (GCPO): mean over the completion tokens of the policy's last hidden states, captured with a forward
  hook on the backbone during the same extra forward pass.
* answer ids (SEED-GRPO): the final answer of each completion (last ``\\boxed{}`` content, else the decision class,
  else the stripped last line), equal strings clustered within each prompt.
* decision tasks (``decision_classes`` set): the decision token is the last class token in the completion (bare or
  space-prefixed spelling, e.g. "B" or " B"); its
  advantage is zeroed (``decision_zero_advantage``) and ``decision_loss_coef * decision_token_loss`` is added to
  the loss in ``_compute_loss``; the decision logits come from the hidden states of the forward pass TRL already
  does (captured by a hook; no second forward).

Every TRL option that does not conflict keeps working: ``loss_type``, ``importance_sampling_level="sequence"``
(GSPO), ``beta`` (KL), vLLM, PEFT, ``num_iterations``, gradient accumulation, multi-process training. With
``advantage_estimator="grpo"`` and ``scale_rewards`` other than ``"group"`` (or ``multi_objective_aggregation=
"normalize_then_sum"``), TRL's own advantages are kept, since they are that setting's GRPO.
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from trl import GRPOConfig, GRPOTrainer

from calibrl.advantages import compute_advantages, get_estimator
from calibrl.batch import RolloutBatch

__all__ = ["CalibratedGRPOConfig", "CalibratedGRPOTrainer", "extract_answer", "estimator_inputs"]


# --------------------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------------------


@dataclass
class CalibratedGRPOConfig(GRPOConfig):
    r"""Configuration for :class:`CalibratedGRPOTrainer`: every :class:`trl.GRPOConfig` field, plus:

    > Advantage estimator

    advantage_estimator (`str`, defaults to `"capo"`): any name in ``calibrl.available_estimators()``.
    advantage_params (`dict`, *optional*): extra keyword parameters for the estimator (override the ``capo_*`` /
        ``gcpo_*`` fields below).
    capo_tau, capo_normalize, capo_mask, capo_ref_high, capo_ref_low, capo_ref_high_quantile,
        capo_ref_low_quantile: CAPO (arXiv 2604.12632) parameters.
    gcpo_measure: GCPO (arXiv 2605.21801) disagreement measure.

    > Decision-token calibration (arXiv 2601.13284)

    correctness_reward (`str`, *optional*): the reward function whose own (unweighted) value > 0.5 defines a
        correct completion (CAPO's pairs and mask, telemetry, the decision term); default: the first one.
    decision_classes (`list[str]`, *optional*): class strings; enables the decision-token term.
    decision_loss_coef (`float`, defaults to `1e-3`): lambda.
    decision_zero_advantage (`bool`, defaults to `True`): zero the policy-gradient advantage at the decision token.

    > Telemetry

    calibration_logging (`bool`, defaults to `True`): log ``calibration/...`` metrics every generation batch.
    """

    advantage_estimator: str = field(
        default="capo",
        metadata={
            "help": "Advantage estimator: any name in `calibrl.available_estimators()`, e.g. `capo` (CAPO, "
            "arXiv 2604.12632), `gcpo` (arXiv 2605.21801), `seed_grpo` (arXiv 2505.12346), `codapo`, `cde` "
            "(arXiv 2509.09675), `grpo`, `dr_grpo`, `rloo`."
        },
    )
    advantage_params: dict | None = field(
        default=None,
        metadata={"help": "Extra keyword parameters for the advantage estimator, e.g. `{\"alpha\": 1.0}`. They "
                  "override the `capo_*` / `gcpo_*` fields."},
    )
    capo_tau: float = field(
        default=0.6,
        metadata={"help": "CAPO logistic-surrogate temperature tau (CAPO, arXiv 2604.12632: 0.6 for 1.5B, 0.5 "
                  "for 7B)."},
    )
    capo_normalize: str = field(
        default="group",
        metadata={"help": "CAPO normaliser of the pairwise sum: `group` (1/G, our reading, reduces to Dr.GRPO as "
                  "tau grows), `pairs` (1/(n_correct*n_wrong)) or `none` (CAPO, arXiv 2604.12632)."},
    )
    capo_mask: str = field(
        default="none",
        metadata={"help": "CAPO reference-perplexity noise mask: `none`, `fixed` (capo_ref_high / capo_ref_low) "
                  "or `quantile` (batch quantiles). Needs the frozen reference model, which is loaded even when "
                  "beta == 0 (CAPO, arXiv 2604.12632)."},
    )
    capo_ref_high: float = field(
        default=2.5,
        metadata={"help": "CAPO mask: correct samples with reference perplexity above this get advantage 0 "
                  "(2.5 for Qwen2.5-Math; CAPO, arXiv 2604.12632)."},
    )
    capo_ref_low: float = field(
        default=1.05,
        metadata={"help": "CAPO mask: wrong samples with reference perplexity below this get advantage 0 "
                  "(1.05 for Qwen2.5-Math; CAPO, arXiv 2604.12632)."},
    )
    capo_ref_high_quantile: float = field(
        default=0.75,
        metadata={"help": "CAPO mask `quantile`: batch quantile of reference perplexity used as ref_high "
                  "(CAPO, arXiv 2604.12632)."},
    )
    capo_ref_low_quantile: float = field(
        default=0.25,
        metadata={"help": "CAPO mask `quantile`: batch quantile of reference perplexity used as ref_low "
                  "(CAPO, arXiv 2604.12632)."},
    )
    gcpo_measure: str = field(
        default="cosine",
        metadata={"help": "GCPO geometry-aware disagreement: `cosine` (Cosine Dispersion) or `barycentric` "
                  "(Barycentric Transport) over mean-pooled hidden states (GCPO, arXiv 2605.21801; our reading)."},
    )
    cde_omega_schedule: str = field(
        default="constant",
        metadata={"help": "Annealing of CDE's bonus weight omega over training (CDE, arXiv 2509.09675, anneals it; "
                  "the schedule is our reading): `constant`, `linear` (omega * (1 - step / max_steps)) or `cosine` "
                  "(omega * (1 + cos(pi * step / max_steps)) / 2). The base omega is advantage_params['omega'] "
                  "(default 1.0)."},
    )
    correctness_reward: str | None = field(
        default=None,
        metadata={"help": "Name of the reward function whose own (unweighted) value > 0.5 defines a correct "
                  "completion, for the estimators that rank by correctness (capo), the telemetry and the "
                  "decision term; the others use the weighted total. A name TRL reports for the function (its "
                  "`__name__`, or a reward model's id) or a calibrl registered reward name (`math`). Default: the "
                  "first reward function."},
    )
    decision_classes: list[str] | None = field(
        default=None,
        metadata={"help": "Class strings of a decision task (e.g. [\"A\", \"B\", \"C\", \"D\"]), each a single "
                  "token bare or with a leading space; both spellings count (\" B\" in Qwen's BPE), a class's "
                  "probability is the sum of its spellings'. "
                  "Enables decision-token calibration (arXiv 2601.13284): the last class token of a completion "
                  "is its decision."},
    )
    decision_loss_coef: float = field(
        default=1e-3,
        metadata={"help": "lambda of the decision-token cross-entropy (one-hot target when correct, uniform when "
                  "wrong; arXiv 2601.13284 uses 1e-3)."},
    )
    decision_zero_advantage: bool = field(
        default=True,
        metadata={"help": "Zero the policy-gradient advantage at the decision token, so only the calibration "
                  "term shapes it (arXiv 2601.13284)."},
    )
    rollout_logprobs: str = field(
        default="auto",
        metadata={"help": "Where the rollout policy's token log-probs come from when TRL has none: `auto` records "
                  "them during transformers generation (log_softmax(logits / temperature) of each sampled token, no "
                  "extra forward) when sampling is plain temperature sampling (top_k 0, top_p 1, no min_p, no "
                  "repetition penalty, no generation_kwargs, no tools), else runs one extra no-grad forward; "
                  "`forward` always runs the forward."},
    )
    calibration_logging: bool = field(
        default=True,
        metadata={"help": "Log calibration telemetry (AUROC of mean token log-prob vs correctness, pooled and per "
                  "prompt; confidence of right vs wrong; masked fraction; advantage statistics; decision ECE) as "
                  "`calibration/...` metrics (CAPO, arXiv 2604.12632; arXiv 2601.13284)."},
    )

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.decision_classes, str):
            self.decision_classes = [c for c in self.decision_classes.split(",") if c]
        for name in ("capo_mask",):
            if getattr(self, name) not in ("none", "fixed", "quantile"):
                raise ValueError(f"{name} must be 'none', 'fixed' or 'quantile', got {getattr(self, name)!r}")
        if self.capo_normalize not in ("group", "pairs", "none"):
            raise ValueError(f"capo_normalize must be 'group', 'pairs' or 'none', got {self.capo_normalize!r}")
        if self.cde_omega_schedule not in ("constant", "linear", "cosine"):
            raise ValueError(f"cde_omega_schedule must be constant, linear or cosine, got {self.cde_omega_schedule!r}")
        if self.rollout_logprobs not in ("auto", "forward"):
            raise ValueError(f"rollout_logprobs must be 'auto' or 'forward', got {self.rollout_logprobs!r}")
        if self.advantage_params is not None and not isinstance(self.advantage_params, dict):
            raise ValueError(f"advantage_params must be a dict, got {type(self.advantage_params).__name__}")

    # ------------------------------------------------------------------ helpers read by the trainer
    def estimator_params(self) -> dict[str, Any]:
        """Keyword parameters passed to the estimator: the ``capo_*``/``gcpo_*`` fields it uses + advantage_params."""
        params: dict[str, Any] = {}
        if self.advantage_estimator == "capo":
            params = dict(
                tau=self.capo_tau, normalize=self.capo_normalize, mask=self.capo_mask, ref_high=self.capo_ref_high,
                ref_low=self.capo_ref_low, ref_high_quantile=self.capo_ref_high_quantile,
                ref_low_quantile=self.capo_ref_low_quantile,
            )
        elif self.advantage_estimator == "gcpo":
            params = dict(measure=self.gcpo_measure)
        params.update(self.advantage_params or {})
        return params


# Which optional RolloutBatch fields each built-in estimator reads. Unknown (user) estimators receive
# logprob_mean and, when it is available anyway (beta > 0), ref_logprob_mean.
_ESTIMATOR_INPUTS: dict[str, frozenset[str]] = {
    "grpo": frozenset(),
    "dr_grpo": frozenset(),
    "rloo": frozenset(),
    "capo": frozenset({"logprob_mean"}),
    "codapo": frozenset({"logprob_mean"}),
    "cde": frozenset({"logprob_mean"}),
    "seed_grpo": frozenset({"logprob_mean", "answer_ids"}),
    "gcpo": frozenset({"logprob_mean", "embeddings"}),
}


def estimator_inputs(name: str, params: dict[str, Any]) -> frozenset[str]:
    """Optional RolloutBatch fields the estimator ``name`` needs with ``params`` (CAPO's mask adds the reference)."""
    needed = set(_ESTIMATOR_INPUTS.get(name, {"logprob_mean"}))
    if name == "capo" and params.get("mask", "none") != "none":
        needed.add("ref_logprob_mean")
    return frozenset(needed)


# Estimators that use the rewards only through correctness (reward > 0.5): they receive the correctness
# function's column (``correctness_reward``) instead of the weighted total.
_RANKS_BY_CORRECTNESS: frozenset[str] = frozenset({"capo"})


def extract_answer(text: str, classes: list[str] | None = None) -> str:
    """Final answer of a completion for answer clustering: the last ``\\boxed{...}`` / ``\\fbox{...}`` content
    (:func:`calibrl.tasks.rewards.last_boxed`, the same extraction the ``math`` reward scores), else the decision
    (:func:`calibrl.tasks.rewards.extract_decision`, the ``decision`` reward's) for decision tasks, else the
    stripped last non-empty line ("" if none)."""
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


def _completion_text(completion: Any) -> str:
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


def _answer_ids(answers: list[str], group_ids: list[int]) -> list[int]:
    table: dict[tuple[int, str], int] = {}
    return [table.setdefault((g, a), len(table)) for g, a in zip(group_ids, answers)]


@contextmanager
def _capture_hidden(module: torch.nn.Module, store: list):
    """Append the backbone's last hidden state [B, L, D] to ``store`` on every forward while active."""

    def hook(_module, _args, output):
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None:
            hidden = output[0] if isinstance(output, (tuple, list)) else output
        store.append(hidden)

    handle = module.register_forward_hook(hook)
    try:
        yield store
    finally:
        handle.remove()


class _GenerationLogprobs:
    """Records log_softmax(logits / T) of each sampled token during ``model.generate`` with two hooks: the LM head's
    output (logits of step t) and the input embedding's input (the token chosen at step t, fed at step t+1). Only
    the current step's [B, V] log-probs are held, so memory stays O(B * V)."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.prev: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def on_embed(self, _module, args, kwargs=None):
        input_ids = args[0] if args else (kwargs or {}).get("input")
        if self.prev is not None and input_ids is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:].to(self.prev.device)).squeeze(1))
            self.prev = None

    def on_head(self, _module, _args, output):
        logits = output[:, -1] if output.dim() == 3 else output
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


_MODEL_KWARG_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)


# --------------------------------------------------------------------------------------------------------------
# Trainer
# --------------------------------------------------------------------------------------------------------------


class CalibratedGRPOTrainer(GRPOTrainer):
    """TRL ``GRPOTrainer`` with calibrl advantages, decision-token calibration and calibration telemetry.

    Same constructor as :class:`trl.GRPOTrainer`; ``args`` must be a :class:`CalibratedGRPOConfig`.

    After every generation batch, ``self.last_rollout`` holds what the advantage step saw and produced (for
    inspection and tests): ``batch`` (the full :class:`RolloutBatch`), ``advantages`` (full, [N]), ``info``
    (estimator diagnostics), ``trl_advantages`` (TRL's own advantages for this process's slice), ``process_slice``,
    ``mode``, ``metrics`` (the telemetry dict).
    """

    _tag_names = ["trl", "grpo", "calibrl"]
    _calibrl_pending: dict | None = None  # telemetry waiting for log-probs from the loss pass
    _calibrl_capture: list | None = None
    _calibrl_gen_logps: torch.Tensor | None = None  # [B, n_steps] recorded during generation

    def __init__(self, model, reward_funcs=None, args: CalibratedGRPOConfig | None = None, *pargs, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model") or "model"
            args = CalibratedGRPOConfig(f"{str(name).split('/')[-1]}-CalibratedGRPO")
        if not isinstance(args, CalibratedGRPOConfig):
            raise TypeError(
                f"CalibratedGRPOTrainer needs args=CalibratedGRPOConfig(...), got {type(args).__name__}; build one "
                "with the same fields plus advantage_estimator=..."
            )
        get_estimator(args.advantage_estimator)  # fail early with the list of registered names
        self._calibrl_params = args.estimator_params()
        self._calibrl_inputs = estimator_inputs(args.advantage_estimator, self._calibrl_params)
        needs_ref = "ref_logprob_mean" in self._calibrl_inputs  # (or beta > 0: TRL's KL term)

        own_ref = None
        beta_during_init = None  # temporarily replaced args.beta while TRL's __init__ runs
        peft_config = kwargs.get("peft_config")
        needs_ref = needs_ref or args.beta != 0.0
        if needs_ref:
            from accelerate.utils import is_peft_model
            from transformers import PreTrainedModel

            plain_instance = isinstance(model, PreTrainedModel) and not is_peft_model(model) and peft_config is None
            in_memory = plain_instance and not getattr(model.config, "_name_or_path", "")
            if plain_instance and (args.beta == 0.0 or (in_memory and not args.sync_ref_model)):
                # Copy of the initial model, taken before TRL patches the policy's forward. (TRL itself reloads
                # the reference from the model's path, which a model built in memory does not have.)
                own_ref = copy.deepcopy(model)
                if args.beta != 0.0:
                    beta_during_init = 0.0
            elif args.beta == 0.0:
                # Let TRL build its reference (from the model path, or the PEFT adapter-disabled base / "ref"
                # adapter) exactly as it does for beta > 0, then set beta back to 0 (no KL term).
                beta_during_init = 1.0
        real_beta = args.beta
        if beta_during_init is not None:
            args.beta = beta_during_init
        try:
            super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        finally:
            args.beta = real_beta
        self.beta = real_beta
        if own_ref is not None:
            self._install_own_ref(own_ref)

        self._calibrl_rewards_per_func: torch.Tensor | None = None
        self._calibrl_completions: list | None = None
        self.last_rollout: dict[str, Any] | None = None
        self._decision_class_ids = self._resolve_decision_classes()
        self._correctness_index = self._resolve_correctness_reward()

    # ------------------------------------------------------------------ setup helpers
    def _install_own_ref(self, ref) -> None:
        from trl.models import prepare_deepspeed, prepare_fsdp
        from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        if self.args.disable_dropout:
            disable_dropout_in_model(ref)
        add_fused_lm_head(ref, temperature=self.temperature)
        if self.is_deepspeed_enabled:
            ref = prepare_deepspeed(ref, self.accelerator)
        elif self.is_fsdp_enabled:
            ref = prepare_fsdp(ref, self.accelerator)
        else:
            ref = self.accelerator.prepare_model(ref, evaluation_mode=True)
        self.ref_model = ref

    def _resolve_correctness_reward(self) -> int:
        """Column of ``rewards_per_func`` whose value > 0.5 means correct (``args.correctness_reward``)."""
        name = self.args.correctness_reward
        if name is None:
            return 0
        names = list(self.reward_func_names)
        if name in names:
            if names.count(name) > 1:
                raise ValueError(f"correctness_reward: {name!r} names {names.count(name)} reward functions ({names})")
            return names.index(name)
        try:  # a calibrl registered reward name (recipes: `rewards: [math, format]`)
            from calibrl.tasks.registry import get_reward

            fn = get_reward(name)
        except KeyError:
            fn = None
        matches = [i for i, f in enumerate(self.reward_funcs) if fn is not None and f is fn]
        if len(matches) == 1:
            return matches[0]
        raise ValueError(f"correctness_reward: {name!r} is not one of this trainer's reward functions {names}")

    def _resolve_decision_classes(self) -> torch.Tensor | None:
        """Token ids of every single-token spelling of each class ("B" and " B": BPE tokenizers such as Qwen's
        write "Answer: B" with the token " B"), [K]; ``self._decision_owner`` [K] maps each to its class index.
        Spellings come from :func:`calibrl.evaluation.generate._class_variants` (the same rule ``calibrl generate`` uses)."""
        classes = self.args.decision_classes
        self._decision_owner = None
        if not classes:
            return None
        from calibrl.evaluation.generate import GenerateError, _class_variants

        try:
            ids, owner = _class_variants(self._tokenizer, classes)
        except GenerateError as exc:
            raise ValueError(f"decision_classes: {exc}") from None
        missing = sorted(set(range(len(classes))) - set(owner))
        if missing:  # a spelling of this class is already another class's token
            raise ValueError(f"decision_classes: {[classes[i] for i in missing]} share token ids with other classes")
        self._decision_owner = torch.tensor(owner, dtype=torch.long)
        return torch.tensor(ids, dtype=torch.long)

    def _decision_class_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, V] vocabulary logits -> [N, C] class logits: logsumexp over each class's spellings, so the class
        probability (softmax over classes) is the SUM of its spellings' probabilities."""
        ids = self._decision_class_ids.to(logits.device)
        owner = self._decision_owner.to(logits.device)
        selected = logits[:, ids]  # [N, K]
        n_classes = len(self.args.decision_classes)
        return torch.stack([torch.logsumexp(selected[:, owner == c], dim=-1) for c in range(n_classes)], dim=-1)

    def _backbone_and_head(self, model):
        unwrapped = self.accelerator.unwrap_model(model)
        base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
        backbone = getattr(base, "base_model", base)
        return backbone, base.get_output_embeddings()

    # ------------------------------------------------------------------ reward capture
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._calibrl_rewards_per_func = rewards_per_func  # gathered over processes: [N_total, n_funcs]
        self._calibrl_completions = completions  # this process's completions
        return rewards_per_func

    # ------------------------------------------------------------------ log-probs recorded during generation
    def _can_record_generation_logprobs(self) -> bool:
        args = self.args
        return (
            args.rollout_logprobs == "auto" and not self.use_vllm and not self.tools
            and self.environment_factories is None and self.rollout_func is None
            and not getattr(args, "use_transformers_continuous_batching", False)
            and not getattr(args, "use_transformers_paged", False)  # deprecated alias (TRL < 2)
            and not getattr(self, "use_transformers_continuous_batching", False)
            and not args.generation_kwargs
            and self.top_k in (0, None) and self.top_p in (1.0, None) and self.min_p is None
            and self.repetition_penalty in (1.0, None) and bool(self._calibrl_inputs & {"logprob_mean"})
        )

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        self._calibrl_gen_logps = None
        if not self._can_record_generation_logprobs():
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images=has_tool_images)
        unwrapped = self.accelerator.unwrap_model(self.model)
        recorder = _GenerationLogprobs(self.temperature)
        handles = [
            unwrapped.get_input_embeddings().register_forward_pre_hook(recorder.on_embed, with_kwargs=True),
            unwrapped.get_output_embeddings().register_forward_hook(recorder.on_head),
        ]
        try:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
            )
        finally:
            for handle in handles:
                handle.remove()
        self._calibrl_gen_logps = recorder.finish(completion_ids, self._tokenizer.pad_token_id)
        return completion_ids, logprobs

    # ------------------------------------------------------------------ the advantage step
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        return self._calibrl_replace_advantages(output)

    def _needed_fields(self, mode: str) -> set[str]:
        needed = set(self._calibrl_inputs)
        if self.args.calibration_logging:
            needed.add("logprob_mean")
        return needed

    @torch.no_grad()
    def _rollout_forward(self, output, mask, *, want_logps: bool, want_embeddings: bool, want_decision: bool):
        """One no-grad forward of the policy: per-token log-probs, completion-mean hidden states, decision logits."""
        from trl.models.utils import disable_gradient_checkpointing

        prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        logits_to_keep = completion_ids.size(1)
        mode = "train" if self.model.training else "eval"
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        hidden_store: list = []
        capture = want_embeddings or want_decision
        backbone, lm_head = self._backbone_and_head(self.model)
        ctx = _capture_hidden(backbone, hidden_store) if capture else nullcontext()
        kwargs = {k: output[k] for k in _MODEL_KWARG_KEYS if k in output}
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs), ctx:
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs
            )
        result: dict[str, torch.Tensor] = {"per_token_logps": logps}
        if capture:
            hidden = torch.cat(hidden_store, dim=0)  # [B, P+C, D]
            if want_embeddings:
                comp_hidden = hidden[:, -logits_to_keep:].float()
                m = mask.unsqueeze(-1).float()
                result["embeddings"] = (comp_hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
            if want_decision:
                result["decision_hidden"] = hidden
        return result

    def _decision_logits(self, hidden, prompt_len: int, positions: torch.Tensor, model) -> torch.Tensor:
        """Logits [N, V] (at the sampling temperature) predicting the token at completion position ``positions``."""
        _, lm_head = self._backbone_and_head(model)
        rows = torch.arange(hidden.size(0), device=hidden.device)
        seq_pos = (prompt_len + positions.clamp(min=0) - 1).to(hidden.device)
        h = hidden[rows, seq_pos]  # [N, D]
        logits = lm_head(h.to(lm_head.weight.dtype) if hasattr(lm_head, "weight") else h).float()
        return logits / self.temperature

    def _ref_per_token_logps(self, output):
        if "ref_per_token_logps" in output:
            return output["ref_per_token_logps"]
        from trl.models.utils import disable_gradient_checkpointing

        prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        logits_to_keep = completion_ids.size(1)
        mode = "train" if self.model.training else "eval"
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        kwargs = {k: output[k] for k in _MODEL_KWARG_KEYS if k in output}
        with torch.no_grad():
            if self.ref_model is not None:
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs
                )
            else:
                from trl.trainer.utils import use_adapter

                unwrapped = self.accelerator.unwrap_model(self.model)
                if not hasattr(unwrapped, "peft_config"):
                    raise RuntimeError("calibrl: the estimator needs a reference model but none was loaded")
                with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None), \
                        disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                    logps, _, _ = self._get_per_token_logps_and_entropies(
                        self.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs
                    )
        return logps

    def _step_params(self) -> dict[str, Any]:
        """Estimator parameters for this step (CDE's omega annealed by ``cde_omega_schedule``)."""
        params = dict(self._calibrl_params)
        schedule = self.args.cde_omega_schedule
        if self.args.advantage_estimator == "cde" and schedule != "constant":
            total = max(int(self.state.max_steps or self.args.max_steps or 1), 1)
            progress = min(max(self.state.global_step / total, 0.0), 1.0)
            factor = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
            params["omega"] = float(params.get("omega", 1.0)) * factor
        return params

    def _calibrl_replace_advantages(self, output: dict) -> dict:
        from accelerate.utils import gather_object

        args = self.args
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        rewards_per_func = self._calibrl_rewards_per_func
        completions = self._calibrl_completions
        n_local = output["completion_ids"].size(0)
        process_slice = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval

        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        rewards = rewards.masked_fill(unscorable, 0.0)
        # Correctness: one reward function's own value (before weighting) > 0.5; None (NaN) counts as wrong.
        correct_signal = torch.nan_to_num(rewards_per_func[:, self._correctness_index].float(), nan=0.0)
        correct_signal = correct_signal.masked_fill(unscorable, 0.0).to(rewards.dtype)
        correct_all = correct_signal > 0.5
        n_total = rewards.numel()
        group_ids = torch.arange(n_total, device=device) // num_generations
        n_groups = (n_total + num_generations - 1) // num_generations
        # An unscorable completion forms a group of its own (excluded from its prompt's baseline, advantage 0).
        group_ids = torch.where(unscorable, n_groups + torch.arange(n_total, device=device), group_ids)

        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        needed = self._needed_fields(mode)
        decision = self._decision_class_ids is not None
        want_dec = decision and args.calibration_logging  # decision probabilities for telemetry
        want_emb = "embeddings" in needed
        lengths_local = mask.sum(dim=1)

        fields: dict[str, torch.Tensor] = {}
        decision_hidden = None
        old = output.get("old_per_token_logps")
        gen, self._calibrl_gen_logps = self._calibrl_gen_logps, None
        n_tokens = output["completion_ids"].size(1)
        if old is None and gen is not None and gen.size(0) == n_local and gen.size(1) >= n_tokens:
            old_like = gen[:, :n_tokens].to(device)
        else:
            old_like = old
        # Telemetry-only log-probs, on-policy: no extra forward; they are read from the loss pass TRL does anyway
        # (per_token_logps there equal the rollout policy's until the optimizer steps) and logged once every row
        # of this generation batch went through the loss.
        defer_lpm = (
            args.calibration_logging and "logprob_mean" not in self._calibrl_inputs and old_like is None
            and not want_emb and not want_dec
        )
        if defer_lpm:
            needed.discard("logprob_mean")
        if "logprob_mean" in needed or want_emb or want_dec:
            if old_like is not None and not want_emb and not want_dec:
                per_token = old_like
            else:
                fwd = self._rollout_forward(
                    output, mask, want_logps=True, want_embeddings=want_emb, want_decision=want_dec
                )
                per_token = old if old is not None else fwd["per_token_logps"]
                if want_emb:
                    fields["embeddings"] = self.accelerator.gather(fwd["embeddings"].contiguous())
                decision_hidden = fwd.get("decision_hidden")
            lpm_local = per_token.float().masked_fill(~mask.bool(), 0.0).sum(1) / mask.sum(1).clamp(min=1).float()
            fields["logprob_mean"] = self.accelerator.gather(lpm_local)
        if "ref_logprob_mean" in needed or "ref_per_token_logps" in output:
            ref_tok = self._ref_per_token_logps(output)
            ref_lpm = (ref_tok.float() * mask).sum(1) / mask.sum(1).clamp(min=1).float()
            fields["ref_logprob_mean"] = self.accelerator.gather(ref_lpm)
        if "answer_ids" in needed:
            texts = gather_object([_completion_text(c) for c in completions])
            answers = [extract_answer(t, args.decision_classes) for t in texts]
            fields["answer_ids"] = torch.tensor(_answer_ids(answers, group_ids.tolist()), device=device)
        fields["lengths"] = self.accelerator.gather(lengths_local)

        est_rewards = correct_signal if args.advantage_estimator in _RANKS_BY_CORRECTNESS else rewards
        batch = RolloutBatch(rewards=est_rewards, group_ids=group_ids, **fields)
        trl_advantages = output["advantages"]
        keep_trl = args.advantage_estimator == "grpo" and (
            self.scale_rewards != "group" or self.multi_objective_aggregation != "sum_then_normalize"
        )
        if keep_trl:
            all_adv = self.accelerator.gather(trl_advantages)
            info: dict[str, Any] = {"trl_advantages_kept": 1.0}
        else:
            # Estimators ignore the optional fields they do not read, so the full batch is passed.
            all_adv, info = compute_advantages(
                batch, args.advantage_estimator, return_info=True, **self._step_params()
            )
            all_adv = torch.nan_to_num(all_adv.to(torch.float32), nan=0.0).masked_fill(unscorable, 0.0)
        advantages = all_adv[process_slice]

        # Decision token: position, chosen class, correctness; zero the advantage there.
        decision_probs_all = None
        decision_correct_all = None
        if decision:
            from calibrl.losses.decision import chosen_classes, find_decision_positions, zero_decision_advantages

            class_ids = self._decision_class_ids.to(device)
            positions = find_decision_positions(
                completion_ids=output["completion_ids"], completion_mask=mask, class_token_ids=class_ids
            )
            chosen_variant = chosen_classes(
                completion_ids=output["completion_ids"], decision_positions=positions, class_token_ids=class_ids
            )  # index into the spellings [K]; mapped to the class index [C]
            owner = self._decision_owner.to(device)
            chosen = torch.where(chosen_variant >= 0, owner[chosen_variant.clamp(min=0)], chosen_variant)
            rows = torch.arange(n_local, device=device)
            correct_local = correct_all[process_slice]
            output["calibrl_decision_positions"] = positions
            output["calibrl_decision_chosen"] = chosen
            output["calibrl_decision_correct"] = correct_local
            if args.decision_zero_advantage:
                advantages = zero_decision_advantages(
                    advantages=advantages, completion_mask=mask, decision_positions=positions
                )
            if decision_hidden is not None and args.calibration_logging:
                logits = self._decision_logits(decision_hidden, output["prompt_ids"].size(1), positions, self.model)
                class_probs = torch.softmax(self._decision_class_logits(logits), dim=-1)
                p_chosen = class_probs[rows, chosen.clamp(min=0)]
                p_chosen = torch.where(chosen >= 0, p_chosen, torch.full_like(p_chosen, float("nan")))
                decision_probs_all = self.accelerator.gather(p_chosen)
                decision_correct_all = self.accelerator.gather(correct_local.float()) > 0.5

        output["advantages"] = advantages
        # TRL logs the advantages of the completions table from its own values; show ours instead.
        if len(self._logs["advantages"]) >= n_total and not keep_trl:
            for _ in range(n_total):
                self._logs["advantages"].pop()
            self._logs["advantages"].extend(all_adv.tolist())

        metrics: dict[str, float] = {}
        if defer_lpm:
            output["calibrl_row"] = torch.arange(n_local, device=device)
            self._calibrl_pending = {
                "fields": dict(rewards=est_rewards, group_ids=group_ids, **fields), "advantages": all_adv,
                "info": info, "correct": correct_all, "mode": mode, "lpm_local": torch.full((n_local,), float("nan"), device=device),
            }
        elif args.calibration_logging:
            metrics = self._log_telemetry(batch, all_adv, info, decision_probs_all, decision_correct_all, mode,
                                          correct_all)
        elif info:
            for key, value in info.items():
                if isinstance(value, (int, float)) and math.isfinite(float(value)):
                    self._metrics[mode][f"calibration/estimator/{key}"].append(float(value))

        self.last_rollout = {
            "batch": batch, "advantages": all_adv, "info": info, "trl_advantages": trl_advantages,
            "process_slice": process_slice, "mode": mode, "metrics": metrics, "correct": correct_all,
            "rewards": rewards,
        }
        return output

    def _log_telemetry(self, batch, advantages, info, decision_probs, decision_correct, mode,
                       correct) -> dict[str, float]:
        from calibrl.trl.telemetry import calibration_metrics

        metrics = calibration_metrics(
            batch, advantages=advantages, info=info, decision_probs=decision_probs, decision_correct=decision_correct,
            correct=correct,
        )
        for key, value in metrics.items():
            self._metrics[mode][f"calibration/{key}"].append(value)
        if self.last_rollout is not None and self.last_rollout.get("batch") is not None:
            self.last_rollout["metrics"] = metrics
        return metrics

    def _fill_pending_telemetry(self, inputs, per_token_logps) -> None:
        pending = self._calibrl_pending
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        lpm = (per_token_logps.float() * mask).sum(1) / mask.sum(1).clamp(min=1).float()
        rows = inputs["calibrl_row"]
        store = pending["lpm_local"]
        fresh = torch.isnan(store[rows])
        store[rows[fresh]] = lpm[fresh]
        if torch.isnan(store).any():
            return
        self._calibrl_pending = None
        fields = dict(pending["fields"])
        fields["logprob_mean"] = self.accelerator.gather(store)
        batch = RolloutBatch(**fields)
        if self.last_rollout is not None:
            self.last_rollout["batch"] = batch
        self._log_telemetry(batch, pending["advantages"], pending["info"], None, None, pending["mode"],
                            pending["correct"])

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._calibrl_capture is not None and not self._calibrl_capture:
            self._calibrl_capture.append(out[0].detach())  # the policy's log-probs of the loss pass
        return out

    # ------------------------------------------------------------------ the loss
    def _compute_loss(self, model, inputs):
        pending = self._calibrl_pending is not None and "calibrl_row" in inputs
        decision = self._decision_class_ids is not None and "calibrl_decision_positions" in inputs
        if not pending and not decision:
            return super()._compute_loss(model, inputs)
        self._calibrl_capture = [] if pending else None
        try:
            if not decision:
                loss = super()._compute_loss(model, inputs)
            else:
                backbone, _ = self._backbone_and_head(model)
                store: list = []
                with _capture_hidden(backbone, store):
                    loss = super()._compute_loss(model, inputs)
            captured = self._calibrl_capture
        finally:
            self._calibrl_capture = None
        if pending and captured:
            self._fill_pending_telemetry(inputs, captured[0])
        if not decision:
            return loss
        from calibrl.losses.decision import decision_token_loss

        positions = inputs["calibrl_decision_positions"]
        hidden = store[0] if len(store) == 1 else torch.cat(store, dim=0)
        logits = self._decision_logits(hidden, inputs["prompt_ids"].size(1), positions, model)
        class_logits = self._decision_class_logits(logits)  # [N, C]
        d_loss, d_metrics = decision_token_loss(
            decision_logits=class_logits, class_token_ids=torch.arange(class_logits.size(1), device=logits.device), chosen_class=inputs["calibrl_decision_chosen"],
            correct=inputs["calibrl_decision_correct"].bool(), lam=self.args.decision_loss_coef,
        )
        mode = "train" if self.model.training else "eval"
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = loss + d_loss / normalizer
        self._metrics[mode]["decision/loss"].append(self.accelerator.gather(d_loss.detach()).mean().item())
        for key, value in (d_metrics or {}).items():
            value = float(value.item() if isinstance(value, torch.Tensor) else value)
            self._metrics[mode][f"decision/{key}"].append(value)
        return loss
