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
    res = M.calibrated_abstention(conf, wrong, np.arange(400), target_precision=0.5, delta=0.1, method="bonferroni")
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
    res = M.calibrated_abstention(conf, correct, pids, target_precision=0.95, delta=0.05, seed=3,
                                  method="bonferroni")
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


def _clustered_population(rng, *, target: float, delta: float):
    """(precision [G], coverage [G], oracle index) of the clustered population at every grid threshold, from one
    large fresh draw; the oracle is the lowest grid threshold meeting ``target``."""
    conf, correct, _ = _clustered_prompts(rng, 200_000, 1)
    pop = M.abstention_threshold(conf, correct, target_precision=target, delta=delta)
    precision = pop.n_correct / np.maximum(pop.n_answered, 1)
    return precision, pop.n_answered / conf.size, int(np.flatnonzero(precision >= target)[0])


def test_guarantee_holds_by_simulation_prompt_level():
    target, delta, reps, n_prompts, k = 0.85, 0.1, 150, 1200, 8
    rng = np.random.default_rng(2)
    pop_precision, pop_coverage, oracle = _clustered_population(rng, target=target, delta=delta)
    violations, coverages = 0, []
    for r in range(reps):
        c, y, p = _clustered_prompts(rng, n_prompts, k)
        res = M.calibrated_abstention(c, y, p, target_precision=target, delta=delta, seed=r, method="bonferroni")
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
                                              seed=r, method="bonferroni").threshold is not None
    assert per_prompt <= delta * reps + _tolerance(delta, reps)
    assert naive > delta * reps + _tolerance(delta, reps)


# ------------------------------------------------- method="betting": every sample, prompt-level betting test
def test_betting_p_value_hand_worked():
    # x = [1, 1], m = 0.5, delta = 0.1, cap 0.99: lambda_1 = min(sqrt(2 ln 10 / (2 * 1/4)), 0.99 / 0.5) = 1.98,
    # K_1 = 1 + 1.98 * 0.5 = 1.99; mu_1 = (1/2 + 1) / 2 = 0.75, sigma2_1 = (1/4 + 0.25^2) / 2 = 0.15625,
    # lambda_2 = min(sqrt(2 ln 10 / (2 * 0.15625)) = 3.84, 1.98) = 1.98, K_2 = 1.99^2: p = 1 / 3.9601
    assert float(M.betting_p_value([1.0, 1.0], null_mean=0.5, delta=0.1)) == pytest.approx(1 / 1.99**2)
    # one term: lambda_1 = min(sqrt(2 ln 10 / (1/4)) = 4.29, 1.98) = 1.98 and K_1 = 1 + 1.98 * 0.3
    assert float(M.betting_p_value([0.8], null_mean=0.5, delta=0.1)) == pytest.approx(1 / (1 + 1.98 * 0.3))
    # terms at the null mean never win: p = 1; nothing observed: p = 1
    assert float(M.betting_p_value(np.full(50, 0.9), null_mean=0.9, delta=0.1)) == 1.0
    assert M.betting_p_value(np.zeros((0, 3)), null_mean=0.9, delta=0.1).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="x must lie in"):
        M.betting_p_value([1.2], null_mean=0.5, delta=0.1)


def test_randomized_betting_p_value_hand_worked_and_valid():
    # x = [1, 0.5], m = 0.5, delta = 0.1: K_1 = 1.99; lambda_2 = 1.98 (cap), K_2 = 1.99 * (1 + 0) = 1.99
    # deterministic p = 1 / 1.99; randomized with u = 0.3: min(1 / 1.99, 0.3 / 1.99)
    assert float(M.betting_p_value([1.0, 0.5], null_mean=0.5, delta=0.1, u=0.3)) == pytest.approx(0.3 / 1.99)
    # the final capital counts even when it is below the running maximum: x = [1, 0] gives K = 1.99, 1.99 * 0.01
    assert float(M.betting_p_value([1.0, 0.0], null_mean=0.5, delta=0.1, u=0.001)) == pytest.approx(
        min(1 / 1.99, 0.001 / (1.99 * 0.01)))
    with pytest.raises(ValueError, match="u must lie"):
        M.betting_p_value([0.5], null_mean=0.5, delta=0.1, u=0.0)
    # at the null mean (terms 0 or 1 with mean exactly m), the rejection rate at delta stays <= delta and is close to
    # it (the rule spends the level that Ville's inequality leaves unused), while the deterministic one is far below
    rng = np.random.default_rng(12)
    m, delta, n, reps = 0.9, 0.1, 60, 2000
    x = (rng.random((n, reps)) < m).astype(float)
    u = 1.0 - rng.random(reps)
    rand = np.array([M.betting_p_value(x[:, j], null_mean=m, delta=delta, u=u[j]) for j in range(reps)]) <= delta
    det = M.betting_p_value(x, null_mean=m, delta=delta) <= delta
    assert rand.mean() <= delta + 3 * math.sqrt(delta * (1 - delta) / reps)
    assert rand.mean() > det.mean()


