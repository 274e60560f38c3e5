"""What the demo compares: its methods (one CalibratedGRPOConfig setting each) and the budget they share.

Two comparisons on the testbed (:mod:`calibrl.testbed.tasks`), every run going through
:class:`calibrl.trl.CalibratedGRPOTrainer` with the same budget (steps x 16 prompts x 8 samples, T = 1, AdamW
lr 1e-4, beta 0):

* sequence confidence (``stochastic_reasoning``): GRPO vs CAPO (arXiv 2604.12632) vs CAPO + reference-perplexity
  mask, with GCPO (arXiv 2605.21801, our reading) and SEED-GRPO (arXiv 2505.12346) beside them. Measure: AUROC of
  the mean token log-prob against correctness (pooled and per prompt), ECE of the sequence probability, accuracy.
* decisions (``decision``): the SFT warm start vs GRPO vs decision-token calibration (arXiv 2601.13284: GRPO with
  the decision token's advantage zeroed plus lambda x CE towards one-hot-if-right / uniform-if-wrong), with GCPO
  and SEED-GRPO beside them. Measure: ECE of the decision-token probability (equal-count bins, as the paper),
  the noise-free calibration error mean |q(Y|x) - p(x)|, AUROC of the sequence confidence, accuracy.

Beside them, not in the default demo: stated confidence (``verbalized``): the warm start (which states an
uninformed confidence digit) vs RLCR (arXiv 2507.16806: GRPO on correctness plus the Brier score of the stated
confidence, the task's reward); measure: ECE of the stated confidence (:func:`stated_confidence_metrics`).

The metrics are computed by :mod:`calibrl.testbed.evaluate`; the runs are made by :mod:`calibrl.testbed.runner`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEQ_TASK = "stochastic_reasoning"
DEC_TASK = "decision"
ADD_TASK = "addition"
RLCR_TASK = "verbalized"


@dataclass(frozen=True)
class MethodSpec:
    """One method of the demo: its task, the CalibratedGRPOConfig fields it sets, and whether it trains."""

    name: str
    task: str
    label: str
    config: dict = field(default_factory=dict)
    train: bool = True


def method_specs(*, capo_tau: float = 0.6, decision_coef: float = 1.0, seed_alpha: float | None = None
                 ) -> dict[str, MethodSpec]:
    """The demo's methods, keyed ``<task>/<method>``."""
    # The study in docs/results ran SEED-GRPO in its std-normalised form with alpha 1 (the library's default then);
    # pinned here so `studies/testbed.py` still reproduces those rows. The library default is now the paper's form
    # (Dr.GRPO base, alpha 0.042): calibrl.advantages.gcpo.seed_grpo.
    # Testbed completions end with the bare answer (no \boxed{}): the last line is the answer SEED clusters.
    seed_params = {"advantage_params": {"base": "grpo", "alpha": 1.0 if seed_alpha is None else seed_alpha},
                   "answer_last_line": True}
    specs = [
        MethodSpec("grpo", SEQ_TASK, "GRPO", {"advantage_estimator": "grpo"}),
        MethodSpec("capo", SEQ_TASK, f"CAPO (tau {capo_tau})", {"advantage_estimator": "capo", "capo_tau": capo_tau}),
        MethodSpec("capo_mask", SEQ_TASK, f"CAPO + mask (tau {capo_tau})",
                   {"advantage_estimator": "capo", "capo_tau": capo_tau, "capo_mask": "batch_quantile"}),
        MethodSpec("gcpo", SEQ_TASK, "GCPO", {"advantage_estimator": "gcpo"}),
        # tau 0.2: a second CAPO setting chosen after seeing tau 0.6 on this task (not in the default demo)
        MethodSpec("capo_tau0.2", SEQ_TASK, "CAPO (tau 0.2)", {"advantage_estimator": "capo", "capo_tau": 0.2}),
        MethodSpec("capo_mask_tau0.2", SEQ_TASK, "CAPO + mask (tau 0.2)",
                   {"advantage_estimator": "capo", "capo_tau": 0.2, "capo_mask": "batch_quantile"}),
        MethodSpec("seed_grpo", SEQ_TASK, "SEED-GRPO", {"advantage_estimator": "seed_grpo", **seed_params}),
        # the mask ablation (not in the default demo; studies/testbed.py --methods, docs/results/mask.md): the mask
        # in the paper's frozen reading (quartiles of the first batch), alone on GRPO and with CAPO
        MethodSpec("grpo_mask", SEQ_TASK, "GRPO + frozen mask",
                   {"advantage_estimator": "grpo_mask", "capo_mask": "quantile"}),
        MethodSpec("capo_frozen_mask", SEQ_TASK, f"CAPO + frozen mask (tau {capo_tau})",
                   {"advantage_estimator": "capo", "capo_tau": capo_tau, "capo_mask": "quantile"}),
        MethodSpec("sft", DEC_TASK, "SFT (warm start)", {}, train=False),
        MethodSpec("grpo", DEC_TASK, "GRPO", {"advantage_estimator": "grpo"}),
        MethodSpec("decision", DEC_TASK, f"GRPO + decision CE (lambda {decision_coef:g})",
                   {"advantage_estimator": "grpo", "decision_classes": ["Y", "N"],
                    "decision_loss_coef": decision_coef, "decision_zero_advantage": True}),
        MethodSpec("gcpo", DEC_TASK, "GCPO", {"advantage_estimator": "gcpo"}),
        MethodSpec("seed_grpo", DEC_TASK, "SEED-GRPO", {"advantage_estimator": "seed_grpo", **seed_params}),
        # deterministic control (not in the default demo): RL should help calibration here
        MethodSpec("grpo", ADD_TASK, "GRPO", {"advantage_estimator": "grpo"}),
        MethodSpec("capo", ADD_TASK, f"CAPO (tau {capo_tau})", {"advantage_estimator": "capo", "capo_tau": capo_tau}),
        # stated confidence (not in the default demo): the task's reward is RLCR's, so plain GRPO on it is RLCR
        MethodSpec("sft", RLCR_TASK, "SFT (warm start, uninformed confidence)", {}, train=False),
        MethodSpec("rlcr", RLCR_TASK, "RLCR (GRPO on correctness + Brier)", {"advantage_estimator": "grpo"}),
        # the pre-registered study's arms (docs/testbed.md; studies.protocol_analysis), in the papers' regime
        *PROTOCOL_ARMS,
        # the decision-token study (studies/decision_study.py): the decision copies the reasoning's conclusion
        *DECISION_STUDY_ARMS,
        # the group-weighting study (studies/forms_study.py): where GCPO and SEED-GRPO can differ
        *FORMS_ARMS,
    ]
    return {f"{s.task}/{s.name}": s for s in specs}


