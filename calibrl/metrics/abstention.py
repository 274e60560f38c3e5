"""Selective prediction: answer only when confident enough, abstain otherwise.

Sort samples by confidence, highest first, and answer the most confident fraction (the *coverage*); the
*precision* is the accuracy on the answered samples and the *risk* is ``1 - precision``.

Ties: samples with equal confidence cannot be separated by any threshold, so :func:`precision_coverage` and
:func:`aurc` treat a run of tied samples as ONE threshold step (answered all together or not at all), which
makes every figure independent of the input order. :func:`precision_at_coverage` asks for an exact coverage
that may fall inside a tie run; it then counts the tied run at its mean accuracy -- the expected precision when
ties are broken at random.

Choosing a threshold with a guarantee, :func:`calibrated_abstention`, two procedures by name:

- ``method="betting"`` (default): every sample of each calibration prompt, the prompt as the unit. Per prompt i and
  grid threshold t, ``c_i(t) - P a_i(t)`` (answered-correct minus target times answered) is a bounded term of mean
  ``E[c] - P E[a]``; a betting test (:func:`betting_p_value`, Waudby-Smith & Ramdas 2020) on the calibration
  prompts decides ``E[c] >= P E[a]``, and fixed-sequence testing (Learn then Test, Angelopoulos et al. 2021)
  walks the grid down from a start chosen on the held-out prompts (:func:`sequence_start`) with no multiplicity
  correction (:func:`fixed_sequence`). With ``randomize=True`` the final capital also counts against a seeded
  uniform draw (randomized Ville, Ramdas & Manole 2023): more power, but a certificate the draw decided.
- ``method="bonferroni"``: :func:`abstention_threshold` picks, on ONE sample per calibration prompt, the lowest
  threshold of a FIXED grid whose one-sided Clopper-Pearson lower bound on precision, at level delta / (grid
  size), reaches the target.

Both report coverage and precision on the held-out prompts. The guarantee's statement, assumptions and the validity
argument are in docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

from calibrl.metrics._arrays import as_correct, as_scores, check_same_length, group_index, stable_argsort_small_ints

__all__ = [
    "ABSTENTION_METHODS",
    "DEFAULT_COVERAGES",
    "DEFAULT_THRESHOLD_GRID",
    "AbstentionThreshold",
    "CalibratedAbstention",
    "abstention_threshold",
    "aurc",
    "betting_p_value",
    "calibrated_abstention",
    "calibration_split",
    "clopper_pearson_lower",
    "fixed_sequence",
    "precision_at_coverage",
    "precision_coverage",
    "prompt_threshold_counts",
    "sequence_start",
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
    answered, answered_correct, _, n = _threshold_steps(confidence, correct)
    return _aurc_from_steps(answered, answered_correct, n)


def _aurc_from_steps(answered: np.ndarray, answered_correct: np.ndarray, n: int) -> float:
    """:func:`aurc` from :func:`_threshold_steps`' counts (shared with :func:`calibrl.metrics.ranking_figures`)."""
    coverage = answered / n
    precision = answered_correct / answered
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
    cov = _check_coverages(coverages)
    if cov.size == 0:
        return {}
    answered, answered_correct, _, n = _threshold_steps(confidence, correct)
    return _precision_at_coverage_from_steps(answered, answered_correct, n, cov)


def _check_coverages(coverages: Iterable[float]) -> np.ndarray:
    cov = np.asarray(list(coverages), dtype=np.float64).reshape(-1)
    if cov.size and (np.isnan(cov).any() or cov.min() <= 0.0 or cov.max() > 1.0):
        raise ValueError(f"coverages must lie in (0, 1], got {cov.tolist()}")
    return cov


def _precision_at_coverage_from_steps(answered: np.ndarray, answered_correct: np.ndarray, n: int,
                                      cov: np.ndarray) -> dict[float, float]:
    """:func:`precision_at_coverage` from :func:`_threshold_steps`' counts and checked coverages ``cov``."""
    if cov.size == 0:
        return {}
    m = np.clip(np.ceil(cov * n - 1e-9), 1, n)  # number of samples answered
    r = np.searchsorted(answered, m, side="left")  # first step answering at least m: its tie run holds the m-th
    before_n = np.where(r > 0, answered[np.maximum(r - 1, 0)], 0.0)
    before_c = np.where(r > 0, answered_correct[np.maximum(r - 1, 0)], 0.0)
    run_acc = (answered_correct[r] - before_c) / (answered[r] - before_n)
    precision = (before_c + (m - before_n) * run_acc) / m
    return {float(c): float(p) for c, p in zip(cov, precision)}