def test_betting_p_value_matches_a_plain_loop():
    rng = np.random.default_rng(3)
    x = rng.beta(5, 1, size=(40, 3))
    m, delta, n = 0.7, 0.05, 40
    ours = M.betting_p_value(x, null_mean=m, delta=delta)
    for col in range(3):
        total, sq, log_k, best, sigma2 = 0.5, 0.25, 0.0, 0.0, 0.25
        for i, xi in enumerate(x[:, col], start=1):
            lam = min(math.sqrt(2 * math.log(1 / delta) / (n * sigma2)), 0.99 / m)
            log_k += math.log(1 + lam * (xi - m))
            best = max(best, log_k)
            total += xi
            sq += (xi - total / (i + 1)) ** 2
            sigma2 = sq / (i + 1)
        assert ours[col] == pytest.approx(math.exp(-best))


def test_betting_p_value_survives_rare_catastrophes_where_a_normal_test_does_not():
    """Mean just below the null value 0.9: each term is 0.905 except a rare 0 (probability 0.0056). Most samples of
    200 terms show no 0 at all, so a one-sided z-test rejects far more often than delta; the betting p-value,
    whose bet is capped by the range, rejects at most delta of the time."""
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    m, n, reps, delta = 0.9, 200, 400, 0.1
    assert 0.905 * (1 - 0.0056) < m
    betting = z_test = 0
    for _ in range(reps):
        x = np.where(rng.random(n) < 0.0056, 0.0, 0.905)
        betting += bool(M.betting_p_value(x, null_mean=m, delta=delta) <= delta)
        z_test += bool((x.mean() - m) / max(x.std(ddof=1) / math.sqrt(n), 1e-12) > norm.ppf(1 - delta))
    assert betting <= delta * reps + _tolerance(delta, reps)
    assert z_test > delta * reps + _tolerance(delta, reps)


def test_fixed_sequence_and_start_hand_worked():
    p = [0.5, 0.01, 0.2, 0.05, 0.01]
    assert M.fixed_sequence(p, start=4, delta=0.1) == 3  # 4 and 3 pass, 2 fails: stop
    assert M.fixed_sequence(p, start=2, delta=0.1) is None
    assert M.fixed_sequence(p, start=1, delta=0.1) == 1
    assert M.fixed_sequence(p, start=3, delta=0.01) is None
    with pytest.raises(ValueError, match="start"):
        M.fixed_sequence(p, start=5, delta=0.1)
    # held-out terms at 3 thresholds, null mean 0.5: column 0 below it, column 1 above it with spread,
    # column 2 constant above it: with n = 100 calibration prompts its log-capital 100 log(1 + 1.98 * 0.1) >= ln 10
    x = np.array([[0.4, 0.9, 0.6], [0.45, 0.5, 0.6], [0.4, 0.8, 0.6]])
    assert M.sequence_start(x, null_mean=0.5, n_calibration=100, delta=0.1) == 2
    assert M.sequence_start(x[:, :2], null_mean=0.5, n_calibration=100, delta=0.1) == 1
    # too few calibration prompts for the constant column to pass: the column with spread wins
    assert M.sequence_start(x, null_mean=0.5, n_calibration=2, delta=0.1) == 1


def test_prompt_threshold_counts_match_a_loop():
    rng = np.random.default_rng(4)
    conf, y, pids = rng.random(300), rng.random(300) < 0.6, rng.integers(0, 20, 300)
    grid = np.array([0.0, 0.25, 0.5, 0.51, 0.9])
    answered, correct = M.prompt_threshold_counts(conf, y, pids, n_prompts=20, grid=grid)
    for i in range(20):
        for g, t in enumerate(grid):
            mask = (pids == i) & (conf >= t)
            assert answered[i, g] == mask.sum() and correct[i, g] == (mask & y).sum()


