"""``CalibratedGRPOConfig``: TRL's ``GRPOConfig`` plus the fields calibrl reads, each tied to its paper."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

__all__ = ["COV_LOSS_TYPES", "CalibratedGRPOConfig", "estimator_fields_read", "ignored_field_error"]

COV_LOSS_TYPES = ("clip_cov", "kl_cov")  # loss_type values calibrl's trainer computes (calibrl.losses.covariance)
ANNEAL_FIELD = "cde_omega_schedule"  # read by the trainer for an estimator registered with annealed=<parameter>
_OFF = {"capo_mask": "none"}  # a value that asks for nothing: not an error where the field is not read


def _spec(estimator: str):
    """The estimator's registered spec, or None for a name not registered (yet): it reads no calibrl field."""
    from calibrl.advantages import estimator_spec

    try:
        return estimator_spec(estimator)
    except KeyError:
        return None


def _fields_set(estimator: str, capo_mask: str) -> dict[str, str | None]:
    """The calibrl fields ``estimator`` reads when ``capo_mask`` is set as given, each with the estimator parameter
    it sets (None for the trainer's own :data:`ANNEAL_FIELD`): the ``fields`` of its registration, a noise-mask
    parameter only with the mask value that reads it (:data:`calibrl.advantages.capo.MASK_ONLY_PARAMS`)."""
    from calibrl.advantages.capo import MASK_ONLY_PARAMS

    spec = _spec(estimator)
    if spec is None:
        return {}
    only = {param: mask for mask, params in MASK_ONLY_PARAMS.items() for param in params}
    read: dict[str, str | None] = {field: param for field, param in spec.config_fields().items()
                                   if param not in only or (spec.noise_mask != "no" and only[param] == capo_mask)}
    if spec.annealed:
        read[ANNEAL_FIELD] = None
    return read


def estimator_fields_read(estimator: str, capo_mask: str) -> tuple[str, ...]:
    """The calibrl fields ``estimator`` reads when ``capo_mask`` is set as given, read from its registration
    (:func:`calibrl.register_estimator`'s ``fields``, ``noise_mask`` and ``annealed``)."""
    return tuple(_fields_set(estimator, capo_mask))


def ignored_field_error(settings: dict[str, Any], *, estimator: str, capo_mask: str) -> str | None:
    """The first field of ``settings`` (field -> value as set) that some registered estimator reads but ``estimator``
    with ``capo_mask`` does not, as ``"field: why"``; None when each is read (or set to its off value, ``capo_mask:
    none``) or is no estimator's field."""
    from calibrl.advantages import estimator_specs
    from calibrl.advantages.capo import MASK_ONLY_PARAMS

    read = estimator_fields_read(estimator, capo_mask)
    readers = {spec.name: {m: estimator_fields_read(spec.name, m) for m in MASK_ONLY_PARAMS}
               for spec in estimator_specs()}
    for key, value in settings.items():
        if key in read or _OFF.get(key, object()) == value:
            continue
        names = [name for name, by_mask in readers.items() if any(key in fields for fields in by_mask.values())]
        if not names:
            continue
        masks = [mask for mask, fields in readers.get(estimator, {}).items() if key in fields]
        if masks and "capo_mask" in read:
            return f"{key}: ignored with capo_mask {capo_mask!r} (read with capo_mask {' or '.join(map(repr, masks))})"
        return (f"{key}: ignored by advantage_estimator {estimator!r} (read by {', '.join(names)}); remove it or "
                "choose one of those estimators")
    return None


