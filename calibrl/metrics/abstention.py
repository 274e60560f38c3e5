"""Selective prediction: answer only when confident enough, abstain otherwise.

Sort samples by confidence, highest first, and answer the most confident fraction (the *coverage*); the
*precision* is the accuracy on the answered samples and the *risk* is ``1 - precision``.

Ties: samples with equal confidence cannot be separated by any threshold, so :func:`precision_coverage` and
:func:`aurc` treat a run of tied samples as ONE threshold step (answered all together or not at all), which
makes every figure independent of the input order. :func:`precision_at_coverage` asks for an exact coverage
that may fall inside a tie run; it then counts the tied run at its mean accuracy -- the expected precision when
ties are broken at random.

Choosing a threshold with a guarantee: :func:`abstention_threshold` picks, on calibration samples, the lowest
threshold of a FIXED grid whose one-sided Clopper-Pearson lower bound on precision, at level delta / (grid size)
(Bonferroni over the grid), reaches the target; :func:`calibrated_abstention` does it on a calibration half of the
prompts (one sample per prompt, so the binomial's trials are independent) and reports coverage and precision on
the other half. The guarantee's statement and assumptions are in docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

from calibrl.metrics._arrays import as_correct, as_scores, check_same_length, group_index, stable_argsort_small_ints

__all__ = [
    "DEFAULT_COVERAGES",
    "DEFAULT_THRESHOLD_GRID",
    "AbstentionThreshold",
    "CalibratedAbstention",
    "abstention_threshold",
    "aurc",
    "calibrated_abstention",
    "calibration_split",
    "clopper_pearson_lower",
    "precision_at_coverage",
    "precision_coverage",
]

DEFAULT_COVERAGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def _threshold_steps(confidence: Any, correct: Any):
    """One step per distinct confidence, highest first.

    Returns ``(answered [R], answered_correct [R], thresholds [R], N)``: step j answers every sample with
    confidence >= thresholds[j]. Uses value sorts (no argsort): the sorted scores give the tie runs, the sorted
    scores of the correct samples give the correct counts via ``searchsorted``.
    """
    s = as_scores(confidence)
    y = as_correct(correct)
    n = check_same_length(confidence=s, correct=y)
    asc = np.sort(s)
    asc_pos = np.sort(s[y])
    run_start = np.flatnonzero(np.concatenate(([True], asc[1:] != asc[:-1])))[::-1]  # highest value first
    thresholds = asc[run_start]
    answered = n - run_start
    answered_correct = asc_pos.size - np.searchsorted(asc_pos, thresholds, side="left")
    return answered.astype(np.float64), answered_correct.astype(np.float64), thresholds, n


def precision_coverage(confidence: Any, correct: Any, *, return_thresholds: bool = False):
    """Precision-coverage curve, one point per distinct confidence value.

    Point j answers every sample with ``confidence >= t_j`` (t_1 > t_2 > ... the distinct confidences):
    ``coverage_j = n_j / N`` and ``precision_j = (correct among them) / n_j``. Returns ``(coverage, precision)``
    with coverage increasing to 1 (``(coverage, precision, thresholds)`` with ``return_thresholds=True``).
    ``confidence`` may be any real score (log-probabilities work).
    """
    answered, answered_correct, thresholds, n = _threshold_steps(confidence, correct)
    coverage = answered / n
    precision = answered_correct / answered
    if return_thresholds:
        return coverage, precision, thresholds
    return coverage, precision


def aurc(confidence: Any, correct: Any) -> float:
    """Area under the risk-coverage curve (lower is better), risk = 1 - precision.

    ``AURC = sum_j (coverage_j - coverage_{j-1}) * risk_j`` over the threshold steps of
    :func:`precision_coverage` (``coverage_0 = 0``). Without ties this is exactly Geifman et al.'s
    ``(1/N) sum_{i=1}^{N} risk(top-i samples)``; a tie run contributes its width times the risk once it is
    answered.
    """
    coverage, precision = precision_coverage(confidence, correct)
    widths = np.diff(coverage, prepend=0.0)
    return float(np.sum(widths * (1.0 - precision)))


def precision_at_coverage(
    confidence: Any, correct: Any, coverages: Iterable[float] = DEFAULT_COVERAGES
) -> dict[float, float]:
    """Precision when answering the most confident fraction c of the samples, for each c in ``coverages``.

    Answers the top ``m = ceil(c * N)`` samples (at least 1). When the m-th sample sits inside a tie run, the
    part of the run that is answered counts at the run's mean accuracy (expected precision under random
    tie-breaking). Returns ``{c: precision}``.
    """
    cov = np.asarray(list(coverages), dtype=np.float64).reshape(-1)
    if cov.size == 0:
        return {}
    if np.isnan(cov).any() or cov.min() <= 0.0 or cov.max() > 1.0:
        raise ValueError(f"coverages must lie in (0, 1], got {cov.tolist()}")
    answered, answered_correct, _, n = _threshold_steps(confidence, correct)
    m = np.clip(np.ceil(cov * n - 1e-9), 1, n)  # number of samples answered
    r = np.searchsorted(answered, m, side="left")  # first step answering at least m: its tie run holds the m-th
    before_n = np.where(r > 0, answered[np.maximum(r - 1, 0)], 0.0)
    before_c = np.where(r > 0, answered_correct[np.maximum(r - 1, 0)], 0.0)
    run_acc = (answered_correct[r] - before_c) / (answered[r] - before_n)
    precision = (before_c + (m - before_n) * run_acc) / m
    return {float(c): float(p) for c, p in zip(cov, precision)}


# ------------------------------------------------------------------------------ threshold with a guarantee

DEFAULT_THRESHOLD_GRID = np.round(np.linspace(0.0, 1.0, 101), 2)  # 0.00, 0.01, ..., 1.00: fixed before any data
DEFAULT_CALIBRATION_FRACTION = 0.5
ABSTENTION_METHOD = "clopper-pearson, bonferroni over a fixed grid, one sample per calibration prompt"


def clopper_pearson_lower(n_correct: Any, n_answered: Any, *, delta: float) -> np.ndarray:
    """One-sided (1 - delta) Clopper-Pearson lower confidence bound on a binomial proportion, elementwise.

    ``L(k, n) = BetaQuantile(delta; k, n - k + 1)`` (the exact bound: P(Bin(n, q) >= k) = delta at q = L), with
    ``L = 0`` when k = 0 and ``nan`` when n = 0 (nothing observed). Shapes: ``n_correct`` and ``n_answered``
    broadcast; returns float64 of their broadcast shape. ``L >= q0`` exactly when the one-sided binomial test of
    ``H0: q <= q0`` has p-value ``P(Bin(n, q0) >= k) <= delta``.
    """
    from scipy.stats import beta as beta_distribution  # here: `import calibrl.metrics` stays numpy-only

    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    k = np.asarray(n_correct, dtype=np.float64)
    n = np.asarray(n_answered, dtype=np.float64)
    if np.any(k < 0) or np.any(k > n):
        raise ValueError("n_correct must lie in [0, n_answered]")
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = beta_distribution.ppf(delta, np.maximum(k, 1.0), n - k + 1.0)
    bound = np.where(k == 0, 0.0, bound)
    return np.where(n == 0, np.nan, bound)


@dataclass(frozen=True)
class AbstentionThreshold:
    """Result of :func:`abstention_threshold`; arrays are per grid threshold, ascending.

    ``threshold`` is None when no grid threshold qualifies; ``lower_bound`` is each threshold's Clopper-Pearson
    lower bound on precision at level ``delta / len(grid)`` (nan where nothing is answered).
    """

    threshold: float | None
    grid: np.ndarray
    n_answered: np.ndarray
    n_correct: np.ndarray
    lower_bound: np.ndarray
    qualifies: np.ndarray
    target_precision: float
    delta: float

    @property
    def index(self) -> int | None:
        """Position of ``threshold`` in ``grid`` (None when none qualifies)."""
        hits = np.flatnonzero(self.qualifies)
        return int(hits[0]) if hits.size else None


def _check_target(target_precision: float, delta: float) -> None:
    if not 0.0 < float(target_precision) < 1.0:
        raise ValueError(f"target_precision must lie in (0, 1), got {target_precision}")
    if not 0.0 < float(delta) < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")


def _check_grid(grid: Any) -> np.ndarray:
    arr = np.asarray(grid, dtype=np.float64).reshape(-1)
    if arr.size == 0 or not np.isfinite(arr).all():
        raise ValueError(f"grid must be a non-empty list of finite thresholds, got {arr.tolist()[:5]}")
    if np.any(np.diff(arr) <= 0):
        raise ValueError("grid must be strictly increasing")
    return arr


def abstention_threshold(
    confidence: Any, correct: Any, *, target_precision: float, delta: float, grid: Any = DEFAULT_THRESHOLD_GRID
) -> AbstentionThreshold:
    """The lowest threshold t of a fixed ``grid`` certified to have precision >= ``target_precision``.

    Rule: answer a sample when ``confidence >= t``. For each grid threshold t_g (G of them), with n_g samples
    answered and k_g of them correct, the one-sided Clopper-Pearson lower bound at level delta / G,
    ``L_g = BetaQuantile(delta / G; k_g, n_g - k_g + 1)``; t_g qualifies when ``L_g >= target_precision``, and
    the lowest qualifying t_g (the largest coverage) is returned.

    Guarantee: if the rows are i.i.d. draws (confidence, correct) and the grid does not depend on them, then
    with probability >= 1 - delta EVERY qualifying threshold has population precision
    ``P(correct | confidence >= t) >= target_precision`` (Bonferroni: each of the G exact tests errs with
    probability <= delta / G), so in particular the returned one does. Why Bonferroni and not fixed-sequence
    testing: fixed-sequence testing (no correction) must start at the most conservative threshold and stop at the
    first that fails; the highest thresholds answer few or no calibration samples and fail, so it would stop
    there, and starting it where data begins makes the order depend on the data. Bonferroni costs a factor
    log(G) in the bound's width (delta / 101 for the default grid) whatever the data.

    ``confidence`` [N] any real score on the grid's scale (default grid 0.00, 0.01, ..., 1.00 for probabilities),
    ``correct`` [N] bool. Cost: two sorts of N values and G beta quantiles.
    """
    _check_target(target_precision, delta)
    thresholds = _check_grid(grid)
    s = as_scores(confidence)
    y = as_correct(correct)
    n = check_same_length(confidence=s, correct=y)
    asc = np.sort(s)
    asc_correct = np.sort(s[y])
    n_answered = n - np.searchsorted(asc, thresholds, side="left")  # samples with s >= t
    n_correct = asc_correct.size - np.searchsorted(asc_correct, thresholds, side="left")
    lower = clopper_pearson_lower(n_correct, n_answered, delta=delta / thresholds.size)
    qualifies = np.nan_to_num(lower, nan=-1.0) >= target_precision
    hits = np.flatnonzero(qualifies)
    return AbstentionThreshold(
        threshold=float(thresholds[hits[0]]) if hits.size else None, grid=thresholds, n_answered=n_answered,
        n_correct=n_correct, lower_bound=lower, qualifies=qualifies, target_precision=float(target_precision),
        delta=float(delta))


@dataclass(frozen=True)
class CalibratedAbstention:
    """Result of :func:`calibrated_abstention` (``to_dict()``: the JSON form ``calibrl eval`` writes).

    ``threshold``: None when no grid threshold qualifies (then nothing is answered: coverage 0, precision None).
    ``coverage`` / ``precision_heldout``: over ALL samples of the held-out prompts (pooled); ``calibration_*``:
    the chosen threshold's figures on the calibration draw (one sample per prompt).
    """

    threshold: float | None
    coverage: float
    precision_heldout: float | None
    target_precision: float
    delta: float
    n_calibration_prompts: int
    n_heldout_prompts: int
    n_heldout_samples: int
    calibration_fraction: float
    calibration_coverage: float | None
    calibration_lower_bound: float | None
    grid_size: int
    seed: int
    method: str = ABSTENTION_METHOD
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def calibration_split(prompt_ids: Any, *, calibration_fraction: float = DEFAULT_CALIBRATION_FRACTION,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Split by prompt: ``(calibration_mask [N], one_per_prompt [N])``, both bool over samples.

    A uniformly random ``round(calibration_fraction * P)`` (at least 1, at most P - 1) of the P prompts (numpy ``default_rng(seed)``) are
    calibration prompts, all of their samples in ``calibration_mask``; ``one_per_prompt`` marks one uniformly drawn
    sample of each calibration prompt. Deterministic given ``seed`` and the input; which prompts calibrate depends
    only on ``seed`` and the set of prompt ids (not their order).
    """
    if not 0.0 < calibration_fraction < 1.0:
        raise ValueError(f"calibration_fraction must lie in (0, 1), got {calibration_fraction}")
    pidx, n_prompts = group_index(prompt_ids)
    rng = np.random.default_rng(seed)
    n_cal = min(max(int(round(calibration_fraction * n_prompts)), 1), max(n_prompts - 1, 1))  # both sides non-empty
    is_cal_prompt = np.zeros(n_prompts, dtype=bool)
    is_cal_prompt[rng.permutation(n_prompts)[:n_cal]] = True
    calibration_mask = is_cal_prompt[pidx]
    # one sample per prompt: a uniform position j in [0, n_p) among the prompt's samples, in input order
    counts = np.bincount(pidx, minlength=n_prompts)
    by_prompt = stable_argsort_small_ints(pidx)  # sample indices grouped by prompt, input order within
    starts = np.cumsum(counts) - counts
    position = np.minimum((rng.random(n_prompts) * counts).astype(np.int64), counts - 1)
    one_per_prompt = np.zeros(pidx.size, dtype=bool)
    one_per_prompt[by_prompt[(starts + position)[is_cal_prompt]]] = True
    return calibration_mask, one_per_prompt