# ------------------------------------------------------------------------------ threshold with a guarantee

DEFAULT_THRESHOLD_GRID = np.round(np.linspace(0.0, 1.0, 101), 2)  # 0.00, 0.01, ..., 1.00: fixed before any data
DEFAULT_CALIBRATION_FRACTION = 0.5  # method="bonferroni"
DEFAULT_BETTING_CALIBRATION_FRACTION = 0.8  # method="betting": the test's power grows with the calibration prompts
ABSTENTION_METHOD = "clopper-pearson, bonferroni over a fixed grid, one sample per calibration prompt"
BETTING_METHOD = ("betting test of E[c - P a] >= 0 over calibration prompts (every sample), fixed-sequence testing "
                  "down a fixed grid from a start chosen on the held-out prompts")
RANDOMIZED_SUFFIX = "; randomized Ville: the final capital also counts, against a seeded uniform draw"
ABSTENTION_METHODS = {"betting": BETTING_METHOD, "bonferroni": ABSTENTION_METHOD}  # name -> description
DEFAULT_ABSTENTION_METHOD = "betting"
BET_CAP = 0.99  # largest bet, as a fraction of 1 / null_mean (keeps every capital factor >= 1 - BET_CAP > 0)
BET_PRIOR = (0.5, 0.25)  # (mean, variance) the bet's running estimates start from, with the weight of one term


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
    log(G) in the bound's width (delta / 101 for the default grid) whatever the data. (``calibrated_abstention``'s
    default ``method="betting"`` does use fixed-sequence testing, from a start chosen on held-out prompts.)

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


# ----------------------------------------------------------- every sample, prompt as the unit, betting test

