"""Discrimination and calibration of a confidence score against correctness.

Discrimination (any real-valued score, e.g. mean token log-probability):
    auroc, weighted_auroc (a weight per sample, or a batch of weight vectors), roc_curve, per_prompt_auroc
Calibration (confidence must be a probability in [0, 1]):
    ece, mce, reliability_bins, brier, nll
Multi-class helper:
    top_label -- (confidence, correct) of the arg-max class, for top-label ECE

Binning (``ece``, ``mce``, ``reliability_bins``) follows ``sklearn.calibration.calibration_curve`` exactly:
edges ``e_0 < e_1 < ... < e_B`` (uniform: ``linspace(0, 1, B+1)``; quantile: ``np.percentile(confidence,
linspace(0, 100, B+1))``, numpy's default linear interpolation) and a sample with confidence p falls in bin
``b = searchsorted(e[1:-1], p, side="left")``, i.e. bins are right-closed ``(e_{b-1}, e_b]`` except the first,
``[e_0, e_1]``. This is also the convention of Guo et al. (2017)'s reference ECE code. See docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from calibrl.metrics._arrays import (
    as_correct,
    as_prob,
    as_scores,
    check_same_length,
    group_index,
    stable_argsort_small_ints,
    to_numpy,
)

__all__ = [
    "PerPromptAUROC",
    "ReliabilityBins",
    "auroc",
    "auroc_standard_error",
    "brier",
    "bin_edges",
    "ece",
    "mce",
    "nll",
    "per_prompt_auroc",
    "reliability_bins",
    "roc_curve",
    "top_label",
    "weighted_auroc",
]

Strategy = Literal["uniform", "quantile"]


# ---------------------------------------------------------------------------------------------------- AUROC
def _pooled_auroc(score: np.ndarray, y: np.ndarray) -> float:
    """Mann-Whitney AUROC: ``(#{pos > neg} + 0.5 #{pos == neg}) / (n_pos n_neg)`` over all (pos, neg) pairs.

    Sorts the positives' and the negatives' scores separately and counts, for every positive, the negatives
    strictly below and equal to it with two ``searchsorted`` calls -- exact with ties, as sklearn's
    ``roc_auc_score``.
    """
    pos = np.sort(score[y])
    neg = np.sort(score[~y])
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    below = np.searchsorted(neg, pos, side="left")
    below_or_equal = np.searchsorted(neg, pos, side="right")
    u = below.sum(dtype=np.float64) + 0.5 * (below_or_equal - below).sum(dtype=np.float64)
    return float(u / (float(pos.size) * float(neg.size)))


def _grouped_auroc(score: np.ndarray, y: np.ndarray, group: np.ndarray, n_groups: int):
    """Mann-Whitney AUROC per group in one pass. Returns (auc [G] with nan where undefined, n_pos, n_neg).

    Samples are sorted by (group, score) -- an argsort of the scores, then a stable radix sort by group -- and
    a run of equal (group, score) is a tie whose members all get the run's average within-group rank
    (1-based). Then ``AUC_g = (R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg)`` with ``R_pos`` the sum of the
    positives' ranks: the probability that a random positive outscores a random negative of the same group,
    ties counting 1/2, as ``sklearn.metrics.roc_auc_score``.
    """
    n = score.shape[0]
    by_score = np.argsort(score)  # order inside a tie run is irrelevant: ranks are averaged over the run
    order = by_score[stable_argsort_small_ints(group[by_score])]
    s_sorted = score[order]
    y_sorted = y[order]
    g_sorted = group[order]

    new_run = np.empty(n, dtype=bool)  # start of a tie run: new score or new group
    new_run[0] = True
    np.not_equal(s_sorted[1:], s_sorted[:-1], out=new_run[1:])
    new_run[1:] |= g_sorted[1:] != g_sorted[:-1]
    run_id = np.cumsum(new_run) - 1
    run_first = np.flatnonzero(new_run).astype(np.float64)
    run_last = np.append(run_first[1:] - 1.0, n - 1.0)
    avg_pos = 0.5 * (run_first + run_last)[run_id]  # average 0-based global position of the tie run

    n_tot = np.bincount(g_sorted, minlength=n_groups).astype(np.float64)
    g_start = np.concatenate(([0.0], np.cumsum(n_tot)[:-1]))
    rank = avg_pos - g_start[g_sorted] + 1.0
    n_pos = np.bincount(g_sorted, weights=y_sorted, minlength=n_groups)
    r_pos = np.bincount(g_sorted, weights=np.where(y_sorted, rank, 0.0), minlength=n_groups)
    n_neg = n_tot - n_pos
    denom = n_pos * n_neg
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (r_pos - n_pos * (n_pos + 1.0) / 2.0) / denom
    auc[denom == 0] = np.nan
    return auc, n_pos, n_neg


def auroc(confidence: Any, correct: Any) -> float:
    """Pooled AUROC of ``confidence`` (any real score; higher = more confident) for predicting ``correct``.

    The probability that a random correct sample has a higher confidence than a random wrong one, ties counting
    1/2 -- the value of ``sklearn.metrics.roc_auc_score(correct, confidence)``. Returns ``nan`` when only one
    class is present. Exact with ties (sorted positives and negatives, counted with ``searchsorted``).
    """
    s = as_scores(confidence)
    y = as_correct(correct)
    check_same_length(confidence=s, correct=y)
    return _pooled_auroc(s, y)


def weighted_auroc(confidence: Any, correct: Any, weights: Any):
    """Pooled AUROC with a weight per sample: ``sklearn.metrics.roc_auc_score(correct, confidence,
    sample_weight=weights)`` (ties counting 1/2), for one weight vector [M] (-> float) or a batch of them [B, M]
    (-> array [B], one sort for all rows: bootstrap resamples as prompt counts). NaN where a row's positive or
    negative weight is zero.
    """
    s = as_scores(confidence)
    y = as_correct(correct)
    check_same_length(confidence=s, correct=y)
    w = np.asarray(weights, dtype=np.float64)
    single = w.ndim == 1
    w = np.atleast_2d(w)
    if w.shape[1] != s.size:
        raise ValueError(f"weights need one entry per sample ({s.size}), got shape {np.shape(weights)}")
    order = np.argsort(s, kind="mergesort")
    s, y, w = s[order], y[order], w[:, order]
    _, tie = np.unique(s, return_inverse=True)  # equal scores share a slot: ties count one half
    n_slots = int(tie.max()) + 1 if tie.size else 0
    pos = np.zeros((w.shape[0], n_slots))
    neg = np.zeros_like(pos)
    np.add.at(pos.T, tie[y], w[:, y].T)
    np.add.at(neg.T, tie[~y], w[:, ~y].T)
    neg_below = np.cumsum(neg, axis=1) - neg
    num = (pos * (neg_below + 0.5 * neg)).sum(axis=1)
    den = pos.sum(axis=1) * neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return float(out[0]) if single else out


def roc_curve(confidence: Any, correct: Any, *, drop_intermediate: bool = True):
    """ROC curve ``(fpr, tpr, thresholds)`` exactly as ``sklearn.metrics.roc_curve(correct, confidence)`` (1.9):
    one point per distinct confidence, highest first, from the answered and answered-correct counts of
    :func:`calibrl.metrics.abstention._threshold_steps` (true positives = correct samples at or above the threshold,
    false positives = the others), with ``drop_intermediate`` dropping the points collinear with both neighbours
    (sklearn's second-difference test) and a first point (0, 0) at threshold +inf; fpr (tpr) is nan without wrong
    (right) samples, where sklearn warns. Computed here rather than by sklearn: importing sklearn cost more than
    the curve (2-6 s of ``calibrl eval``'s figures), and the counts are the ones the other ranking figures use."""
    from calibrl.metrics.abstention import _threshold_steps

    answered, tps, thresholds, _ = _threshold_steps(confidence, correct)
    fps = answered - tps
    if drop_intermediate and fps.shape[0] > 2:
        keep = np.flatnonzero(np.concatenate(([True], (np.diff(fps, 2) != 0) | (np.diff(tps, 2) != 0), [True])))
        fps, tps, thresholds = fps[keep], tps[keep], thresholds[keep]
    tps, fps = np.concatenate(([0.0], tps)), np.concatenate(([0.0], fps))
    thresholds = np.concatenate(([np.inf], np.asarray(thresholds, dtype=np.float64)))
    fpr = fps / fps[-1] if fps[-1] > 0 else np.full(fps.shape, np.nan)
    tpr = tps / tps[-1] if tps[-1] > 0 else np.full(tps.shape, np.nan)
    return fpr, tpr, thresholds


class PerPromptAUROC(NamedTuple):
    """Mean of the per-prompt AUROCs over the ``n_prompts`` prompts that have both correct and wrong samples."""

    mean: float
    n_prompts: int


def per_prompt_auroc(confidence: Any, correct: Any, prompt_ids: Any, *, return_values: bool = False):
    """AUROC computed within each prompt's samples, averaged over prompts having both outcomes.

    This asks whether the model can tell its right answers from its wrong ones *on the same question* (pooled
    AUROC also rewards knowing which questions are hard). One vectorised pass: a single sort by
    (prompt, confidence), average ranks for ties within a prompt, Mann-Whitney U per prompt via bincount.

    Returns ``PerPromptAUROC(mean, n_prompts)``; ``mean`` is ``nan`` and ``n_prompts`` 0 when no prompt has both
    outcomes. With ``return_values=True`` returns ``(PerPromptAUROC, values)`` where ``values`` [n_unique_prompts]
    holds each prompt's AUROC (nan where undefined), in the sorted order of the unique prompt ids.
    """
    s = as_scores(confidence)
    y = as_correct(correct)
    g, n_groups = group_index(prompt_ids)
    check_same_length(confidence=s, correct=y, prompt_ids=g)
    auc, _, _ = _grouped_auroc(s, y, g, n_groups)
    valid = ~np.isnan(auc)
    n_valid = int(valid.sum())
    result = PerPromptAUROC(float(auc[valid].mean()) if n_valid else float("nan"), n_valid)
    return (result, auc) if return_values else result


# ------------------------------------------------------------------------------------------------- binning
def bin_edges(confidence: Any, *, n_bins: int = 10, strategy: Strategy = "uniform") -> np.ndarray:
    """Bin edges [n_bins + 1] used by ece / mce / reliability_bins (see the module docstring)."""
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")
    if strategy == "uniform":
        return np.linspace(0.0, 1.0, int(n_bins) + 1)
    if strategy == "quantile":
        p = as_prob(confidence)
        # exactly sklearn.calibration.calibration_curve(strategy="quantile"): linspace(0, 1) * 100, not
        # linspace(0, 100), whose last-bit differences move the interpolated edges (and so tied values).
        return np.percentile(p, np.linspace(0.0, 1.0, int(n_bins) + 1) * 100)
    raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")


@dataclass(frozen=True)
class ReliabilityBins:
    """Per-bin statistics. Empty bins have ``counts == 0`` and ``nan`` mean_confidence / accuracy.

    edges            [n_bins + 1] bin edges (bin b is (edges[b], edges[b+1]], the first also includes edges[0])
    mean_confidence  [n_bins] mean confidence of the bin's samples
    accuracy         [n_bins] fraction of the bin's samples that are correct
    counts           [n_bins] number of samples in the bin
    """

    edges: np.ndarray
    mean_confidence: np.ndarray
    accuracy: np.ndarray
    counts: np.ndarray

    @property
    def fractions(self) -> np.ndarray:
        """Fraction of all samples in each bin."""
        return self.counts / max(int(self.counts.sum()), 1)

    @property
    def gaps(self) -> np.ndarray:
        """``accuracy - mean_confidence`` per bin (negative = over-confident; nan for empty bins)."""
        return self.accuracy - self.mean_confidence

    @property
    def ece(self) -> float:
        nz = self.counts > 0
        return float(np.sum(self.fractions[nz] * np.abs(self.gaps[nz])))

    @property
    def mce(self) -> float:
        nz = self.counts > 0
        return float(np.max(np.abs(self.gaps[nz]))) if nz.any() else float("nan")


def _bin_sums(p: np.ndarray, y: np.ndarray, n_bins: int, strategy: Strategy):
    edges = bin_edges(p, n_bins=n_bins, strategy=strategy)
    ids = np.searchsorted(edges[1:-1], p, side="left")
    counts = np.bincount(ids, minlength=n_bins)
    conf_sum = np.bincount(ids, weights=p, minlength=n_bins)
    acc_sum = np.bincount(ids, weights=y, minlength=n_bins)
    return edges, counts, conf_sum, acc_sum


def reliability_bins(confidence: Any, correct: Any, *, n_bins: int = 10, strategy: Strategy = "uniform"):
    """Reliability-diagram statistics per bin -> :class:`ReliabilityBins` (binning: module docstring)."""
    p = as_prob(confidence)
    y = as_correct(correct)
    check_same_length(confidence=p, correct=y)
    edges, counts, conf_sum, acc_sum = _bin_sums(p, y, n_bins, strategy)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(counts > 0, conf_sum / counts, np.nan)
        acc = np.where(counts > 0, acc_sum / counts, np.nan)
    return ReliabilityBins(edges=edges, mean_confidence=mean_conf, accuracy=acc, counts=counts)


def ece(confidence: Any, correct: Any, *, n_bins: int = 10, strategy: Strategy = "uniform") -> float:
    """Expected calibration error ``sum_b (n_b / N) * |acc_b - conf_b|`` over non-empty bins.

    ``strategy="uniform"``: equal-width bins on [0, 1]; ``"quantile"``: equal-count bins with edges at the
    confidence percentiles (ties can make bins unequal or empty). A value in [0, 1] (multiply by 100 for the
    percentages papers print).
    """
    return reliability_bins(confidence, correct, n_bins=n_bins, strategy=strategy).ece


def mce(confidence: Any, correct: Any, *, n_bins: int = 10, strategy: Strategy = "uniform") -> float:
    """Maximum calibration error ``max_b |acc_b - conf_b|`` over non-empty bins (same binning as :func:`ece`)."""
    return reliability_bins(confidence, correct, n_bins=n_bins, strategy=strategy).mce


# ------------------------------------------------------------------------------------------- proper scores
def brier(confidence: Any, correct: Any) -> float:
    """Brier score ``mean((p - y)^2)`` (lower is better; = ``sklearn.metrics.brier_score_loss``)."""
    p = as_prob(confidence)
    y = as_correct(correct)
    check_same_length(confidence=p, correct=y)
    return float(np.mean((p - y) ** 2))


def nll(confidence: Any, correct: Any, eps: float = 1e-12) -> float:
    """Binary negative log-likelihood ``-mean(y log p + (1 - y) log(1 - p))``, p clipped to [eps, 1 - eps]."""
    p = as_prob(confidence)
    y = as_correct(correct)
    check_same_length(confidence=p, correct=y)
    p = np.clip(p, eps, 1.0 - eps)
    return float(-np.mean(np.where(y, np.log(p), np.log1p(-p))))


# ---------------------------------------------------------------------------------------------- multi-class
def top_label(class_probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Top-label reduction of multi-class predictions.

    ``class_probs`` [N, C] (rows are probability vectors), ``labels`` [N] integer class indices. Returns
    ``(confidence, correct)``: the arg-max probability and whether the arg-max is the label. Feed them to
    :func:`ece` etc. for the top-label (a.k.a. "confidence") calibration error.
    """
    probs = to_numpy(class_probs).astype(np.float64, copy=False)
    if probs.ndim != 2:
        raise ValueError(f"class_probs must be [N, C], got shape {probs.shape}")
    lab = to_numpy(labels).reshape(-1)
    if lab.dtype.kind not in "iu":
        if lab.dtype.kind == "f" and np.array_equal(lab, np.round(lab)):
            lab = lab.astype(np.int64)
        else:
            raise ValueError(f"labels must be integer class indices, got dtype {lab.dtype}")
    if lab.shape[0] != probs.shape[0]:
        raise ValueError(f"class_probs has {probs.shape[0]} rows but labels has {lab.shape[0]}")
    if lab.size and (lab.min() < 0 or lab.max() >= probs.shape[1]):
        raise ValueError(f"labels must be in 0..{probs.shape[1] - 1}")
    pred = probs.argmax(axis=1)
    conf = probs[np.arange(probs.shape[0]), pred]
    return conf, pred == lab


def auroc_standard_error(auroc: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil (1982) standard error of an AUROC from n_pos positives and n_neg negatives (nan when a
    class is empty): the width one evaluation can resolve."""
    import math

    if n_pos < 1 or n_neg < 1 or not math.isfinite(auroc):
        return float("nan")
    q1, q2 = auroc / (2 - auroc), 2 * auroc ** 2 / (1 + auroc)
    var = (auroc * (1 - auroc) + (n_pos - 1) * (q1 - auroc ** 2) + (n_neg - 1) * (q2 - auroc ** 2)) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))