def _is_number(value: Any) -> bool:
    """True for an int or a float, False for a bool or anything else (a quoted "0.6" is not a number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class CalibratedGRPOConfig(GRPOConfig):
    r"""Configuration for :class:`CalibratedGRPOTrainer`: every :class:`trl.GRPOConfig` field, plus:

    > Advantage estimator

    advantage_estimator (`str`, defaults to `"capo"`): any name in ``calibrl.available_estimators()``.
    advantage_params (`dict`, *optional*): extra keyword parameters for the estimator (override the ``capo_*`` /
        ``gcpo_*`` fields below).
    capo_tau, capo_normalize, capo_mask, capo_ref_high, capo_ref_low, capo_ref_high_quantile,
        capo_ref_low_quantile, capo_ref_quantile_batches: CAPO (arXiv 2604.12632) parameters. ``capo_mask=
        "quantile"`` freezes the reference-perplexity quartiles of the first batch(es) (saved in checkpoints);
        ``"batch_quantile"`` recomputes them on every batch. The ``capo_mask`` / ``capo_ref_*`` fields are also
        the mask of ``advantage_estimator="grpo_mask"`` (GRPO + CAPO's mask, the paper's ablation), which needs a
        ``capo_mask`` other than ``"none"``.
    gcpo_measure: GCPO (arXiv 2605.21801) disagreement measure.
    stated_confidence_reader (`str`, defaults to `"tag"`): how the confidence a completion states is read, for the
        estimators that read it (``dcpo``: the value and the character where DCPO splits the tokens): ``"tag"``
        (the last ``<confidence>x</confidence>``) or ``"package.module:function"``, a function of the completion's
        text returning (confidence in [0, 1] or None, character offset where the statement starts or None), e.g.
        ``"calibrl.testbed.tasks:verbalized_confidence_span"`` for the testbed's ``ss;A:k`` (checked when the
        config is built: :func:`calibrl.tasks.verbalized.confidence_reader`).

    > Decision-token calibration (arXiv 2601.13284)

    correctness_reward (`str`, *optional*): the reward function whose own (unweighted) value > 0.5 defines a
        correct completion (CAPO's pairs and mask, telemetry, the decision term); default: the first one.
    decision_classes (`list[str]`, *optional*): class strings; enables the decision-token term.
    decision_loss_coef (`float`, defaults to `1e-3`): lambda.
    decision_loss_target (`str`, defaults to `"onehot_uniform"`): the paper's target, or `"binary"` (stationary at
        a calibrated decision probability for any number of classes; docs/losses.md).
    decision_consistency_gate (`bool`, *optional*): the consistency gate on or off; None = the target's default.
    decision_zero_advantage (`bool`, defaults to `True`): zero the policy-gradient advantage at the decision token.

    > Clip-Cov / KL-Cov (arXiv 2505.22617; ``loss_type="clip_cov"`` or ``"kl_cov"``, verl 0.9.1's losses)

    clip_cov_ratio, clip_cov_lb, clip_cov_ub (defaults 2e-4, 1, 5): share of a micro-batch's tokens Clip-Cov
        detaches, drawn among the tokens whose covariance lies in (lb, ub); the clip range is TRL's ``epsilon`` /
        ``epsilon_high``.
    kl_cov_ratio, ppo_kl_coef (defaults 2e-4, 0.1): share of the tokens KL-Cov penalises, and the penalty's weight.
    cov_loss_aggregation (`str`, defaults to `"token-mean"`): their aggregation (verl's ``loss_agg_mode`` names),
        per micro-batch.

    > Telemetry

    calibration_logging (`bool`, defaults to `True`): log ``calibration/...`` metrics every generation batch.
    """

    advantage_estimator: str = field(
        default="capo",
        metadata={
            "help": "Advantage estimator: any name in `calibrl.available_estimators()`, e.g. `capo` (CAPO, "
            "arXiv 2604.12632), `grpo_mask` (GRPO + CAPO's noise mask `capo_mask`, the paper's ablation), `gcpo` "
            "(arXiv 2605.21801), `seed_grpo` (arXiv 2505.12346), `codapo`, `cde` (arXiv 2509.09675), `grpo`, "
            "`dr_grpo`, `rloo`, `dcpo` (arXiv 2603.09117), `intuitor` (arXiv 2505.19590)."
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
        metadata={"help": "CAPO reference-perplexity noise mask: `none`, `fixed` (capo_ref_high / capo_ref_low), "
                  "`quantile` (the reference-perplexity quantiles of the first capo_ref_quantile_batches training "
                  "batches, then frozen: the paper's fixed thresholds, estimated for this model; logged as "
                  "capo/ref_ppl_high and capo/ref_ppl_low and saved in every checkpoint as calibrl_capo_mask.json) "
                  "or `batch_quantile` (recomputed on every batch). Needs the frozen reference model, which is "
                  "loaded even when beta == 0 (CAPO, arXiv 2604.12632). Also the mask of "
                  "advantage_estimator=`grpo_mask` (GRPO + this mask), where it must not be `none`."},
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
        metadata={"help": "CAPO masks `quantile` / `batch_quantile`: quantile of reference perplexity used as "
                  "ref_high (CAPO, arXiv 2604.12632)."},
    )
    capo_ref_low_quantile: float = field(
        default=0.25,
        metadata={"help": "CAPO masks `quantile` / `batch_quantile`: quantile of reference perplexity used as "
                  "ref_low (CAPO, arXiv 2604.12632)."},
    )
    capo_ref_quantile_batches: int = field(
        default=1,
        metadata={"help": "CAPO mask `quantile`: number of first training batches whose reference perplexities are "
                  "pooled before the quantile thresholds freeze (1: the first batch alone; our reading of the "
                  "paper's fixed quartile thresholds)."},
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
    stated_confidence_reader: str = field(
        default="tag",
        metadata={"help": "How a completion's stated confidence is read (dcpo): `tag` (the last "
                  "<confidence>x</confidence>) or `package.module:function`, a function text -> (confidence or "
                  "None, character offset where the statement starts or None)."},
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
    decision_loss_target: str = field(
        default="onehot_uniform",
        metadata={"help": "Target of the decision-token term: `onehot_uniform` (arXiv 2601.13284: one-hot when "
                  "correct, uniform over the classes when wrong, wrong rows gated off while q(chosen) <= 1/|C|; "
                  "calibrated at its stationary point only for two classes sampled on-policy without the gate) or "
                  "`binary` (binary cross-entropy of q(chosen) against correctness, no gate: stationary at "
                  "q(chosen) = P(correct | chosen) for any number of classes and when the decision copies the "
                  "reasoning; docs/losses.md, 'Stationary points of the decision-token term')."},
    )
    decision_consistency_gate: bool | None = field(
        default=None,
        metadata={"help": "Switch a wrong rollout's decision term off while q(chosen) <= 1/|C| (our reading of the "
                  "paper's 'decision probability kept within [1/|C|, 1]'). None: the target's default, on for "
                  "`onehot_uniform`, off for `binary`."},
    )
    decision_zero_advantage: bool = field(
        default=True,
        metadata={"help": "Zero the policy-gradient advantage at the decision token, so only the calibration "
                  "term shapes it (arXiv 2601.13284)."},
    )
    answer_last_line: bool = field(
        default=False,
        metadata={"help": "SEED-GRPO answer clustering (arXiv 2505.12346): a completion with no \\boxed{} answer (or "
                  "decision class) is a cluster of its own (False, the paper's rule), or its stripped last line is "
                  "taken as its answer (True: for tasks whose completion ends with the bare answer)."},
    )
    rollout_logprobs: str = field(
        default="auto",
        metadata={"help": "Where the rollout policy's token log-probs come from when TRL has none: `auto` records "
                  "them during transformers generation (log_softmax(logits / temperature) of each sampled token, no "
                  "extra forward) when sampling is plain temperature sampling (top_k 0, top_p 1, no min_p, no "
                  "repetition penalty, no generation_kwargs, no tools), else runs one extra no-grad forward; "
                  "`forward` always runs the forward."},
    )
    clip_cov_ratio: float = field(
        default=2e-4,
        metadata={"help": "loss_type='clip_cov' (arXiv 2505.22617): share of a micro-batch's tokens whose loss is "
                  "detached, drawn at random among those with covariance in (clip_cov_lb, clip_cov_ub)."},
    )
    clip_cov_lb: float = field(default=1.0, metadata={"help": "loss_type='clip_cov': lower covariance bound."})
    clip_cov_ub: float = field(default=5.0, metadata={"help": "loss_type='clip_cov': upper covariance bound."})
    kl_cov_ratio: float = field(
        default=2e-4,
        metadata={"help": "loss_type='kl_cov' (arXiv 2505.22617): share of a micro-batch's tokens, those of largest "
                  "covariance, that get the penalty ppo_kl_coef * |logp - old_logp|."},
    )
    ppo_kl_coef: float = field(default=0.1, metadata={"help": "loss_type='kl_cov': weight of the penalty."})
    cov_loss_aggregation: str = field(
        default="token-mean",
        metadata={"help": "loss_type='clip_cov' / 'kl_cov': aggregation of the per-token loss over a micro-batch: "
                  "token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm (verl's "
                  "loss_agg_mode)."},
    )
    calibration_logging: bool = field(
        default=True,
        metadata={"help": "Log calibration telemetry (AUROC of mean token log-prob vs correctness, pooled and per "
                  "prompt; confidence of right vs wrong; masked fraction; advantage statistics; decision ECE) as "
                  "`calibration/...` metrics (CAPO, arXiv 2604.12632; arXiv 2601.13284)."},
    )

    def __post_init__(self):
        if getattr(self, "activation_checkpointing", False) is None and self.gradient_checkpointing is not None:
            # TRL's default gradient_checkpointing=True under transformers 5's new name, so building a config does
            # not print transformers' deprecation warning for a field the user never set (same resolved value)
            self.activation_checkpointing = self.gradient_checkpointing
        super().__post_init__()
        if isinstance(self.decision_classes, str):
            self.decision_classes = [c for c in self.decision_classes.split(",") if c]
        from calibrl.advantages.capo import check_capo_params

        # CAPO's fields, checked by the one check the estimators run on every batch (named here by their fields)
        check_capo_params({p: getattr(self, f"capo_{p}") for p in ("tau", "normalize", "mask", "ref_high", "ref_low",
                                                                   "ref_high_quantile", "ref_low_quantile",
                                                                   "ref_quantile_batches")},
                          config_field=lambda p: f"capo_{p}")
        if self.cde_omega_schedule not in ("constant", "linear", "cosine"):
            raise ValueError(f"cde_omega_schedule must be constant, linear or cosine, got {self.cde_omega_schedule!r}")
        if self.rollout_logprobs not in ("auto", "forward"):
            raise ValueError(f"rollout_logprobs must be 'auto' or 'forward', got {self.rollout_logprobs!r}")
        if self.advantage_params is not None and not isinstance(self.advantage_params, dict):
            raise ValueError(f"advantage_params must be a dict, got {type(self.advantage_params).__name__}")
        self._check_ranges()
        from calibrl.tasks.verbalized import confidence_reader

        confidence_reader(self.stated_confidence_reader)  # a reader that cannot be found fails here, not mid-run
        spec = _spec(self.advantage_estimator)
        if spec is not None and spec.noise_mask == "required" and self.estimator_params().get("mask") in (None, "none"):
            raise ValueError(f"advantage_estimator={self.advantage_estimator!r} takes CAPO's reference-perplexity "
                             "noise mask: set capo_mask to 'quantile' (frozen quartiles of the first batch), 'fixed' "
                             "or 'batch_quantile' (or use advantage_estimator='grpo' for GRPO without the mask)")

    def _check_ranges(self) -> None:
        """Reject out-of-range values of calibrl's fields (and the sampling temperature the log-probs divide by)
        here, so a bad recipe fails before a model is loaded; every message names the field. The estimator name is
        checked when the trainer is built (an estimator may be registered after the config)."""
        if self.gcpo_measure not in ("cosine", "barycentric"):
            raise ValueError(f"gcpo_measure must be 'cosine' or 'barycentric', got {self.gcpo_measure!r}")
        positive = ("temperature",)
        for name in positive:
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        for name in ("learning_rate", "beta"):  # TRL's fields: a negative or NaN value otherwise fails (or
            value = getattr(self, name)         # trains backwards) only once the model is loaded
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        length = self.max_completion_length
        if length is not None and (not _is_number(length) or length < 1):
            raise ValueError(f"max_completion_length must be a positive integer, got {length!r}")
        if not _is_number(self.max_steps) or self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps must be a positive integer (or -1: train num_train_epochs), got "
                             f"{self.max_steps!r}")
        coef = self.decision_loss_coef
        if not _is_number(coef) or not math.isfinite(coef) or coef < 0:
            raise ValueError(f"decision_loss_coef must be a finite number >= 0, got {coef!r}")
        from calibrl.losses.decision import DECISION_TARGETS

        if self.decision_loss_target not in DECISION_TARGETS:
            raise ValueError(f"decision_loss_target must be one of {', '.join(DECISION_TARGETS)}, got "
                             f"{self.decision_loss_target!r}")
        classes = self.decision_classes
        if classes is not None and (not isinstance(classes, list) or not classes
                                    or not all(isinstance(c, str) and c for c in classes)):
            raise ValueError(f"decision_classes must be a non-empty list of non-empty strings, got {classes!r}")
        self._check_cov_loss()
        if self.correctness_reward is not None and not isinstance(self.correctness_reward, str):
            raise ValueError(f"correctness_reward must be a reward name, got {self.correctness_reward!r}")

    def _check_cov_loss(self) -> None:
        """With ``loss_type`` clip_cov / kl_cov: their fields in range, and none of the TRL options their loss does
        not apply (each would otherwise be silently ignored)."""
        from calibrl.losses.ppo import AGGREGATIONS

        if self.loss_type not in COV_LOSS_TYPES:
            return
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 < value <= 1:
                raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
        for name in ("clip_cov_lb", "clip_cov_ub", "ppo_kl_coef"):
            if not _is_number(getattr(self, name)) or not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if self.cov_loss_aggregation not in AGGREGATIONS:
            raise ValueError(f"cov_loss_aggregation must be one of {', '.join(AGGREGATIONS)}, got "
                             f"{self.cov_loss_aggregation!r}")
        unsupported = {"importance_sampling_level": self.importance_sampling_level != "token",
                       "top_entropy_quantile": self.top_entropy_quantile < 1.0,
                       "off_policy_mask_threshold": self.off_policy_mask_threshold is not None,
                       "delta": self.delta is not None,
                       "entropy_coef": self.entropy_coef != 0.0 or self.use_adaptive_entropy}
        for name, is_set in unsupported.items():
            if is_set:
                raise ValueError(f"{name}={getattr(self, name)!r} is not applied by loss_type={self.loss_type!r} "
                                 "(verl's Clip-Cov / KL-Cov loss); leave it at its default")

    # ------------------------------------------------------------------ helpers read by the trainer
    def estimator_params(self) -> dict[str, Any]:
        """Keyword parameters passed to the estimator: the ``capo_*``/``gcpo_*`` fields it reads
        (:func:`estimator_fields_read`, by the parameter names its registration gives them) + advantage_params.

        capo and grpo_mask (the mask fields; capo also ``tau``, ``normalize``): ``ref_high`` / ``ref_low`` only with
        ``capo_mask="fixed"`` (with ``"quantile"`` the trainer fills in the frozen thresholds at each step;
        ``ref_high`` and ``ref_low`` in advantage_params freeze them from the start), ``ref_quantile_batches`` only
        with ``"quantile"``."""
        params = {param: getattr(self, field)
                  for field, param in _fields_set(self.advantage_estimator, self.capo_mask).items() if param}
        params.update(self.advantage_params or {})
        return params