def prompt_threshold_counts(confidence: Any, correct: Any, prompt_index: Any, *, n_prompts: int,
                            grid: Any = DEFAULT_THRESHOLD_GRID) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt and grid threshold: ``(answered [P, G], answered_correct [P, G])``, float64.

    ``answered[i, g] = #{samples j of prompt i: s_j >= t_g}``, ``answered_correct[i, g]`` the correct ones among
    them. ``confidence``, ``correct`` [N]; ``prompt_index`` [N] ints in [0, n_prompts); ``grid`` [G] increasing.
    One ``searchsorted`` (sample j is answered at the grid positions g < k_j, k_j = #{g: t_g <= s_j}), one
    ``bincount`` per array and a reverse cumulative sum over the grid: O(N log G + P G).
    """
    s = as_scores(confidence)
    y = as_correct(correct)
    thresholds = _check_grid(grid)
    pidx = np.asarray(prompt_index, dtype=np.int64).reshape(-1)
    check_same_length(confidence=s, correct=y, prompt_index=pidx)
    if pidx.size and (pidx.min() < 0 or pidx.max() >= n_prompts):
        raise ValueError(f"prompt_index must lie in [0, n_prompts = {n_prompts}), got {pidx.min()}..{pidx.max()}")
    width = thresholds.size + 1
    cell = pidx * width + np.searchsorted(thresholds, s, side="right")  # [N]: (prompt, k_j)
    per_k = np.bincount(cell, minlength=n_prompts * width).reshape(n_prompts, width)
    per_k_correct = np.bincount(cell[y], minlength=n_prompts * width).reshape(n_prompts, width)
    # answered at g = samples with k_j > g: reverse cumulative sum, then drop k = 0
    answered = np.cumsum(per_k[:, ::-1], axis=1)[:, ::-1][:, 1:]
    answered_correct = np.cumsum(per_k_correct[:, ::-1], axis=1)[:, ::-1][:, 1:]
    return answered.astype(np.float64), answered_correct.astype(np.float64)


def betting_p_value(x: Any, *, null_mean: float, delta: float, cap: float = BET_CAP,
                    u: float | None = None) -> np.ndarray:
    """p-value of ``H0: E[x] < null_mean`` for i.i.d. terms ``x`` in [0, 1], by betting (one-sided).

    Capital ``K_k = prod_{i<=k} (1 + lambda_i (x_i - m))``, m = ``null_mean``, with the predictable plug-in bet of
    Waudby-Smith & Ramdas (2020, eq. 26-27, fixed sample size n, one side):
    ``lambda_i = min(sqrt(2 log(1/delta) / (n sigma2_{i-1})), cap / m)``,
    ``mu_i = (1/2 + sum_{j<=i} x_j) / (i + 1)``, ``sigma2_i = (1/4 + sum_{j<=i} (x_j - mu_j)^2) / (i + 1)``
    (sigma2_0 = 1/4). Under H0 each factor has conditional mean ``1 + lambda_i (E x - m) <= 1`` and is >= 1 - cap
    > 0, so K is a nonnegative supermartingale and by Ville's inequality ``P(max_k K_k >= 1/a) <= a`` for every a:
    ``p = min(1, 1 / max_k K_k)`` is a valid p-value whatever the order of the terms (``delta`` only tunes the
    bet). Shapes: ``x`` [n, ...] (the test runs along axis 0, independently for each trailing index); returns
    [...]; n = 0 gives p = 1.

    ``u`` in (0, 1] (randomized Ville, Ramdas & Manole 2023): a uniform draw independent of ``x`` lets the FINAL
    capital count too, ``p = min(1, 1 / max_k K_k, u / K_n)``. Valid: for a level a let sigma be the first k with
    ``K_k >= 1/a`` (else n); ``{p <= a}`` is contained in ``{K_sigma >= u / a}``, whose probability is
    ``E[min(1, a K_sigma)] <= a E[K_sigma] <= a`` (optional stopping). A capital of 5 at the end, for example,
    passes at a = 0.1 with probability 1/2 instead of never.
    """
    arr = np.asarray(x, dtype=np.float64)
    m = float(null_mean)
    if not 0.0 < m < 1.0:
        raise ValueError(f"null_mean must lie in (0, 1), got {null_mean}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if not 0.0 < cap < 1.0:
        raise ValueError(f"cap must lie in (0, 1), got {cap}")
    n = arr.shape[0]
    if n == 0:
        return np.ones(arr.shape[1:])
    if np.nanmin(arr) < -1e-12 or np.nanmax(arr) > 1 + 1e-12 or np.isnan(arr).any():
        raise ValueError("x must lie in [0, 1]")
    i = np.arange(1, n + 1, dtype=np.float64).reshape((n,) + (1,) * (arr.ndim - 1))
    prior_mean, prior_var = BET_PRIOR
    mu = (prior_mean + np.cumsum(arr, axis=0)) / (i + 1)  # mu_i, i = 1..n
    sigma2 = (prior_var + np.cumsum((arr - mu) ** 2, axis=0)) / (i + 1)  # sigma2_i, i = 1..n
    sigma2_prev = np.concatenate([np.full((1,) + arr.shape[1:], prior_var), sigma2[:-1]], axis=0)  # sigma2_{i-1}
    lam = np.minimum(np.sqrt(2.0 * np.log(1.0 / delta) / (n * sigma2_prev)), cap / m)
    log_capital = np.cumsum(np.log1p(lam * (arr - m)), axis=0)
    p = np.exp(-np.maximum(log_capital.max(axis=0), 0.0))
    if u is None:
        return p
    if not 0.0 < u <= 1.0:
        raise ValueError(f"u must lie in (0, 1], got {u}")
    return np.minimum(p, u * np.exp(-log_capital[-1]))


def sequence_start(x_heldout: Any, *, null_mean: float, n_calibration: int, delta: float,
                   cap: float = BET_CAP) -> int:
    """Grid position where fixed-sequence testing starts: the threshold most likely to pass, judged on held-out.

    ``x_heldout`` [h, G]: the betting terms (as in :func:`betting_p_value`) of the h held-out prompts at each grid
    threshold. With the largest bet ``b = cap / m`` the calibration test's log-capital is about
    ``sum_i log(1 + b (x_i - m))``; from the held-out mean ``w_g`` and standard deviation ``v_g`` of
    ``log(1 + b (x - m))`` the score ``(n w_g - log(1/delta)) / (sqrt(n) v_g)`` (n = ``n_calibration``) is the
    normal approximation's z of passing. Where ``v_g = 0`` the score is +inf if ``n w_g >= log(1/delta)`` and -inf
    otherwise. Returns the position of the highest score, the highest threshold among ties. Depends on the held-out
    prompts only, never on the calibration ones: this is what keeps the order of the tests fixed in advance.
    """
    arr = np.asarray(x_heldout, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"x_heldout must be [h >= 1, G], got shape {arr.shape}")
    m = float(null_mean)
    w = np.log1p((cap / m) * (arr - m))
    mean, sd = w.mean(axis=0), w.std(axis=0)
    need = np.log(1.0 / delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = (n_calibration * mean - need) / (np.sqrt(n_calibration) * sd)
    score = np.where(sd > 1e-12, score, np.where(n_calibration * mean >= need, np.inf, -np.inf))
    return int(score.size - 1 - np.argmax(score[::-1]))


def fixed_sequence(p_values: Any, *, start: int, delta: float) -> int | None:
    """Fixed-sequence testing down the grid: test positions start, start - 1, ..., 0 each at level ``delta`` and
    stop at the first ``p > delta``; returns the last position that passed (None if ``start`` itself fails).

    ``p_values`` [G], one per grid threshold (ascending). If the order is fixed before the data, the chance that
    any true null among the passed positions is rejected is at most ``delta`` (the first true null in the order
    must be rejected for any error to happen, and that single test errs with probability <= delta)."""
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    if not 0 <= start < p.size:
        raise ValueError(f"start must be a grid position in [0, {p.size}), got {start}")
    last = None
    for g in range(start, -1, -1):
        if not p[g] <= delta:
            break
        last = g
    return last


def _betting_precision_bound(answered: np.ndarray, answered_correct: np.ndarray, *, scale: float, target: float,
                             delta: float, step: float = 0.001, u: float | None = None) -> float:
    """Largest level pi (on the grid target, target + step, ...) such that the betting test of
    ``E[c - pi' a] >= 0`` rejects at ``delta`` for every grid level pi' from ``target`` to pi; ``answered``,
    ``answered_correct`` [n] of one threshold, in the test's order. A figure for display: only pi = target is
    covered by the guarantee."""
    levels = target + step * np.arange(int(np.ceil((1.0 - target) / step - 1e-9)))  # target <= level < 1
    best = target
    for chunk in np.array_split(levels, max(1, levels.size // 50)):
        x = (answered_correct[:, None] - chunk[None, :] * answered[:, None]) / scale + chunk[None, :]
        ok = np.array([betting_p_value(x[:, [k]], null_mean=float(lv), delta=delta, u=u)[0] <= delta
                       for k, lv in enumerate(chunk)])
        if not ok.all():
            first_fail = int(np.argmin(ok))
            return round(float(chunk[first_fail - 1]), 6) if first_fail > 0 else round(best, 6)
        best = float(chunk[-1])
    return round(best, 6)


@dataclass(frozen=True)
class CalibratedAbstention:
    """Result of :func:`calibrated_abstention` (``to_dict()``: the JSON form ``calibrl eval`` writes).

    ``threshold``: None when no grid threshold qualifies (then nothing is answered: coverage 0, precision None).
    ``coverage`` / ``precision_heldout``: over ALL samples of the held-out prompts (pooled); ``calibration_*``:
    the chosen threshold's figures on the calibration data (``method_name="bonferroni"``: one sample per prompt,
    Clopper-Pearson bound at level delta / grid size; ``"betting"``: every sample, and the largest precision level
    its betting test still certifies at level delta). ``method``: the procedure in words; ``start_threshold``,
    ``calibration_p_value`` (betting only): where the fixed sequence started and the chosen threshold's p-value;
    ``randomized``, ``randomization_u`` (betting only): whether the randomized Ville rule was used and its uniform
    draw u (the p-values are then ``min(1 / max_k K_k, u / K_n)``, see :func:`betting_p_value`);
    ``calibration_p_value_deterministic``: the chosen threshold's p-value without the draw (> delta: the draw decided
    the certificate, and ``note`` says so).
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
    method_name: str = "bonferroni"
    n_calibration_samples: int | None = None
    start_threshold: float | None = None
    calibration_p_value: float | None = None
    randomized: bool | None = None
    randomization_u: float | None = None
    calibration_p_value_deterministic: float | None = None

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
    method: str = DEFAULT_ABSTENTION_METHOD,
    calibration_fraction: float | None = None,
    seed: int = 0,
    grid: Any = DEFAULT_THRESHOLD_GRID,
    randomize: bool = False,
) -> CalibratedAbstention:
    """Choose an abstention threshold on calibration prompts and measure it on the held-out prompts.

    1. :func:`calibration_split`: a random ``calibration_fraction`` of the prompts calibrate (default 0.8 for
       ``method="betting"``, 0.5 for ``"bonferroni"``), the rest are held out. The unit is the prompt: samples of
       one prompt share its difficulty and are not independent.
    2. ``method="betting"``: per calibration prompt i and grid threshold t (:func:`prompt_threshold_counts`),
       ``x_i(t) = (c_i(t) - P a_i(t)) / M + P`` in [0, 1] (a answered, c answered and correct, P the target, M the
       largest number of samples of a prompt); :func:`betting_p_value` tests ``E[x] >= P``, i.e.
       ``E[c] >= P E[a]``, over the calibration prompts in a seeded random order; :func:`sequence_start` picks the
       start on the held-out prompts and :func:`fixed_sequence` walks down the grid from it at level delta.
       With ``randomize=True`` the p-values use the randomized Ville rule of :func:`betting_p_value` with
       ``u = 1 - U``, U from ``default_rng((seed, 2))``: independent of the data like the split, it raises the
       coverage certified on calibrated i.i.d. samples at 600 prompts x 4 from 28% to 48% of the oracle's
       (docs/metrics.md), but near the level a draw decides the certificate (another seed, another answer), and
       such certificates are wrong more often than clear ones. The default, ``randomize=False``, gives a decision
       that depends on the data and the split only.
       ``method="bonferroni"``: :func:`abstention_threshold` on ONE random sample per calibration prompt.
    3. On ALL samples of the held-out prompts: ``coverage`` = fraction with confidence >= t, ``precision_heldout``
       = fraction correct among them (pooled over samples).

    Guarantee (prompts exchangeable, each sample drawn from the model given its prompt): with probability
    >= 1 - delta over the calibration prompts and the seeded draws, the returned t has
    ``E[c(t)] / E[a(t)] >= target_precision``: the precision of answered samples pooled over fresh prompts (a ratio
    of means; for "bonferroni" the same quantity, as samples of a prompt are identically distributed). The held-out
    figures estimate it, with their own noise.

    ``confidence``, ``correct``, ``prompt_ids``: [N], one entry per sample.
    """
    _check_target(target_precision, delta)
    if method not in ABSTENTION_METHODS:
        raise ValueError(f"method must be one of {sorted(ABSTENTION_METHODS)}, got {method!r}")
    if calibration_fraction is None:
        calibration_fraction = (DEFAULT_BETTING_CALIBRATION_FRACTION if method == "betting"
                                else DEFAULT_CALIBRATION_FRACTION)
    s = as_scores(confidence)
    y = as_correct(correct)
    check_same_length(confidence=s, correct=y, prompt_ids=np.asarray(prompt_ids).reshape(-1))
    pidx, n_prompts = group_index(prompt_ids)
    thresholds = _check_grid(grid)
    common = dict(target_precision=float(target_precision), delta=float(delta),
                  calibration_fraction=float(calibration_fraction), grid_size=int(thresholds.size), seed=int(seed),
                  method=ABSTENTION_METHODS[method], method_name=method)
    if n_prompts < 2:
        return CalibratedAbstention(threshold=None, coverage=0.0, precision_heldout=None, n_calibration_prompts=0,
                                    n_heldout_prompts=n_prompts, n_heldout_samples=int(s.size),
                                    calibration_coverage=None, calibration_lower_bound=None,
                                    note="needs at least 2 prompts (one to calibrate, one to check)", **common)
    cal_mask, cal_draw = calibration_split(pidx, calibration_fraction=calibration_fraction, seed=seed)
    held = ~cal_mask
    if method == "betting":
        return _betting_abstention(s, y, pidx, n_prompts, cal_mask, thresholds, target_precision, delta, seed,
                                   common, randomize=bool(randomize))
    found = abstention_threshold(s[cal_draw], y[cal_draw], target_precision=target_precision, delta=delta,
                                 grid=thresholds)
    n_cal = int(cal_draw.sum())
    n_held_prompts = n_prompts - n_cal  # cal_draw holds exactly one sample per calibration prompt
    common["n_calibration_samples"] = n_cal
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