PROTOCOL_TASK = "scratchpad"
PROTOCOL_ARMS = (
    MethodSpec("grpo", PROTOCOL_TASK, "GRPO (lr 1e-4)", {"advantage_estimator": "grpo"}),
    MethodSpec("grpo_lr3e-5", PROTOCOL_TASK, "GRPO (lr 3e-5, the slower-GRPO control)",
               {"advantage_estimator": "grpo", "learning_rate": 3e-5}),
    MethodSpec("grpo_kl", PROTOCOL_TASK, "GRPO + KL (beta 0.04)", {"advantage_estimator": "grpo", "beta": 0.04}),
    # CAPO's ablation "the mask alone on GRPO does not improve AUC": GRPO's advantage times the frozen mask
    MethodSpec("grpo_mask", PROTOCOL_TASK, "GRPO + frozen mask (lr 1e-4)",
               {"advantage_estimator": "grpo_mask", "capo_mask": "quantile"}),
    MethodSpec("capo_tau0.2", PROTOCOL_TASK, "CAPO (tau 0.2)", {"advantage_estimator": "capo", "capo_tau": 0.2}),
    MethodSpec("capo_tau0.6", PROTOCOL_TASK, "CAPO (tau 0.6)", {"advantage_estimator": "capo", "capo_tau": 0.6}),
    MethodSpec("capo_mask_tau0.2", PROTOCOL_TASK, "CAPO + frozen mask (tau 0.2)",
               {"advantage_estimator": "capo", "capo_tau": 0.2, "capo_mask": "quantile"}),
    MethodSpec("capo_mask_tau0.6", PROTOCOL_TASK, "CAPO + frozen mask (tau 0.6)",
               {"advantage_estimator": "capo", "capo_tau": 0.6, "capo_mask": "quantile"}),
)