def test_calibrated_abstention_betting_pipeline_and_fields():
    rng = np.random.default_rng(6)
    n, k, target, delta = 1500, 4, 0.85, 0.1
    pids = rng.permutation(np.repeat(np.arange(n), k))
    conf = rng.random(pids.size)
    y = rng.random(pids.size) < conf
    res = M.calibrated_abstention(conf, y, pids, target_precision=target, delta=delta, seed=5, randomize=True)
    assert res.method_name == "betting" and res.method.startswith(M.ABSTENTION_METHODS["betting"])
    assert res.randomized is True and "randomized Ville" in res.method
    assert res.calibration_fraction == 0.8 and res.n_calibration_prompts == 1200 and res.n_heldout_prompts == 300
    assert res.n_calibration_samples == 4800 and res.n_heldout_samples == 1200
    # the same steps by hand: split, per-prompt terms, start on the held-out prompts, fixed sequence
    cal, _ = M.calibration_split(pids, calibration_fraction=0.8, seed=5)
    answered, correct = M.prompt_threshold_counts(conf, y, pids, n_prompts=n)
    x = (correct - target * answered) / k + target
    is_cal = np.zeros(n, dtype=bool)
    is_cal[pids[cal]] = True
    order = np.flatnonzero(is_cal)[np.random.default_rng((5, 1)).permutation(1200)]
    u = 1.0 - np.random.default_rng((5, 2)).random()  # the randomized rule's draw: seed only, never the data
    assert res.randomization_u == u
    p = M.betting_p_value(x[order], null_mean=target, delta=delta, u=u)
    start = M.sequence_start(x[~is_cal], null_mean=target, n_calibration=1200, delta=delta)
    g = M.fixed_sequence(p, start=start, delta=delta)
    assert g is not None and res.threshold == M.DEFAULT_THRESHOLD_GRID[g]
    assert res.start_threshold == M.DEFAULT_THRESHOLD_GRID[start] and res.calibration_p_value == p[g] <= delta
    held = ~cal & (conf >= res.threshold)
    assert res.coverage == pytest.approx(held.sum() / (~cal).sum())
    assert res.precision_heldout == pytest.approx(y[held].mean())
    assert target <= res.calibration_lower_bound < 1
    assert res.calibration_coverage == pytest.approx(answered[is_cal, g].sum() / 4800)
    with pytest.raises(ValueError, match="method"):
        M.calibrated_abstention(conf, y, pids, target_precision=0.9, delta=0.1, method="holm")
    # randomize=False (the default): the deterministic p-values, the same split and start
    det = M.calibrated_abstention(conf, y, pids, target_precision=target, delta=delta, seed=5)
    p_det = M.betting_p_value(x[order], null_mean=target, delta=delta)
    g_det = M.fixed_sequence(p_det, start=start, delta=delta)
    assert det.randomized is False and det.randomization_u is None and det.method == M.ABSTENTION_METHODS["betting"]
    assert det.threshold == (None if g_det is None else M.DEFAULT_THRESHOLD_GRID[g_det])
    assert np.all(p <= p_det)  # the randomized p-value is never larger
    assert res.calibration_p_value_deterministic == pytest.approx(p_det[g])
    assert ("randomized rule" in (res.note or "")) == bool(p_det[g] > delta)


def _true_threshold_violations(chosen, precision, target, tol):
    """Count of chosen thresholds (None: none chosen) whose true precision on the grid is below the target."""
    grid = M.DEFAULT_THRESHOLD_GRID
    return sum(bool(precision[int(np.argmin(np.abs(grid - t)))] < target - tol) for t in chosen if t is not None)


@pytest.mark.parametrize("case", ["iid", "all-or-nothing"])
def test_betting_guarantee_holds_by_simulation_calibrated(case):
    """(a) every sample independent, (c) all samples of a prompt share one outcome; both perfectly calibrated, so
    the true precision of conf >= t is (1 + t) / 2 (the oracle for 0.8 is t = 0.6, coverage 0.4)."""
    target, delta, reps, n, k = 0.8, 0.2, 120, 600, 4
    rng = np.random.default_rng(7)
    pids = np.repeat(np.arange(n), k)
    chosen = []
    for r in range(reps):
        if case == "iid":
            conf = rng.random(n * k)
            y = rng.random(n * k) < conf
        else:
            u = rng.random(n)
            conf, y = u[pids], (rng.random(n) < u)[pids]
        chosen.append(M.calibrated_abstention(conf, y, pids, target_precision=target, delta=delta, seed=r,
                                              randomize=True).threshold)
        if r % 4 == 0:  # randomize=False certifies a subset: never a lower threshold than the randomized rule
            det = M.calibrated_abstention(conf, y, pids, target_precision=target, delta=delta, seed=r,
                                          randomize=False).threshold
            assert det is None or (chosen[-1] is not None and det >= chosen[-1])
    violations = _true_threshold_violations(chosen, (1 + M.DEFAULT_THRESHOLD_GRID) / 2, target, 1e-12)
    assert violations <= delta * reps + _tolerance(delta, reps)
    coverage = np.mean([0.0 if t is None else 1 - t for t in chosen])
    assert coverage >= 0.5 * 0.4  # and it does certify: half the oracle's coverage at least