def _betting_abstention(s: np.ndarray, y: np.ndarray, pidx: np.ndarray, n_prompts: int, cal_mask: np.ndarray,
                        thresholds: np.ndarray, target: float, delta: float, seed: int,
                        common: dict[str, Any], *, randomize: bool) -> CalibratedAbstention:
    """``method="betting"`` of :func:`calibrated_abstention` after the split (``cal_mask`` [N] over samples)."""
    answered, answered_correct = prompt_threshold_counts(s, y, pidx, n_prompts=n_prompts, grid=thresholds)  # [P, G]
    sizes = np.bincount(pidx, minlength=n_prompts)
    scale = float(sizes.max())  # M: the sampling budget per prompt
    x = (answered_correct - target * answered) / scale + target  # [P, G] in [0, 1]
    is_cal = np.zeros(n_prompts, dtype=bool)
    is_cal[pidx[cal_mask]] = True
    cal_prompts = np.flatnonzero(is_cal)
    order = cal_prompts[np.random.default_rng((int(seed), 1)).permutation(cal_prompts.size)]  # the betting order
    n_cal, held = int(cal_prompts.size), ~cal_mask
    n_cal_samples = int(sizes[cal_prompts].sum())
    u = 1.0 - float(np.random.default_rng((int(seed), 2)).random()) if randomize else None  # in (0, 1]
    p_values = betting_p_value(x[order], null_mean=target, delta=delta, u=u)  # [G]
    start = sequence_start(x[~is_cal], null_mean=target, n_calibration=n_cal, delta=delta)
    g = fixed_sequence(p_values, start=start, delta=delta)
    common.update(n_calibration_prompts=n_cal, n_heldout_prompts=n_prompts - n_cal,
                  n_heldout_samples=int(held.sum()), n_calibration_samples=n_cal_samples,
                  start_threshold=float(thresholds[start]), randomized=randomize, randomization_u=u)
    if randomize:
        common["method"] = common["method"] + RANDOMIZED_SUFFIX
    if g is None:
        return CalibratedAbstention(
            threshold=None, coverage=0.0, precision_heldout=None, calibration_coverage=None,
            calibration_lower_bound=None, calibration_p_value=float(p_values[start]),
            note=(f"the betting test does not certify precision >= {target:g} at level {delta:g} at the start "
                  f"threshold {thresholds[start]:g} (chosen on the held-out prompts), so none of the "
                  f"{thresholds.size} grid thresholds is certified on {n_cal} calibration prompts "
                  f"({n_cal_samples} samples); more prompts or a lower target may help"), **common)
    t = float(thresholds[g])
    answered_held = held & (s >= t)
    n_answered = int(answered_held.sum())
    p_det = float(betting_p_value(x[order][:, [g]], null_mean=target, delta=delta)[0]) if randomize else None
    notes = [] if n_answered else ["the threshold answers no held-out sample"]
    if p_det is not None and p_det > delta:
        notes.append(f"certified by the randomized rule (u = {u:.3g}; without it the p-value is {p_det:.3g} > "
                     f"{delta:g}): valid at level {delta:g}, but a certificate this close to the level is wrong more "
                     "often than a clear one (randomize=False certifies only clear ones)")
    bound = _betting_precision_bound(answered[order, g], answered_correct[order, g], scale=scale, target=target,
                                     delta=delta, u=u)
    return CalibratedAbstention(
        threshold=t, coverage=float(n_answered / max(int(held.sum()), 1)),
        precision_heldout=float(y[answered_held].mean()) if n_answered else None,
        calibration_coverage=float(answered[cal_prompts, g].sum() / n_cal_samples), calibration_lower_bound=bound,
        calibration_p_value=float(p_values[g]), calibration_p_value_deterministic=p_det,
        note="; ".join(notes) or None, **common)