DECISION_COPY_TASK = "decision_copy"
DECISION_LAMBDAS = (1e-3, 1e-2, 0.1, 1.0)
# decision-token variants: (name, label, CalibratedGRPOConfig fields); "paper_gate" is our reading of the paper
DECISION_VARIANTS = (
    ("paper_gate", "paper target + gate",
     {"decision_loss_target": "onehot_uniform", "decision_consistency_gate": True}),
    ("paper_nogate", "paper target, no gate",
     {"decision_loss_target": "onehot_uniform", "decision_consistency_gate": False}),
    ("binary", "binary target", {"decision_loss_target": "binary", "decision_consistency_gate": False}),
)
DECISION_STUDY_ARMS = (
    MethodSpec("sft", DECISION_COPY_TASK, "SFT (warm start)", {}, train=False),
    MethodSpec("grpo", DECISION_COPY_TASK, "GRPO", {"advantage_estimator": "grpo"}),
    *(MethodSpec(f"ce_{variant}_lam{lam:g}", DECISION_COPY_TASK, f"GRPO + decision CE ({label}, lambda {lam:g})",
                 {"advantage_estimator": "grpo", "decision_classes": ["Y", "N"], "decision_loss_coef": lam,
                  "decision_zero_advantage": True, **fields})
      for variant, label, fields in DECISION_VARIANTS for lam in DECISION_LAMBDAS),
)

FORMS_TASK = "forms"
# Group weightings on testbed/forms (surface forms, near misses, far-wrong values, noise prompts). Dr.GRPO is
# GRPO's advantage times the group's reward std (Bessel, up to GRPO's eps): GRPO weighted by reward dispersion,
# the signal that tracked a group's gradient SNR in docs/results/gcpo.md.
FORMS_ARMS = (
    MethodSpec("grpo", FORMS_TASK, "GRPO", {"advantage_estimator": "grpo"}),
    MethodSpec("dr_grpo", FORMS_TASK, "Dr.GRPO (GRPO x reward std)", {"advantage_estimator": "dr_grpo"}),
    MethodSpec("gcpo", FORMS_TASK, "GCPO (default reading)", {"advantage_estimator": "gcpo"}),
    MethodSpec("gcpo_std", FORMS_TASK, "GCPO (batch-centred, standardised)",
               {"advantage_estimator": "gcpo", "advantage_params": {"center": "batch", "standardize": True}}),
    MethodSpec("seed_grpo", FORMS_TASK, "SEED-GRPO (GRPO base, alpha 1)",
               {"advantage_estimator": "seed_grpo", "advantage_params": {"base": "grpo", "alpha": 1.0},
                "answer_last_line": True}),
    MethodSpec("seed_grpo_paper", FORMS_TASK, "SEED-GRPO (paper: Dr.GRPO base, alpha 0.042)",
               {"advantage_estimator": "seed_grpo", "answer_last_line": True}),
)

DEFAULT_METHODS = ("stochastic_reasoning/grpo", "stochastic_reasoning/capo", "stochastic_reasoning/capo_mask",
                   "stochastic_reasoning/gcpo", "stochastic_reasoning/seed_grpo", "decision/sft", "decision/grpo",
                   "decision/decision", "decision/gcpo", "decision/seed_grpo")