def test_betting_guarantee_holds_by_simulation_clustered():
    target, delta, reps, n_prompts, k = 0.85, 0.1, 100, 1200, 8
    rng = np.random.default_rng(8)
    pop_precision, pop_coverage, oracle = _clustered_population(rng, target=target, delta=delta)
    chosen = []
    for r in range(reps):
        c, y, p = _clustered_prompts(rng, n_prompts, k)
        chosen.append(M.calibrated_abstention(c, y, p, target_precision=target, delta=delta, seed=r).threshold)
    assert _true_threshold_violations(chosen, pop_precision, target, 0.002) <= delta * reps + _tolerance(delta, reps)
    grid = M.DEFAULT_THRESHOLD_GRID
    coverage = np.mean([0.0 if t is None else pop_coverage[int(np.argmin(np.abs(grid - t)))] for t in chosen])
    assert coverage >= 0.6 * pop_coverage[oracle]


def test_betting_is_valid_when_prompts_are_solved_all_or_nothing_just_below_target():
    """As for "bonferroni" above: one threshold of population precision 0.895 < 0.9, every sample of a prompt
    right or every one wrong; counting samples as independent would accept often, the betting test at most delta
    of the time."""
    target, delta, reps, n_prompts, k = 0.9, 0.1, 200, 400, 8
    rng = np.random.default_rng(9)
    pids = np.repeat(np.arange(n_prompts), k)
    conf = np.full(pids.size, 0.7)
    accepted = sum(M.calibrated_abstention(conf, (rng.random(n_prompts) < 0.895)[pids], pids, target_precision=target,
                                           delta=delta, grid=[0.5], seed=r).threshold is not None
                   for r in range(reps))
    assert accepted <= delta * reps + _tolerance(delta, reps)


@pytest.mark.parametrize("n_prompts,k", [(600, 4), (2000, 4), (600, 16)])
def test_betting_is_at_least_as_powerful_as_bonferroni_on_calibrated_iid(n_prompts, k):
    target, delta, reps = 0.9, 0.1, 12
    rng = np.random.default_rng(n_prompts + k)
    pids = np.repeat(np.arange(n_prompts), k)
    coverage = {"betting": [], "bonferroni": []}
    for r in range(reps):
        conf = rng.random(pids.size)
        y = rng.random(pids.size) < conf
        for method in coverage:
            t = M.calibrated_abstention(conf, y, pids, target_precision=target, delta=delta, seed=r,
                                        method=method).threshold
            coverage[method].append(0.0 if t is None else 1 - t)  # true coverage of conf >= t
    assert np.mean(coverage["betting"]) >= np.mean(coverage["bonferroni"])
    assert np.mean(coverage["betting"]) > 0  # and it certifies something at these sizes


# ------------------------------------------------------------- studies/abstention_power.py's upper bound
def _power_study():
    from studies import abstention_power

    return abstention_power


def test_upper_bound_null_laws_are_nulls_and_the_projection_maximises_the_growth():
    power = _power_study()
    target, m = 0.9, 4
    for t, t_low in [(0.88, 0.88), (0.86, 0.81)]:
        prob, x, x_low = power.iid_prompt_law(t, t_low, m, target)
        assert prob.sum() == pytest.approx(1.0) and np.all((x >= 0) & (x <= 1))
        # pooled precision of s >= t in the iid case is (1 + t) / 2: E[c - P a] / m = (1 - t)(t - 0.8) / 2
        assert np.sum(prob * (x - target)) == pytest.approx((1 - t) * (t - 0.8) / 2)
        assert np.sum(prob * (x_low - target)) == pytest.approx((1 - t_low) * (t_low - 0.8) / 2)
    values, where = np.unique(np.round(x, 12), return_inverse=True)
    p = np.bincount(where, prob)
    lam = power.kl_projection_bet(p, values, target)
    grid = np.linspace(0, 1 / target, 2001)[:-1]
    growth = [np.sum(p * np.log1p(g * (values - target))) for g in grid]
    assert np.sum(p * np.log1p(lam * (values - target))) >= max(growth) - 1e-9
    for k in (1, m):
        q, a, v = power._null_member(p, values, target, lam / 2, k, m)
        assert q.sum() == pytest.approx(1.0) and np.all(q >= 0) and 0 < a < 1
        assert np.sum(q * values) == pytest.approx(target)  # on the boundary of the null, as the bound needs
