"""Abstention threshold with a finite-sample precision guarantee (calibrl.metrics.abstention_threshold,
calibrated_abstention): hand-worked cases, agreement with scipy's exact binomial interval, and simulations
checking that the guarantee holds in at least 1 - delta of repetitions without needlessly small coverage."""

import math

import numpy as np
import pytest
from scipy.stats import binomtest

import calibrl.metrics as M


def _tolerance(rate: float, reps: int) -> float:
    """Three binomial standard deviations of a failure count over ``reps`` repetitions with probability rate."""
    return 3.0 * math.sqrt(rate * (1.0 - rate) * reps)


# ------------------------------------------------------------------------------------------ the bound
@pytest.mark.parametrize("k,n,delta", [(0, 10, 0.05), (7, 10, 0.05), (10, 10, 0.1), (93, 100, 0.01), (1, 1, 0.3)])
def test_clopper_pearson_matches_scipy_exact_interval(k, n, delta):
    ours = float(M.clopper_pearson_lower(k, n, delta=delta))
    ref = binomtest(k, n, alternative="greater").proportion_ci(confidence_level=1 - delta, method="exact").low
    assert ours == pytest.approx(ref, abs=1e-12)


def test_clopper_pearson_hand_worked_and_edges():
    # k = n: P(Bin(n, q) >= n) = q^n = delta  ->  q = delta^(1/n)
    assert float(M.clopper_pearson_lower(5, 5, delta=0.05)) == pytest.approx(0.05 ** (1 / 5))
    bounds = M.clopper_pearson_lower(np.array([0, 3]), np.array([0, 3]), delta=0.05)
    assert np.isnan(bounds[0]) and bounds[1] == pytest.approx(0.05 ** (1 / 3))
    with pytest.raises(ValueError, match="delta"):
        M.clopper_pearson_lower(1, 2, delta=1.5)
    with pytest.raises(ValueError, match="n_correct"):
        M.clopper_pearson_lower(3, 2, delta=0.1)


# ------------------------------------------------------------------------------------ hand-worked cases
def test_single_threshold_hand_worked():
    conf = np.array([0.9, 0.8, 0.7, 0.6, 0.55, 0.2, 0.1])
    correct = np.array([1, 1, 1, 1, 1, 0, 0], dtype=bool)
    # grid [0.5]: 5 answered, all right; bound 0.05^(1/5) = 0.549 (one threshold: no Bonferroni factor)
    found = M.abstention_threshold(conf, correct, target_precision=0.5, delta=0.05, grid=[0.5])
    assert found.threshold == 0.5 and found.n_answered.tolist() == [5] and found.n_correct.tolist() == [5]
    assert found.lower_bound[0] == pytest.approx(0.5493, abs=1e-4)
    assert M.abstention_threshold(conf, correct, target_precision=0.6, delta=0.05, grid=[0.5]).threshold is None
    # two thresholds: Bonferroni halves delta: 0.025^(1/5) = 0.478 < 0.5, so 0.5 no longer qualifies
    two = M.abstention_threshold(conf, correct, target_precision=0.5, delta=0.05, grid=[0.5, 0.95])
    assert two.threshold is None and two.lower_bound[0] == pytest.approx(0.025 ** (1 / 5))
    assert np.isnan(two.lower_bound[1]) and two.n_answered[1] == 0  # nothing answered at 0.95


def test_no_threshold_qualifies():
    rng = np.random.default_rng(0)
    conf = rng.random(400)
    wrong = np.zeros(400, dtype=bool)
    found = M.abstention_threshold(conf, wrong, target_precision=0.5, delta=0.1)
    assert found.threshold is None and found.index is None and not found.qualifies.any()
    res = M.calibrated_abstention(conf, wrong, np.arange(400), target_precision=0.5, delta=0.1)
    assert res.threshold is None and res.coverage == 0.0 and res.precision_heldout is None
    assert "none of the 101 grid thresholds" in res.note
    assert res.to_dict()["threshold"] is None