CONTROL_METHODS = ("addition/grpo", "addition/capo")
RLCR_METHODS = ("verbalized/sft", "verbalized/rlcr")
QUICK_METHODS = ("stochastic_reasoning/grpo", "stochastic_reasoning/capo", "decision/sft", "decision/grpo",
                 "decision/decision")


@dataclass
class DemoConfig:
    """Budget and hyperparameters shared by every method (same for all: the comparison is fair by construction)."""

    steps: int = 200
    eval_every: int = 25
    eval_prompts: int = 128
    eval_samples: int = 8
    prompts_per_step: int = 16
    num_generations: int = 8
    learning_rate: float = 1e-4
    capo_tau: float = 0.6
    decision_coef: float = 1.0
    seeds: tuple[int, ...] = (0,)
    workers: int = 2
    methods: tuple[str, ...] = DEFAULT_METHODS  # keys of method_specs()
    warmstart_steps: int = 1500
    warmstart_target: float | None = None  # None: per-task default
    quick: bool = False

    @classmethod
    def quick_config(cls, **overrides) -> "DemoConfig":
        base = dict(steps=10, eval_every=5, eval_prompts=48, eval_samples=8, methods=QUICK_METHODS,
                    warmstart_steps=400, warmstart_target=0.9, quick=True)
        base.update(overrides)
        return cls(**base)


def stated_confidence_metrics(*, stated, correct, p_true) -> dict[str, float]:
    """Calibration of stated confidences (the ``verbalized`` task; RLCR, arXiv 2507.16806).

    ``stated``: [M] stated confidence per sampled completion, NaN where none was stated; ``correct``: [M] drawn
    outcomes (bool); ``p_true``: [M] the exact probability that each completion is right. Returns
    ``stated_fraction`` (share with a confidence), and over those: ``stated_ece`` (ECE, 10 equal-width bins: the
    confidences are deciles), ``stated_calib_err`` = mean |stated - p_true| (noise-free: 0 only for a calibrated
    statement of every completion), ``stated_auroc`` (stated confidence vs drawn correctness), ``stated_mean``,
    and ``brier`` = mean (stated - correct)^2. NaN where no completion states a confidence.
    """
    import numpy as np

    from calibrl import metrics as M

    stated = np.asarray(stated, dtype=np.float64).reshape(-1)
    correct = np.asarray(correct, dtype=bool).reshape(-1)
    p_true = np.asarray(p_true, dtype=np.float64).reshape(-1)
    if not (stated.shape == correct.shape == p_true.shape):
        raise ValueError(f"stated ({stated.size}), correct ({correct.size}) and p_true ({p_true.size}) need one "
                         "entry per completion")
    has = ~np.isnan(stated)
    out = {"stated_fraction": float(has.mean()) if has.size else float("nan")}
    if not has.any():
        return {**out, **dict.fromkeys(("stated_ece", "stated_calib_err", "stated_auroc", "stated_mean", "brier"),
                                        float("nan"))}
    s, c, p = stated[has], correct[has], p_true[has]
    one_class = c.all() or not c.any()
    return {
        **out,
        "stated_ece": float(M.ece(s, c, n_bins=10, strategy="uniform")),
        "stated_calib_err": float(np.abs(s - p).mean()),
        "stated_auroc": float("nan") if one_class else float(M.auroc(s, c)),
        "stated_mean": float(s.mean()),
        "brier": float(((s - c) ** 2).mean()),
    }


__all__ = ["ADD_TASK", "CONTROL_METHODS", "DECISION_COPY_TASK", "DECISION_LAMBDAS", "DECISION_STUDY_ARMS",
           "DECISION_VARIANTS", "DEC_TASK", "DEFAULT_METHODS", "DemoConfig", "FORMS_ARMS", "FORMS_TASK", "MethodSpec",
           "PROTOCOL_ARMS", "PROTOCOL_TASK", "QUICK_METHODS", "RLCR_METHODS", "RLCR_TASK", "SEQ_TASK", "method_specs",
           "stated_confidence_metrics"]
