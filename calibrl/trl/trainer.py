"""``CalibratedGRPOTrainer``: TRL's ``GRPOTrainer`` with calibrl's advantage step, decision term and telemetry.

The class is a list of hooks into TRL 1.16's ``GRPOTrainer`` (trl/trainer/grpo_trainer.py), each overriding one
method and calling TRL's own before or around it; the work is in the modules beside this one:

=====================================  ==============================================================================
TRL 1.16 method overridden             what calibrl adds
=====================================  ==============================================================================
``__init__``                           reference model for CAPO's mask (estimators registered with
                                       ``noise_mask``) even at ``beta == 0`` (:mod:`.reference`);
                                       decision class tokens (:mod:`.decision`); the correctness reward
``_calculate_rewards``                 keeps the per-function rewards and this process's completions
``_generate_single_turn``              records the sampled tokens' log-probs during ``generate`` (:mod:`.generation`)
``_generate_and_score_completions``    replaces ``"advantages"``: TRL's output -> :class:`~calibrl.RolloutBatch`
                                       (:func:`.rollout.collect_rollout`, handed a :class:`.rollout.RolloutState`
                                       and the forwards of :mod:`.forward`) -> :func:`calibrl.compute_advantages` ->
                                       this process's slice; decision-token marks; telemetry (:mod:`.telemetry`);
                                       ``logprob_mean`` / ``correct`` / ``decision_prob`` columns of the
                                       completions table (``log_completions``)
``_get_per_token_logps_and_entropies`` keeps the loss pass's log-probs for telemetry (no extra forward)
``_compute_loss``                      adds ``decision_loss_coef * decision_token_loss`` (arXiv 2601.13284);
                                       ``loss_type`` ``clip_cov`` / ``kl_cov`` (arXiv 2505.22617): calibrl's
                                       policy loss (:mod:`calibrl.losses.covariance`) in place of TRL's
``training_step``                      on a device without Triton (the CPU), TRL's fused LM head projects tiles of
                                       at most :func:`calibrl.logprobs.fused_head_tile_tokens` positions
``log``                                leaves out metrics undefined for the whole logging period (no NaN / None)
``_save_checkpoint``                   also writes CAPO's frozen quantile-mask thresholds (``calibrl_capo_mask.json``)
``_load_optimizer_and_scheduler``      also restores them on resume (TRL's own pattern for its entropy controller)
``_get_train_sampler``                 TRL's sampler with ``set_epoch``, so a run resumed after its first epoch
                                       sees the prompts an uninterrupted run sees (:mod:`.sampler`)
=====================================  ==============================================================================

Every TRL option that does not conflict keeps working: ``loss_type``, ``importance_sampling_level="sequence"``
(GSPO), ``beta`` (KL), vLLM, PEFT, ``num_iterations``, gradient accumulation, multi-process training. With
``advantage_estimator="grpo"`` and ``scale_rewards`` other than ``"group"`` (or ``multi_objective_aggregation=
"normalize_then_sum"``), TRL's own advantages are kept, since they are that setting's GRPO.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import torch

from trl import GRPOTrainer

from calibrl.advantages import EstimatorFailed, EstimatorOutputError, compute_advantages, estimator_spec
from calibrl.advantages.capo import (QUANTILE_MASK_FILE, FrozenQuantileMask, frozen_quantile_params, mask_settings,
                                     read_mask_states, write_mask_states)
from calibrl.advantages.grpo import grpo as calibrl_grpo
from calibrl.batch import RolloutBatch, masked_row_mean
from calibrl.models import resolve_model
from calibrl.tasks.verbalized import confidence_reader
from calibrl.trl import decision as dec
from calibrl.losses.covariance import clip_cov_policy_loss, kl_cov_policy_loss
from calibrl.losses.ppo import aggregate_loss, kl_k3, masked_mean, on_mask
from calibrl.trl.config import COV_LOSS_TYPES, CalibratedGRPOConfig
from calibrl.trl.generation import can_record_generation_logprobs, recording_generation_logprobs
from calibrl.trl.reference import install_reference, plan_reference
from calibrl.trl.forward import (
    PolicyForward,
    backbone_and_head,
    capture_hidden,
    ref_per_token_logps,
    rollout_forward,
)
from calibrl.trl.rollout import Rollout, RolloutState, collect_rollout, training_mask
from calibrl.trl.sampler import epoch_exact
from calibrl.trl.telemetry import PendingTelemetry, calibration_metrics, completion_columns, overwrite_last

__all__ = ["CalibratedGRPOTrainer", "CAPO_MASK_STATE_FILE"]

logger = logging.getLogger(__name__)

# the model inputs TRL 1.16's _compute_loss passes to _get_per_token_logps_and_entropies besides the token ids
_MODEL_INPUTS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
                 "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")

CAPO_MASK_STATE_FILE = QUANTILE_MASK_FILE  # in each checkpoint folder: FrozenQuantileMask.state_dict()


class CalibratedGRPOTrainer(GRPOTrainer):
    """TRL ``GRPOTrainer`` with calibrl advantages, decision-token calibration and calibration telemetry.

    Same constructor as :class:`trl.GRPOTrainer`; ``args`` must be a :class:`CalibratedGRPOConfig`.

    ``trainer.last_rollout`` (public, for inspection): after every generation batch a dict with

    * ``batch``: the :class:`calibrl.RolloutBatch` of the WHOLE generation batch (gathered over processes), as
      the estimator saw it (``logprob_mean`` filled in once the loss passes supplied it, when it was deferred);
    * ``advantages``: [N] the advantages of the whole batch (before the decision token's are zeroed);
    * ``info``: the estimator's diagnostics; ``metrics``: the telemetry dict logged for this batch;
    * ``trl_advantages``: TRL's own advantages for this process's rows; ``process_slice``: those rows;
    * ``correct``: [N] bool correctness; ``rewards``: [N] weighted total reward; ``mode``: "train" or "eval";
    * ``decision_probs``: [N] probability of the chosen decision class (NaN where none), or None;
    * ``params``: the estimator parameters of this step (CAPO's frozen ``ref_high`` / ``ref_low`` filled in).

    ``capo_mask="quantile"`` (estimators ``capo`` and ``grpo_mask``): ``trainer.capo_quantile_mask`` (a
    :class:`~calibrl.advantages.capo.FrozenQuantileMask`) freezes the reference-perplexity quantiles of the first
    ``capo_ref_quantile_batches`` training batches; they are logged every batch as ``capo/ref_ppl_high`` /
    ``capo/ref_ppl_low``, saved in every checkpoint (``calibrl_capo_mask.json``) and restored by
    ``train(resume_from_checkpoint=...)``. Evaluation batches read them and never set them.
    """

    _tag_names = ["trl", "grpo", "calibrl"]
    _calibrl_pending: PendingTelemetry | None = None  # telemetry waiting for log-probs from the loss pass
    _calibrl_capture: list | None = None  # the loss pass's per-token log-probs, while a capture is open
    _calibrl_gen_logps: torch.Tensor | None = None  # [B, n_steps] recorded during generation
    _calibrl_table_batches: int = 0  # generation batches whose rows calibrl added to the completions table

    # ---------------------------------------------------------------------------------------------------- hooks

    def __init__(self, model, reward_funcs=None, args: CalibratedGRPOConfig | None = None, *pargs, **kwargs):
        """Mirrors ``GRPOTrainer.__init__`` (TRL 1.16): TRL's, with the reference planned around it."""
        if model == "builtin:tiny":  # the testbed's char-level model, built here (no hub), with its tokenizer
            from calibrl.models import build_tiny_model

            model, tiny_tokenizer = build_tiny_model()
            if kwargs.get("processing_class") is None and len(pargs) < 3:  # pargs: train, eval dataset, processing
                kwargs["processing_class"] = tiny_tokenizer
        elif isinstance(model, str):  # a .gguf file or builtin:smollm2-135m-instruct -> its converted folder
            model = resolve_model(model)
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model") or "model"
            args = CalibratedGRPOConfig(f"{str(name).split('/')[-1]}-CalibratedGRPO")
        if not isinstance(args, CalibratedGRPOConfig):
            raise TypeError(
                f"CalibratedGRPOTrainer needs args=CalibratedGRPOConfig(...), got {type(args).__name__}; build one "
                "with the same fields plus advantage_estimator=..."
            )
        self._calibrl_spec = estimator_spec(args.advantage_estimator)  # fails early listing the registered names
        self._calibrl_params = args.estimator_params()
        self._calibrl_inputs = self._calibrl_spec.inputs_for(self._calibrl_params)
        self.capo_quantile_mask: FrozenQuantileMask | None = None
        if self._calibrl_spec.noise_mask != "no" and self._calibrl_params.get("mask") == "quantile":
            self.capo_quantile_mask = FrozenQuantileMask.from_params(self._calibrl_params)
        self._calibrl_step_params: dict[str, Any] = {}
        plan = plan_reference(model, args, needs_ref="ref_logprob_mean" in self._calibrl_inputs,
                              peft_config=kwargs.get("peft_config"))
        real_beta = args.beta
        if plan.beta_during_init is not None:
            args.beta = plan.beta_during_init
        try:
            super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        finally:
            args.beta = real_beta
        self.beta = real_beta
        if plan.own_ref is not None:
            install_reference(self, plan.own_ref)

        self._calibrl_rewards_per_func: torch.Tensor | None = None
        self._calibrl_completions: list | None = None
        self.last_rollout: dict[str, Any] | None = None
        self._decision_class_ids: torch.Tensor | None = None  # [K] token ids of the classes' spellings
        self._decision_owner: torch.Tensor | None = None  # [K] class index of each spelling
        if args.decision_classes:
            self._decision_class_ids, self._decision_owner = dec.class_tokens(self._tokenizer, args.decision_classes)
        self._correctness_index = self._resolve_correctness_reward()

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """Mirrors ``GRPOTrainer._calculate_rewards`` (TRL 1.16): TRL's, keeping what the advantage step reads."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._calibrl_rewards_per_func = rewards_per_func  # gathered over processes: [N_total, n_funcs]
        self._calibrl_completions = completions  # this process's completions
        return rewards_per_func

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """Mirrors ``GRPOTrainer._generate_single_turn`` (TRL 1.16): TRL's, recording the sampled tokens'
        log-probs when sampling is plain temperature sampling (``rollout_logprobs="auto"``)."""
        self._calibrl_gen_logps = None
        if not self._can_record_generation_logprobs():
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images=has_tool_images)
        unwrapped = self.accelerator.unwrap_model(self.model)
        with recording_generation_logprobs(unwrapped, self.temperature) as recorder:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
            )
        self._calibrl_gen_logps = recorder.finish(completion_ids, self._tokenizer.pad_token_id)
        return completion_ids, logprobs

    def _generate_and_score_completions(self, inputs):
        """Mirrors ``GRPOTrainer._generate_and_score_completions`` (TRL 1.16): TRL's output, advantages replaced."""
        output = super()._generate_and_score_completions(inputs)
        return self._calibrl_replace_advantages(output)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        """Mirrors ``GRPOTrainer._get_per_token_logps_and_entropies`` (TRL 1.16): TRL's, keeping the loss pass's
        log-probs while a telemetry capture is open."""
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._calibrl_capture is not None and not self._calibrl_capture:
            self._calibrl_capture.append(out[0].detach())  # the policy's log-probs of the loss pass
        return out

    def _compute_loss(self, model, inputs):
        """Mirrors ``GRPOTrainer._compute_loss`` (TRL 1.16): TRL's loss, plus the decision-token term; the loss pass
        also supplies deferred telemetry log-probs."""
        pending = self._calibrl_pending is not None and "calibrl_row" in inputs
        decision = self._decision_class_ids is not None and "calibrl_decision_positions" in inputs
        if not pending and not decision:
            return self._policy_loss(model, inputs)
        self._calibrl_capture = [] if pending else None
        hidden_store: list = []
        try:
            if not decision:
                loss = self._policy_loss(model, inputs)
            else:
                backbone, _ = self._backbone_and_head(model)
                with capture_hidden(backbone, hidden_store, select=self._decision_rows_selector(inputs)):
                    loss = self._policy_loss(model, inputs)
            captured = self._calibrl_capture
        finally:
            self._calibrl_capture = None
        if pending and captured:
            self._fill_pending_telemetry(inputs, captured[0])
        if decision:
            loss = loss + self._decision_loss(model, inputs, hidden_store)
        return loss

    def _policy_loss(self, model, inputs):
        """TRL's ``_compute_loss``, or for ``loss_type`` ``clip_cov`` / ``kl_cov`` verl's Clip-Cov / KL-Cov loss
        (:mod:`calibrl.losses.covariance`) on TRL's inputs: its forward, old log-probs, advantages ([N] or
        [N, T]), tool mask and vLLM importance weights; plus ``beta`` * k3 KL aggregated the same way; divided by
        the gradient-accumulation steps as TRL's ``grpo`` / ``bnpo`` losses."""
        if self.loss_type not in COV_LOSS_TYPES:
            return super()._compute_loss(model, inputs)
        args = self.args
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled, **{key: inputs.get(key) for key in _MODEL_INPUTS})
        weights = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            weights = inputs["importance_sampling_ratio"].expand_as(logps)
        common = dict(logprobs=logps, old_logprobs=inputs.get("old_per_token_logps"), advantages=inputs["advantages"],
                      completion_mask=mask, aggregation=args.cov_loss_aggregation,
                      max_completion_length=self.max_completion_length, rollout_is_weights=weights)
        if self.loss_type == "clip_cov":
            loss, metrics = clip_cov_policy_loss(eps_low=self.epsilon_low, eps_high=self.epsilon_high,
                                                 clip_cov_ratio=args.clip_cov_ratio, clip_cov_lb=args.clip_cov_lb,
                                                 clip_cov_ub=args.clip_cov_ub, **common)
        else:
            loss, metrics = kl_cov_policy_loss(kl_cov_ratio=args.kl_cov_ratio, ppo_kl_coef=args.ppo_kl_coef, **common)
        work_mask = mask.to(loss.dtype)
        if self.beta != 0.0:
            kl = kl_k3(on_mask(logps, work_mask, loss.dtype), on_mask(inputs["ref_per_token_logps"], work_mask,
                                                                       loss.dtype))
            loss = loss + self.beta * aggregate_loss(kl, work_mask, args.cov_loss_aggregation,
                                                     self.max_completion_length)
            metrics["kl"] = float(masked_mean(kl.detach(), work_mask))
        metrics["entropy"] = float(masked_mean(on_mask(entropies.detach(), work_mask, loss.dtype), work_mask))
        if self.aux_loss_enabled:  # a mixture of experts' router loss, as TRL adds it
            loss = loss + self.router_aux_loss_coef * aux_loss
        mode = "train" if self.model.training else "eval"
        for key, value in metrics.items():
            name = key if key in ("kl", "entropy", "policy_loss") else f"{self.loss_type}/{key}"
            local = torch.tensor(value, device=self.accelerator.device)
            self._metrics[mode][name].append(self.accelerator.gather(local).mean().item())
        return loss / self.current_gradient_accumulation_steps if mode == "train" else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        """Mirrors ``GRPOTrainer.training_step`` (TRL 1.16): TRL's, with its fused LM head's tile shrunk to the
        memory budget on a device without Triton (:func:`calibrl.logprobs.fused_head_tile`; on the CPU TRL's
        [4096 x 32768] tile and the temporaries of its torch fold took 4 GB; nothing changes on a GPU). There it
        also fixes glibc's malloc thresholds (:func:`calibrl.logprobs.bound_heap_cache`), so the step's freed
        temporaries go back to the system; no number changes."""
        from calibrl.logprobs import fused_head_tile

        with fused_head_tile(self.accelerator.device):
            return super().training_step(model, inputs, num_items_in_batch)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Mirrors ``GRPOTrainer.log`` (TRL 1.16), which averages each metric's non-NaN values and logs ``None`` when
        none is left: a metric undefined for the whole logging period (the AUROC of one-class batches) is left out
        instead, so TensorBoard / W&B / JSON loggers see no NaN or None."""
        mode = "train" if self.model.training else "eval"
        for key in [k for k, values in self._metrics[mode].items() if values and all(_undefined(v) for v in values)]:
            del self._metrics[mode][key]
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial):
        """Mirrors ``GRPOTrainer._save_checkpoint`` (TRL 1.16): TRL's checkpoint, plus the state of CAPO's frozen
        quantile mask in ``calibrl_capo_mask.json`` (written by the main process, as TRL writes its own json). The
        file is written first, so transformers' ``trainer_state.json`` stays the last file of a checkpoint: its
        presence marks a complete one (:mod:`calibrl.trl.checkpoints`)."""
        if self.capo_quantile_mask is not None and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            write_mask_states(folder, [(self.args.advantage_estimator, mask_settings(self._calibrl_params),
                                        self.capo_quantile_mask)])
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """Mirrors ``Trainer._load_optimizer_and_scheduler`` (transformers 5), which ``train`` calls with the resumed
        checkpoint: TRL's, plus CAPO's frozen quantile thresholds from ``calibrl_capo_mask.json`` (every process
        reads it). A checkpoint without the file (saved with another mask) leaves them to the next batch."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self.capo_quantile_mask is None:
            return
        entries = read_mask_states(checkpoint)
        if not entries:
            logger.warning("capo_mask='quantile': %s has no %s; the thresholds are estimated again from the next "
                           "training batch", checkpoint, CAPO_MASK_STATE_FILE)
            return
        # this run's estimator's entry (an earlier calibrl's file holds one bare state: its estimator is None)
        mine = [e for e in entries if e["estimator"] in (None, self.args.advantage_estimator)]
        self.capo_quantile_mask.load_state_dict((mine or entries)[0]["state"])

    def _get_train_sampler(self, dataset=None):
        """Mirrors ``GRPOTrainer._get_train_sampler`` (TRL 1.16): its ``RepeatSampler``, as one whose
        ``set_epoch`` (called by transformers before every epoch) replays the shuffle of that epoch, so resuming
        in epoch 1 or later continues with the uninterrupted run's prompts (:mod:`calibrl.trl.sampler`)."""
        return epoch_exact(super()._get_train_sampler(dataset))

    # ---------------------------------------------------------------------------------------------------- advantage step

    def _calibrl_replace_advantages(self, output: dict) -> dict:
        """TRL's generation output -> RolloutBatch -> calibrl estimator -> this process's slice of advantages."""
        trl_advantages = output["advantages"]
        rollout = collect_rollout(self._rollout_state(), output, forward=self._rollout_forward,
                                  reference=self._reference_logps)
        all_adv, info, _ = self._advantages(rollout, trl_advantages)
        advantages = all_adv[rollout.process_slice]
        if advantages.dim() == 2:  # per-token advantages (dcpo) [N, max length]: this process's completion width
            width = output["completion_ids"].size(1)
            advantages = torch.nn.functional.pad(advantages, (0, max(0, width - advantages.size(1))))[:, :width]
        decision_probs = decision_correct = None
        if self._decision_class_ids is not None:
            advantages, decision_probs, decision_correct = self._mark_decisions(output, rollout, advantages)
        output["advantages"] = advantages
        # TRL logs the advantages of the completions table from its own values; show ours instead.
        row_adv = all_adv if all_adv.dim() == 1 else all_adv.sum(-1) / rollout.batch.lengths.clamp(min=1)
        overwrite_last(self._logs["advantages"], row_adv.tolist())
        self._log_completion_columns(rollout, decision_probs)

        self.last_rollout = {
            "batch": rollout.batch, "advantages": all_adv, "info": info, "trl_advantages": trl_advantages,
            "process_slice": rollout.process_slice, "mode": rollout.mode, "metrics": {}, "correct": rollout.correct,
            "rewards": rollout.rewards, "decision_probs": decision_probs, "params": dict(self._calibrl_step_params),
        }
        if rollout.logprobs_deferred:
            output["calibrl_row"] = torch.arange(rollout.n_local, device=self.accelerator.device)
            fields = {k: v for k, v in rollout.fields.items() if k != "logprob_mean"}
            self._calibrl_pending = PendingTelemetry(
                fields=fields, advantages=all_adv, info=info, correct=rollout.correct, mode=rollout.mode,
                lpm_local=torch.full((rollout.n_local,), float("nan"), device=self.accelerator.device),
                table_batch=self._calibrl_table_batches if self.log_completions else None,
            )
        elif self.args.calibration_logging:
            self._log_telemetry(rollout.batch, all_adv, info, decision_probs, decision_correct, rollout.mode,
                                rollout.correct)
        if not self.args.calibration_logging:
            for key, value in info.items():
                if isinstance(value, (int, float)) and math.isfinite(float(value)):
                    self._metrics[rollout.mode][f"calibration/estimator/{key}"].append(float(value))
        return output

    def _advantages(self, rollout: Rollout, trl_advantages: torch.Tensor) -> tuple[torch.Tensor, dict, bool]:
        """([N] advantages of the whole batch, estimator info, whether TRL's own advantages were kept)."""
        keep_trl = self._calibrl_spec.fn is calibrl_grpo and (
            self.scale_rewards != "group" or self.multi_objective_aggregation != "sum_then_normalize"
        )
        if keep_trl:
            kept = self.accelerator.gather(trl_advantages).masked_fill(rollout.empty, 0.0)
            self._calibrl_step_params = {}
            return kept, {"trl_advantages_kept": 1.0}, True
        params = self._step_params()
        if self.capo_quantile_mask is not None:  # CAPO's frozen thresholds: set by training batches only
            params = frozen_quantile_params(params, batch=rollout.batch, state=self.capo_quantile_mask,
                                            update=rollout.mode == "train")
            if params.get("ref_high") is not None:
                self._metrics[rollout.mode]["capo/ref_ppl_high"].append(float(params["ref_high"]))
                self._metrics[rollout.mode]["capo/ref_ppl_low"].append(float(params["ref_low"]))
        self._calibrl_step_params = params
        # Estimators ignore the optional fields they do not read, so the full batch is passed.
        try:  # its output is checked at every call (a tensor of the batch's rows, finite): compute_advantages
            all_adv, info = compute_advantages(rollout.batch, self.args.advantage_estimator, return_info=True,
                                               **params)
        except Exception as exc:  # one line naming the estimator and the step; the last checkpoint stays as it is
            where = "training" if rollout.mode == "train" else "evaluation"
            raise EstimatorFailed(f"advantage estimator {self.args.advantage_estimator!r} at step "
                                  f"{self.state.global_step + 1} ({where}): "
                                  f"{exc if isinstance(exc, EstimatorOutputError) else repr(exc)}") from exc
        # rows without tokens are already 0 (compute_advantages leaves them out by their lengths)
        # per-token advantages ([N, T], e.g. dcpo) are masked row by row
        unscorable = rollout.unscorable if all_adv.dim() == 1 else rollout.unscorable[:, None]
        all_adv = all_adv.to(torch.float32).masked_fill(unscorable, 0.0)
        return all_adv, info, False

    def _mark_decisions(self, output: dict, rollout: Rollout, advantages: torch.Tensor):
        """Decision token of each local completion: position, chosen class and correctness go into ``output`` for
        the loss; its advantage is zeroed (``decision_zero_advantage``). Returns (advantages, gathered probability
        of the chosen class or None, gathered correctness or None) for the telemetry."""
        from calibrl.losses.decision import zero_decision_advantages

        positions, chosen = dec.locate_decisions(
            completion_ids=output["completion_ids"], completion_mask=rollout.mask,
            token_ids=self._decision_class_ids, owner=self._decision_owner,
        )
        correct_local = rollout.correct[rollout.process_slice]
        output["calibrl_decision_positions"] = positions
        output["calibrl_decision_chosen"] = chosen
        output["calibrl_decision_correct"] = correct_local
        if self.args.decision_zero_advantage:
            advantages = zero_decision_advantages(
                advantages=advantages, completion_mask=rollout.mask, decision_positions=positions
            )
        if rollout.decision_hidden is None:  # neither telemetry nor the completions table asks for it
            return advantages, None, None
        logits = self._head_logits(rollout.decision_hidden, self.model)  # [N, V] at the decision positions only
        p_chosen = dec.probability_of_chosen(self._decision_class_logits(logits), chosen)
        return (advantages, self.accelerator.gather(p_chosen),
                self.accelerator.gather(correct_local.float()) > 0.5)

    def _decision_rows_selector(self, inputs):
        """For :func:`~calibrl.trl.forward.capture_hidden` during the loss pass: each forward's last hidden state
        [r, P+C, D] -> the [r, D] rows predicting its completions' decision tokens (forwards come in row order), so
        only those rows are kept (with their graph) for the decision term."""
        positions, prompt_len, seen = inputs["calibrl_decision_positions"], inputs["prompt_ids"].size(1), [0]

        def select(hidden: torch.Tensor) -> torch.Tensor:
            start = seen[0]
            seen[0] += hidden.size(0)
            return dec.decision_hidden(hidden, prompt_len=prompt_len, positions=positions[start:seen[0]])

        return select

    def _decision_loss(self, model, inputs, hidden_store: list) -> torch.Tensor:
        """``decision_token_loss`` at the decision tokens of this micro-batch (read from the loss pass's hidden
        states), scaled for gradient accumulation as TRL scales its own loss; logged as ``decision/...``."""
        from calibrl.losses.decision import decision_token_loss

        h = hidden_store[0] if len(hidden_store) == 1 else torch.cat(hidden_store, dim=0)  # [N, D] decision rows
        class_logits = self._decision_class_logits(self._head_logits(h, model))  # [N, C]
        d_loss, d_metrics = decision_token_loss(
            decision_logits=class_logits, class_token_ids=torch.arange(class_logits.size(1), device=class_logits.device),
            chosen_class=inputs["calibrl_decision_chosen"], correct=inputs["calibrl_decision_correct"].bool(),
            lam=self.args.decision_loss_coef, target=self.args.decision_loss_target,
            consistency_gate=self.args.decision_consistency_gate,
        )
        mode = "train" if self.model.training else "eval"
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        self._metrics[mode]["decision/loss"].append(self.accelerator.gather(d_loss.detach()).mean().item())
        for key, value in (d_metrics or {}).items():
            value = float(value.item() if isinstance(value, torch.Tensor) else value)
            self._metrics[mode][f"decision/{key}"].append(value)
        return d_loss / normalizer

    # ---------------------------------------------------------------------------------------------------- telemetry

    def _log_telemetry(self, batch, advantages, info, decision_probs, decision_correct, mode,
                       correct) -> dict[str, float]:
        """Log :func:`calibration_metrics` of one generation batch as ``calibration/<key>`` through TRL's metrics."""
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
        """Record the loss pass's log-probs of these rows; once every row of the batch has one, log the telemetry."""
        pending = self._calibrl_pending
        lpm = masked_row_mean(per_token_logps, training_mask(inputs))
        if not pending.fill(inputs["calibrl_row"], lpm):
            return
        self._calibrl_pending = None
        batch = RolloutBatch(**pending.fields, logprob_mean=self.accelerator.gather(pending.lpm_local))
        if self.last_rollout is not None:
            self.last_rollout["batch"] = batch
        if pending.table_batch is not None and pending.table_batch == self._calibrl_table_batches:  # still last
            column = completion_columns(n=len(batch), logprob_mean=batch.logprob_mean, correct=pending.correct,
                                        lengths=batch.lengths)["logprob_mean"]
            overwrite_last(self._logs["extra"]["logprob_mean"], column)
        if self.args.calibration_logging:
            self._log_telemetry(batch, pending.advantages, pending.info, None, None, pending.mode, pending.correct)

    def _log_completion_columns(self, rollout: Rollout, decision_probs: torch.Tensor | None) -> None:
        """With ``log_completions``: add calibrl's columns (:func:`~calibrl.trl.telemetry.completion_columns`) to
        the rows TRL just logged for its completions table, in TRL's order (``logprob_mean`` left NaN until the loss
        pass supplies it when it is deferred)."""
        if not self.log_completions:
            return
        batch = rollout.batch
        columns = completion_columns(
            n=len(batch), logprob_mean=None if rollout.logprobs_deferred else batch.logprob_mean,
            correct=rollout.correct, lengths=batch.lengths, decision_probs=decision_probs,
            decision=self._decision_class_ids is not None,
        )
        for name, values in columns.items():
            self._logs["extra"][name].extend(values)
        self._calibrl_table_batches += 1  # which rows are the last: a deferred value fills them only if unchanged

    # ---------------------------------------------------------------------------------------------------- helpers

    def _rollout_state(self) -> RolloutState:
        """What :func:`~calibrl.trl.rollout.collect_rollout` reads of this generation batch (the recorded
        generation log-probs are handed over once)."""
        mode = "train" if self.model.training else "eval"
        logs_confidence = self.args.calibration_logging or self.log_completions  # telemetry / the completions table
        recorded, self._calibrl_gen_logps = self._calibrl_gen_logps, None
        decision = None if self._decision_class_ids is None else (self._decision_class_ids, self._decision_owner)
        return RolloutState(
            accelerator=self.accelerator, mode=mode,
            num_generations=self.num_generations if mode == "train" else self.num_generations_eval,
            rewards_per_func=self._calibrl_rewards_per_func, reward_weights=self.reward_weights,
            correctness_index=self._correctness_index, completions=self._calibrl_completions,
            needed=self._calibrl_inputs | ({"logprob_mean"} if logs_confidence else set()),
            estimator_reads_logprobs="logprob_mean" in self._calibrl_inputs,
            ranks_by_correctness=self._calibrl_spec.ranks_by == "correctness", logs_confidence=logs_confidence,
            generation_logps=recorded, decision_tokens=decision, decision_classes=self.args.decision_classes,
            answer_last_line=self.args.answer_last_line, tokenizer=self._tokenizer,
            confidence_reader=confidence_reader(self.args.stated_confidence_reader),
        )

    def _policy_forward(self) -> PolicyForward:
        """What calibrl's forwards (:mod:`calibrl.trl.forward`) need of this trainer, in the current mode."""
        args = self.args
        return PolicyForward(
            model=self.model, ref_model=self.ref_model, accelerator=self.accelerator, temperature=self.temperature,
            batch_size=args.per_device_train_batch_size if self.model.training else args.per_device_eval_batch_size,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
            trl_logps=self._get_per_token_logps_and_entropies,
        )

    def _step_params(self) -> dict[str, Any]:
        """Estimator parameters for this step (CDE's omega annealed by ``cde_omega_schedule``)."""
        params = dict(self._calibrl_params)
        schedule, annealed = self.args.cde_omega_schedule, self._calibrl_spec.annealed
        if annealed and schedule != "constant":
            total = max(int(self.state.max_steps or self.args.max_steps or 1), 1)
            progress = min(max(self.state.global_step / total, 0.0), 1.0)
            factor = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
            declared = (self._calibrl_spec.params or {}).get(annealed)
            params[annealed] = float(params.get(annealed, declared.default if declared else 1.0)) * factor
        return params

    def _can_record_generation_logprobs(self) -> bool:
        return can_record_generation_logprobs(self)

    def _rollout_forward(self, output, mask, *, want_embeddings: bool, want_decision: bool,
                         decision_positions: torch.Tensor | None = None, want_self_certainty: bool = False):
        """One no-grad forward of the policy (:func:`calibrl.trl.forward.rollout_forward`)."""
        return rollout_forward(self._policy_forward(), output, mask, want_embeddings=want_embeddings,
                               want_decision=want_decision, decision_positions=decision_positions,
                               want_self_certainty=want_self_certainty)

    def _reference_logps(self, output) -> torch.Tensor:
        """[B, C] the frozen reference's log-probs (:func:`calibrl.trl.forward.ref_per_token_logps`)."""
        return ref_per_token_logps(self._policy_forward(), output)

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

    def _backbone_and_head(self, model):
        """(the transformer body whose output is the last hidden state, the LM head) of the unwrapped model."""
        return backbone_and_head(self.accelerator, model)

    def _decision_class_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, V] vocabulary logits -> [N, C] class logits (:func:`calibrl.trl.decision.class_logits`)."""
        return dec.class_logits(logits, token_ids=self._decision_class_ids, owner=self._decision_owner,
                                n_classes=len(self.args.decision_classes))

    def _head_logits(self, h: torch.Tensor, model) -> torch.Tensor:
        """Logits [N, V] (at the sampling temperature) of hidden states ``h`` [N, D], post-processed as the model's
        forward does (:func:`calibrl.trl.decision.head_logits`)."""
        _, lm_head = self._backbone_and_head(model)
        postprocess = dec.logit_postprocessing(self.accelerator.unwrap_model(model).config)
        return dec.head_logits(h, lm_head=lm_head, temperature=self.temperature, postprocess=postprocess)

    def _decision_logits(self, hidden, prompt_len: int, positions: torch.Tensor, model) -> torch.Tensor:
        """Logits [N, V] (at the sampling temperature) predicting the token at completion position ``positions``,
        post-processed as the model's forward does (Granite's scaling, Gemma's soft-capping...)."""
        _, lm_head = self._backbone_and_head(model)
        postprocess = dec.logit_postprocessing(self.accelerator.unwrap_model(model).config)
        return dec.decision_logits(hidden, prompt_len=prompt_len, positions=positions, lm_head=lm_head,
                                   temperature=self.temperature, postprocess=postprocess)


def _undefined(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