def test_perfectly_separating_confidence():
    # every prompt has one right answer at confidence 0.9 and one wrong at 0.1
    n_prompts = 2000
    pids = np.repeat(np.arange(n_prompts), 2)
    correct = np.tile([True, False], n_prompts)
    conf = np.where(correct, 0.9, 0.1)
    found = M.abstention_threshold(conf, correct, target_precision=0.95, delta=0.05)
    # every grid threshold in (0.1, 0.9] answers exactly the 2000 right ones: the lowest is 0.11
    assert found.threshold == pytest.approx(0.11)
    assert found.lower_bound[found.index] == pytest.approx((0.05 / 101) ** (1 / 2000))
    res = M.calibrated_abstention(conf, correct, pids, target_precision=0.95, delta=0.05, seed=3)
    assert res.threshold == pytest.approx(0.11)
    assert res.coverage == pytest.approx(0.5) and res.precision_heldout == 1.0
    assert res.n_calibration_prompts == 1000 and res.n_heldout_prompts == 1000 and res.n_heldout_samples == 2000


def test_split_is_by_prompt_and_deterministic():
    rng = np.random.default_rng(1)
    pids = rng.permutation(np.repeat(np.arange(50), 6))
    cal, draw = M.calibration_split(pids, calibration_fraction=0.5, seed=7)
    # whole prompts on one side, one sample drawn per calibration prompt
    for p in range(50):
        assert cal[pids == p].all() or not cal[pids == p].any()
    assert np.unique(pids[cal]).size == 25 and draw.sum() == 25 and np.unique(pids[draw]).size == 25
    assert not (draw & ~cal).any()
    again = M.calibration_split(pids, calibration_fraction=0.5, seed=7)
    assert np.array_equal(cal, again[0]) and np.array_equal(draw, again[1])
    # which prompts calibrate does not depend on the row order
    order = rng.permutation(pids.size)
    cal_shuffled, _ = M.calibration_split(pids[order], calibration_fraction=0.5, seed=7)
    assert set(pids[order][cal_shuffled].tolist()) == set(pids[cal].tolist())
    with pytest.raises(ValueError, match="calibration_fraction"):
        M.calibration_split(pids, calibration_fraction=1.0)
    # a tiny fraction still leaves one calibration prompt and at least one held out
    tiny, tiny_draw = M.calibration_split(pids, calibration_fraction=0.001, seed=7)
    assert np.unique(pids[tiny]).size == 1 and tiny_draw.sum() == 1


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="target_precision"):
        M.abstention_threshold([0.5], [True], target_precision=1.0, delta=0.1)
    with pytest.raises(ValueError, match="delta"):
        M.calibrated_abstention([0.5], [True], [0], target_precision=0.9, delta=0.0)
    with pytest.raises(ValueError, match="grid"):
        M.abstention_threshold([0.5], [True], target_precision=0.9, delta=0.1, grid=[0.5, 0.2])
    one_prompt = M.calibrated_abstention([0.5, 0.6], [True, True], [0, 0], target_precision=0.9, delta=0.1)
    assert one_prompt.threshold is None and "2 prompts" in one_prompt.note


# ----------------------------------------------------------------------------------------- simulations
def test_guarantee_holds_by_simulation_iid():
    """Perfectly calibrated confidence: conf ~ U(0, 1), correct ~ Bernoulli(conf), so the population precision
    of ``conf >= t`` is (1 + t) / 2 and the oracle threshold for 0.8 is t = 0.6 (coverage 0.4)."""
    target, delta, n, reps = 0.8, 0.1, 2000, 400
    rng = np.random.default_rng(0)
    conf = rng.random((reps, n))
    correct = rng.random((reps, n)) < conf
    chosen = np.array([M.abstention_threshold(conf[r], correct[r], target_precision=target, delta=delta).threshold
                       for r in range(reps)], dtype=object)
    found = np.array([t is not None for t in chosen])
    t = np.array([np.nan if c is None else c for c in chosen], dtype=float)
    violations = int(np.sum(found & ((1 + t) / 2 < target - 1e-12)))
    assert violations <= delta * reps + _tolerance(delta, reps)
    # not needlessly small: a threshold is found nearly always, and coverage 1 - t is at least 60% of the
    # oracle's 0.4 on average (Bonferroni over 101 thresholds costs some; 2000 samples)
    assert found.mean() >= 0.95
    assert np.nanmean(1 - t) >= 0.6 * 0.4


