"""Evaluation metrics: accuracy over samples, confidence discrimination and calibration (binned and smooth ECE),
selective prediction (AURC, PRR), answer-agreement confidences,
and prompt-level bootstrap intervals. Definitions (binning, ties) are in docs/metrics.md.

Inputs: numpy arrays, torch tensors or lists, one entry per sampled completion; ``correct`` bool or 0/1.
Outputs: Python floats, numpy arrays, or small named tuples / dataclasses.
"""

from calibrl.metrics.abstention import (
    ABSTENTION_METHODS,
    DEFAULT_COVERAGES,
    DEFAULT_THRESHOLD_GRID,
    AbstentionThreshold,
    CalibratedAbstention,
    abstention_threshold,
    aurc,
    betting_p_value,
    calibrated_abstention,
    calibration_split,
    clopper_pearson_lower,
    fixed_sequence,
    precision_at_coverage,
    precision_coverage,
    prompt_threshold_counts,
    sequence_start,
)
from calibrl.metrics.accuracy import mean_at_k, pass_at_k, per_prompt_counts
from calibrl.metrics.bootstrap import BootstrapCI, bootstrap_ci
from calibrl.metrics.paired import DifferenceCI, hierarchical_bootstrap_difference, paired_bootstrap_difference
from calibrl.metrics.consistency import answer_consistency, semantic_entropy
from calibrl.metrics.rejection import RankingFigures, prr, prr_replicates, ranking_figures
from calibrl.metrics.smooth import (
    SmoothReliability,
    smooth_ece,
    smooth_ece_at,
    smooth_ece_replicates,
    smooth_reliability,
)
from calibrl.metrics.calibration import (
    PerPromptAUROC,
    ReliabilityBins,
    auroc,
    bin_edges,
    brier,
    ece,
    mce,
    nll,
    per_prompt_auroc,
    reliability_bins,
    roc_curve,
    top_label,
    weighted_auroc,
)

__all__ = [
    "ABSTENTION_METHODS",
    "AbstentionThreshold",
    "BootstrapCI",
    "CalibratedAbstention",
    "DEFAULT_COVERAGES",
    "DEFAULT_THRESHOLD_GRID",
    "DifferenceCI",
    "PerPromptAUROC",
    "RankingFigures",
    "ReliabilityBins",
    "abstention_threshold",
    "SmoothReliability",
    "answer_consistency",
    "aurc",
    "auroc",
    "betting_p_value",
    "bin_edges",
    "bootstrap_ci",
    "brier",
    "calibrated_abstention",
    "calibration_split",
    "clopper_pearson_lower",
    "ece",
    "fixed_sequence",
    "hierarchical_bootstrap_difference",
    "mce",
    "mean_at_k",
    "nll",
    "paired_bootstrap_difference",
    "pass_at_k",
    "per_prompt_auroc",
    "per_prompt_counts",
    "precision_at_coverage",
    "precision_coverage",
    "prr",
    "prr_replicates",
    "ranking_figures",
    "prompt_threshold_counts",
    "reliability_bins",
    "roc_curve",
    "semantic_entropy",
    "sequence_start",
    "smooth_ece",
    "smooth_ece_at",
    "smooth_ece_replicates",
    "smooth_reliability",
    "top_label",
    "weighted_auroc",
]