def calibrated_abstention(
    confidence: Any,
    correct: Any,
    prompt_ids: Any,
    *,
    target_precision: float,
    delta: float,
    calibration_fraction: float = DEFAULT_CALIBRATION_FRACTION,
    seed: int = 0,
    grid: Any = DEFAULT_THRESHOLD_GRID,
) -> CalibratedAbstention:
    """Choose an abstention threshold on calibration prompts and measure it on the held-out prompts.

    1. :func:`calibration_split`: half of the prompts (``calibration_fraction``) calibrate, the rest are held out.
    2. :func:`abstention_threshold` on ONE random sample per calibration prompt. The unit of the guarantee is the
       prompt: samples of one prompt share its difficulty and are not independent, so counting all of them as
       Bernoulli trials would make the bound too narrow; one sample per prompt makes the trials independent when
       prompts are exchangeable (i.i.d. from a distribution of prompts).
    3. On ALL samples of the held-out prompts: ``coverage`` = fraction with confidence >= t, ``precision_heldout``
       = fraction correct among them (pooled over samples).

    Guarantee (when prompts are i.i.d. and each sample is drawn from the model given its prompt): with
    probability >= 1 - delta over the calibration draw, ``P(correct | confidence >= t) >= target_precision`` for
    a fresh prompt and a fresh sample of it; as samples of a prompt are identically distributed, this is also the
    expected pooled precision over any number of fresh samples per prompt. The held-out figures are an estimate
    of what the guarantee is about, with their own sampling noise.

    ``confidence``, ``correct``, ``prompt_ids``: [N], one entry per sample.
    """
    _check_target(target_precision, delta)
    s = as_scores(confidence)
    y = as_correct(correct)
    check_same_length(confidence=s, correct=y, prompt_ids=np.asarray(prompt_ids).reshape(-1))
    pidx, n_prompts = group_index(prompt_ids)
    thresholds = _check_grid(grid)
    common = dict(target_precision=float(target_precision), delta=float(delta),
                  calibration_fraction=float(calibration_fraction), grid_size=int(thresholds.size), seed=int(seed))
    if n_prompts < 2:
        return CalibratedAbstention(threshold=None, coverage=0.0, precision_heldout=None, n_calibration_prompts=0,
                                    n_heldout_prompts=n_prompts, n_heldout_samples=int(s.size),
                                    calibration_coverage=None, calibration_lower_bound=None,
                                    note="needs at least 2 prompts (one to calibrate, one to check)", **common)
    cal_mask, cal_draw = calibration_split(pidx, calibration_fraction=calibration_fraction, seed=seed)
    held = ~cal_mask
    found = abstention_threshold(s[cal_draw], y[cal_draw], target_precision=target_precision, delta=delta,
                                 grid=thresholds)
    n_cal = int(cal_draw.sum())
    n_held_prompts = n_prompts - n_cal  # cal_draw holds exactly one sample per calibration prompt
    if found.threshold is None:
        return CalibratedAbstention(
            threshold=None, coverage=0.0, precision_heldout=None, n_calibration_prompts=n_cal,
            n_heldout_prompts=n_held_prompts, n_heldout_samples=int(held.sum()), calibration_coverage=None,
            calibration_lower_bound=None,
            note=(f"none of the {thresholds.size} grid thresholds has a Clopper-Pearson lower bound >= "
                  f"{target_precision:g} at level {delta:g}/{thresholds.size} on {n_cal} calibration prompts "
                  "(more prompts or a lower target may help)"), **common)
    g = found.index
    answered = held & (s >= found.threshold)
    n_answered = int(answered.sum())
    return CalibratedAbstention(
        threshold=found.threshold, coverage=float(n_answered / max(int(held.sum()), 1)),
        precision_heldout=float(y[answered].mean()) if n_answered else None, n_calibration_prompts=n_cal,
        n_heldout_prompts=n_held_prompts, n_heldout_samples=int(held.sum()),
        calibration_coverage=float(found.n_answered[g] / n_cal), calibration_lower_bound=float(found.lower_bound[g]),
        note=None if n_answered else "the threshold answers no held-out sample", **common)