def test_single_threshold_error_rate_is_delta_when_precision_is_just_below_target():
    """One threshold (no multiplicity): when its population precision is 0.88 < 0.9, it may qualify in at most
    delta of repetitions (exact test), and it does qualify sometimes (the bound is not vacuous)."""
    target, delta, n, reps = 0.9, 0.2, 400, 2000
    rng = np.random.default_rng(1)
    correct = rng.random((reps, n)) < 0.88
    conf = np.full(n, 0.7)
    accepted = sum(M.abstention_threshold(conf, correct[r], target_precision=target, delta=delta,
                                          grid=[0.5]).threshold is not None for r in range(reps))
    assert accepted <= delta * reps + _tolerance(delta, reps)
    assert accepted >= 0.01 * reps


def _clustered_prompts(rng, n_prompts, k):
    """Prompts of varied difficulty q_p ~ Beta(2, 1); each of the k samples is right with probability q_p and its
    confidence is sigmoid(2 logit(q_p) + 1.5 (correct - 1/2) + noise): samples of a prompt are correlated."""
    q = rng.beta(2.0, 1.0, n_prompts)
    pids = np.repeat(np.arange(n_prompts), k)
    qs = q[pids]
    correct = rng.random(qs.size) < qs
    logit = np.log(qs / (1 - qs))
    conf = 1 / (1 + np.exp(-(2 * logit + 1.5 * (correct - 0.5) + rng.normal(0, 0.7, qs.size))))
    return conf, correct, pids


def test_guarantee_holds_by_simulation_prompt_level():
    target, delta, reps, n_prompts, k = 0.85, 0.1, 150, 1200, 8
    rng = np.random.default_rng(2)
    # population precision and coverage at every grid threshold, from one large fresh draw
    conf, correct, _ = _clustered_prompts(rng, 200_000, 1)
    pop = M.abstention_threshold(conf, correct, target_precision=target, delta=delta)
    pop_precision = pop.n_correct / np.maximum(pop.n_answered, 1)
    pop_coverage = pop.n_answered / conf.size
    oracle = int(np.flatnonzero(pop_precision >= target)[0])  # lowest grid threshold meeting the target
    violations, coverages = 0, []
    for r in range(reps):
        c, y, p = _clustered_prompts(rng, n_prompts, k)
        res = M.calibrated_abstention(c, y, p, target_precision=target, delta=delta, seed=r)
        if res.threshold is None:
            coverages.append(0.0)
            continue
        g = int(np.argmin(np.abs(M.DEFAULT_THRESHOLD_GRID - res.threshold)))
        violations += bool(pop_precision[g] < target - 0.002)  # 0.002: Monte-Carlo error of the population draw
        coverages.append(pop_coverage[g])
    assert violations <= delta * reps + _tolerance(delta, reps)
    # 600 calibration prompts, one sample each: the mean coverage keeps at least 60% of the oracle's (0.70)
    assert np.mean(coverages) >= 0.6 * pop_coverage[oracle]


def test_prompt_is_the_unit_where_counting_every_sample_would_break_the_guarantee():
    """Every sample of a prompt is right or every one is wrong (a prompt is solved or not), with probability
    0.895 < 0.9 = target. Counting the 8 samples of each of 400 prompts as 3200 independent trials makes the bound
    far too narrow and accepts the threshold much more often than delta; calibrated_abstention (one sample per
    calibration prompt) stays within delta."""
    target, delta, reps, n_prompts, k = 0.9, 0.1, 400, 400, 8
    rng = np.random.default_rng(5)
    pids = np.repeat(np.arange(n_prompts), k)
    conf = np.full(pids.size, 0.7)
    naive = per_prompt = 0
    for r in range(reps):
        y = (rng.random(n_prompts) < 0.895)[pids]
        naive += M.abstention_threshold(conf, y, target_precision=target, delta=delta, grid=[0.5]).threshold is not None
        per_prompt += M.calibrated_abstention(conf, y, pids, target_precision=target, delta=delta, grid=[0.5],
                                              seed=r).threshold is not None
    assert per_prompt <= delta * reps + _tolerance(delta, reps)
    assert naive > delta * reps + _tolerance(delta, reps)
