"""calibrl.metrics against scikit-learn, exact combinatorics and hand-worked values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

import calibrl.metrics as M


def _random_data(seed: int = 0, n_prompts: int = 60, ties: bool = True):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 12, n_prompts)  # unequal groups, some of size 1
    pid = np.repeat(rng.permutation(n_prompts) * 7 + 3, sizes)  # non-contiguous, non-dense ids
    perm = rng.permutation(len(pid))
    pid = pid[perm]
    conf = rng.random(len(pid))
    if ties:
        conf = np.round(conf, 1)
    correct = rng.random(len(pid)) < conf
    return conf, correct, pid


# --------------------------------------------------------------------------------------------------- AUROC
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ties", [True, False])
def test_auroc_matches_sklearn(seed, ties):
    conf, correct, _ = _random_data(seed, ties=ties)
    assert M.auroc(conf, correct) == pytest.approx(roc_auc_score(correct, conf), abs=1e-12)


def test_auroc_heavy_ties_and_scale_free():
    rng = np.random.default_rng(1)
    conf = rng.integers(0, 3, 500).astype(float)
    y = rng.random(500) < 0.4 + 0.1 * conf
    assert M.auroc(conf, y) == pytest.approx(roc_auc_score(y, conf), abs=1e-12)
    # log-probabilities (negative scores) work, and AUROC is invariant to monotone maps
    assert M.auroc(np.log(conf + 0.5) - 10, y) == pytest.approx(M.auroc(conf, y), abs=1e-12)


def test_auroc_one_class_is_nan_and_inputs():
    assert math.isnan(M.auroc([0.1, 0.5, 0.9], [1, 1, 1]))
    assert math.isnan(M.auroc([0.1, 0.5], [False, False]))
    # torch tensors, lists and 0/1 ints all accepted; results are Python floats
    t = M.auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
    assert isinstance(t, float) and t == pytest.approx(0.75)
    assert M.auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="0/1"):
        M.auroc([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="same length"):
        M.auroc([0.1, 0.2, 0.3], [0, 1])
    with pytest.raises(ValueError, match="NaN"):
        M.auroc([0.1, float("nan")], [0, 1])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("drop", [True, False])
def test_roc_curve_is_sklearn(seed, drop):
    conf, correct, _ = _random_data(seed, ties=bool(seed % 2))
    if seed == 2:  # integer-valued scores with long runs of ties, and collinear stretches for drop_intermediate
        conf = np.floor(conf * 4) - 7.0
    fpr, tpr, thr = M.roc_curve(conf, correct, drop_intermediate=drop)
    efpr, etpr, ethr = sk_roc_curve(correct, conf, drop_intermediate=drop)
    np.testing.assert_array_equal(fpr, efpr)
    np.testing.assert_array_equal(tpr, etpr)
    np.testing.assert_array_equal(thr, ethr)
    assert thr.dtype == ethr.dtype


def test_roc_curve_by_hand_and_with_one_class():
    # scores 3, 2, 2, 1 with outcomes right, right, wrong, wrong: (0, 0) at +inf, (0, 1/2) at 3, (1/2, 1) at 2,
    # (1, 1) at 1; no point is collinear with its neighbours
    fpr, tpr, thr = M.roc_curve([3, 2, 2, 1], [1, 1, 0, 0])
    np.testing.assert_array_equal(fpr, [0, 0, 0.5, 1])
    np.testing.assert_array_equal(tpr, [0, 0.5, 1, 1])
    np.testing.assert_array_equal(thr, [np.inf, 3, 2, 1])
    fpr, tpr, _ = M.roc_curve([0.3, 0.2], [1, 1])  # no wrong sample: fpr undefined (sklearn warns, gives nan)
    assert np.isnan(fpr).all() and tpr[-1] == 1.0


@pytest.mark.parametrize("seed", range(4))
def test_per_prompt_auroc_equals_loop_of_sklearn(seed):
    conf, correct, pid = _random_data(seed, ties=bool(seed % 2))
    expected = []
    for p in np.unique(pid):
        sel = pid == p
        if correct[sel].any() and not correct[sel].all():
            expected.append(roc_auc_score(correct[sel], conf[sel]))
    res = M.per_prompt_auroc(conf, correct, pid)
    assert isinstance(res, M.PerPromptAUROC)
    assert res.n_prompts == len(expected) > 5
    assert res.mean == pytest.approx(np.mean(expected), abs=1e-12)
    res2, values = M.per_prompt_auroc(conf, correct, pid, return_values=True)
    assert res2 == res and values.shape == (len(np.unique(pid)),)
    np.testing.assert_allclose(np.sort(values[~np.isnan(values)]), np.sort(expected), atol=1e-12)


def test_per_prompt_auroc_string_ids_and_no_mixed_prompt():
    conf = [0.9, 0.1, 0.5, 0.5, 0.2, 0.7]
    correct = [1, 0, 1, 0, 1, 1]
    pid = ["a", "a", "b", "b", "c", "c"]
    res = M.per_prompt_auroc(conf, correct, pid)
    # a: 1.0; b: tie -> 0.5; c: one class -> excluded
    assert res.n_prompts == 2 and res.mean == pytest.approx(0.75)
    none = M.per_prompt_auroc([0.1, 0.2], [1, 1], [0, 1])
    assert none.n_prompts == 0 and math.isnan(none.mean)


# ---------------------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_reliability_bins_match_sklearn_calibration_curve(seed, strategy):
    conf, correct, _ = _random_data(seed, ties=True)  # ties: values exactly on the edges 0.1, 0.2, ...
    rb = M.reliability_bins(conf, correct, n_bins=10, strategy=strategy)
    prob_true, prob_pred = calibration_curve(correct, conf, n_bins=10, strategy=strategy)
    nz = rb.counts > 0
    np.testing.assert_allclose(rb.accuracy[nz], prob_true, atol=1e-12)
    np.testing.assert_allclose(rb.mean_confidence[nz], prob_pred, atol=1e-12)
    assert rb.counts.sum() == len(conf)
    # empty bins: count 0 and nan
    assert np.isnan(rb.accuracy[~nz]).all() and np.isnan(rb.mean_confidence[~nz]).all()


def _sklearn_bin_ids(conf, n_bins, strategy):
    # the bin assignment inside sklearn.calibration.calibration_curve
    conf = np.asarray(conf, dtype=float)
    if strategy == "quantile":
        bins = np.percentile(conf, np.linspace(0, 1, n_bins + 1) * 100)
    else:
        bins = np.linspace(0.0, 1.0, n_bins + 1)
    return np.bincount(np.searchsorted(bins[1:-1], conf), minlength=n_bins)


def test_quantile_edges_tied_values_land_in_sklearn_bins():
    # percentile at linspace(0, 100, 4)[1] = 33.333333333333336 interpolates to 0.4000000000000001 and moves the
    # three tied 0.4s into the first bin; sklearn's linspace(0, 1, 4) * 100 gives exactly 0.4 -> second bin.
    s = [0, 0.1, 0.1, 0.2, 0.4, 0.4, 0.4, 0.5, 0.5, 0.6, 0.7, 0.7, 1.0]
    y = [0, 0, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    rb = M.reliability_bins(s, y, n_bins=3, strategy="quantile")
    np.testing.assert_array_equal(rb.counts, _sklearn_bin_ids(s, 3, "quantile"))
    prob_true, prob_pred = calibration_curve(y, s, n_bins=3, strategy="quantile")
    nz = rb.counts > 0
    np.testing.assert_allclose(rb.accuracy[nz], prob_true, atol=1e-12)
    np.testing.assert_allclose(rb.mean_confidence[nz], prob_pred, atol=1e-12)


def test_quantile_bins_match_sklearn_on_many_rounded_cases():
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(2, 40))
        s = np.round(rng.random(n), int(rng.integers(1, 3)))
        y = (rng.random(n) < s).astype(int)
        if len(np.unique(y)) < 2:
            y[0] = 1 - y[0]
        b = int(rng.integers(2, 12))
        rb = M.reliability_bins(s, y, n_bins=b, strategy="quantile")
        np.testing.assert_array_equal(rb.counts, _sklearn_bin_ids(s, b, "quantile"))
        prob_true, prob_pred = calibration_curve(y, s, n_bins=b, strategy="quantile")
        nz = rb.counts > 0
        np.testing.assert_allclose(rb.accuracy[nz], prob_true, atol=1e-12)
        np.testing.assert_allclose(rb.mean_confidence[nz], prob_pred, atol=1e-12)


def test_reliability_bins_empty_bins_reported():
    rb = M.reliability_bins([0.05, 0.95], [0, 1], n_bins=4)
    np.testing.assert_array_equal(rb.counts, [1, 0, 0, 1])
    np.testing.assert_allclose(rb.edges, [0, 0.25, 0.5, 0.75, 1.0])
    assert np.isnan(rb.accuracy[1]) and np.isnan(rb.mean_confidence[2])
    assert rb.ece == pytest.approx(0.05)


def test_ece_uniform_hand_worked():
    # n_bins=2 -> edges [0, 0.5, 1]; bins are [0, 0.5] and (0.5, 1] (0.5 sits in the FIRST bin, as in sklearn).
    # bin 0: conf {0.2, 0.5}, correct {0, 1}: mean conf 0.35, acc 0.5, |gap| 0.15, weight 2/4 -> 0.075
    # bin 1: conf {0.7, 0.9}, correct {1, 0}: mean conf 0.80, acc 0.5, |gap| 0.30, weight 2/4 -> 0.150
    # ECE = 0.225, MCE = 0.30
    conf, correct = [0.2, 0.5, 0.7, 0.9], [0, 1, 1, 0]
    assert M.ece(conf, correct, n_bins=2) == pytest.approx(0.225)
    assert M.mce(conf, correct, n_bins=2) == pytest.approx(0.30)
    rb = M.reliability_bins(conf, correct, n_bins=2)
    np.testing.assert_array_equal(rb.counts, [2, 2])
    np.testing.assert_allclose(rb.mean_confidence, [0.35, 0.8])


def test_ece_quantile_hand_worked():
    # 5 samples, n_bins=2 -> edges = percentiles 0/50/100 of conf = [0.1, 0.6, 0.95]
    # bin 0 [0.1, 0.6]: conf {0.1, 0.2, 0.6}, correct {0, 1, 0}: conf 0.3, acc 1/3, |gap| 1/30, weight 3/5 -> 0.02
    # bin 1 (0.6, 0.95]: conf {0.9, 0.95}, correct {1, 1}: conf 0.925, acc 1, |gap| 0.075, weight 2/5 -> 0.03
    # ECE = 0.05
    conf, correct = [0.9, 0.1, 0.6, 0.2, 0.95], [1, 0, 0, 1, 1]
    assert M.ece(conf, correct, n_bins=2, strategy="quantile") == pytest.approx(0.05)
    np.testing.assert_allclose(M.bin_edges(conf, n_bins=2, strategy="quantile"), [0.1, 0.6, 0.95])
    # 4 samples: the median is interpolated, 0.45 -> bins {0.1, 0.3} and {0.6, 0.8}
    # gaps |0 - 0.2| and |1 - 0.7|, weights 1/2 each -> ECE = 0.25; uniform with 2 bins gives the same bins here
    conf, correct = [0.1, 0.3, 0.6, 0.8], [0, 0, 1, 1]
    assert M.ece(conf, correct, n_bins=2, strategy="quantile") == pytest.approx(0.25)
    assert M.ece(conf, correct, n_bins=2) == pytest.approx(0.25)


def test_ece_perfectly_calibrated_and_errors():
    rng = np.random.default_rng(0)
    p = rng.random(200_000)
    y = rng.random(200_000) < p
    assert M.ece(p, y) < 0.01
    assert M.ece(np.ones(10), np.zeros(10)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        M.ece([-0.5, 0.2], [0, 1])
    # float32 softmax round-off just above 1 is clipped, not an error
    assert M.ece(np.float32([1.0000001, 0.2]), [1, 0]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="strategy"):
        M.ece([0.5, 0.2], [0, 1], strategy="equal")
    with pytest.raises(ValueError, match="n_bins"):
        M.ece([0.5, 0.2], [0, 1], n_bins=0)


def test_brier_and_nll_match_sklearn():
    conf, correct, _ = _random_data(2, ties=False)
    assert M.brier(conf, correct) == pytest.approx(brier_score_loss(correct, conf), abs=1e-12)
    assert M.nll(conf, correct) == pytest.approx(log_loss(correct, conf), abs=1e-9)
    assert np.isfinite(M.nll([0.0, 1.0], [1, 0]))  # clipped, not inf


def test_top_label():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.5, 0.4, 0.1]])
    conf, correct = M.top_label(probs, [0, 1, 0])
    np.testing.assert_allclose(conf, [0.7, 0.6, 0.5])
    np.testing.assert_array_equal(correct, [True, False, True])
    conf_t, _ = M.top_label(torch.tensor(probs), torch.tensor([0, 1, 0]))
    np.testing.assert_allclose(conf_t, conf)
    with pytest.raises(ValueError, match="labels"):
        M.top_label(probs, [0, 3, 0])


# ---------------------------------------------------------------------------------------------- accuracy
def test_mean_at_k_weights_prompts_equally():
    # prompt 0: 1/2 correct, prompt 1: 4/4 correct -> mean@k = (0.5 + 1) / 2, not 5/6
    assert M.mean_at_k([1, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]) == pytest.approx(0.75)
    conf, correct, pid = _random_data(0)
    per = [correct[pid == p].mean() for p in np.unique(pid)]
    assert M.mean_at_k(correct, pid) == pytest.approx(np.mean(per))


def _brute_force_pass_at_k(outcomes, k):
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_exact_and_brute_force():
    rng = np.random.default_rng(0)
    ns = rng.integers(1, 9, 40)
    pid = np.repeat(np.arange(40), ns)
    correct = rng.random(len(pid)) < rng.random(len(pid))
    for k in (1, 2, 3):
        keep = np.isin(pid, np.flatnonzero(ns >= k))
        y, g = correct[keep], pid[keep]
        exact, brute = [], []
        for p in np.unique(g):
            out = y[g == p]
            n, c = len(out), int(out.sum())
            exact.append(1 - math.comb(n - c, k) / math.comb(n, k))
            brute.append(_brute_force_pass_at_k(list(out), k))
        got = M.pass_at_k(y, g, k)
        assert got == pytest.approx(np.mean(exact), abs=1e-12)
        assert got == pytest.approx(np.mean(brute), abs=1e-12)
    # pass@1 is mean@k
    assert M.pass_at_k(correct, pid, 1) == pytest.approx(M.mean_at_k(correct, pid))


def test_pass_at_k_large_n_stable_and_errors():
    # n = 1000, c = 3, k = 100: 1 - C(997,100)/C(1000,100), exact rational arithmetic as reference
    y = np.zeros(1000, bool)
    y[:3] = True
    ref = 1 - math.comb(997, 100) / math.comb(1000, 100)
    assert M.pass_at_k(y, np.zeros(1000, int), 100) == pytest.approx(ref, rel=1e-10)
    assert M.pass_at_k([0, 0, 0, 1], [5, 5, 5, 5], 4) == 1.0
    assert M.pass_at_k([0, 0, 0, 0], [5, 5, 5, 5], 4) == 0.0
    with pytest.raises(ValueError, match=r"k=4.*smallest n = 2"):
        M.pass_at_k([1, 0, 1, 1, 0, 1], [0, 0, 1, 1, 1, 1], 4)
    with pytest.raises(ValueError, match="positive integer"):
        M.pass_at_k([1, 0], [0, 0], 0)


# -------------------------------------------------------------------------------------------- abstention
def test_precision_coverage_and_aurc_hand_worked():
    # sorted by confidence: correct 1, 0, 1, 0 -> precision 1, 1/2, 2/3, 1/2 at coverage 1/4 .. 1
    # AURC = (1/4) * (0 + 1/2 + 1/3 + 1/2) = 1/3
    conf, correct = [0.6, 0.9, 0.7, 0.8], [0, 1, 1, 0]
    cov, prec = M.precision_coverage(conf, correct)
    np.testing.assert_allclose(cov, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(prec, [1.0, 0.5, 2 / 3, 0.5])
    assert M.aurc(conf, correct) == pytest.approx(1 / 3)
    # equals Geifman's per-sample mean of risks when there are no ties
    assert M.aurc(conf, correct) == pytest.approx(np.mean(1 - prec))


def test_abstention_ties_are_one_step():
    # {0.9, 0.9}: correct 1, 0 -> one step at coverage 1/2, precision 1/2 (risk 1/2)
    # all four: precision 3/4 (risk 1/4).  AURC = 1/2 * 1/2 + 1/2 * 1/4 = 0.375
    conf, correct = [0.9, 0.5, 0.9, 0.5], [1, 1, 0, 1]
    cov, prec, thr = M.precision_coverage(conf, correct, return_thresholds=True)
    np.testing.assert_allclose(cov, [0.5, 1.0])
    np.testing.assert_allclose(prec, [0.5, 0.75])
    np.testing.assert_allclose(thr, [0.9, 0.5])
    assert M.aurc(conf, correct) == pytest.approx(0.375)
    # order of tied samples does not matter
    assert M.aurc([0.9, 0.9, 0.5, 0.5], [0, 1, 1, 1]) == pytest.approx(0.375)
    # coverage 1/4 falls inside the tie run {0.9, 0.9}: counted at the run's accuracy 1/2
    pac = M.precision_at_coverage(conf, correct, coverages=(0.25, 0.5, 0.75, 1.0))
    assert pac == pytest.approx({0.25: 0.5, 0.5: 0.5, 0.75: (1 + 1) / 3, 1.0: 0.75})


def test_precision_at_coverage_no_ties_and_errors():
    rng = np.random.default_rng(0)
    conf = rng.random(1000)
    y = rng.random(1000) < conf
    order = np.argsort(-conf)
    pac = M.precision_at_coverage(conf, y)
    assert list(pac) == pytest.approx(list(M.DEFAULT_COVERAGES))
    for c, p in pac.items():
        m = int(round(c * 1000))
        assert p == pytest.approx(y[order[:m]].mean())
    with pytest.raises(ValueError, match="coverages"):
        M.precision_at_coverage(conf, y, coverages=(0.0, 0.5))


# --------------------------------------------------------------------------------------------- bootstrap
def test_bootstrap_resamples_prompts_not_samples():
    # 20 prompts x 50 samples; every prompt is all-correct or all-wrong. Resampling prompts gives a wide
    # interval (the mean moves in steps of 1/20); resampling single samples would give about +-0.03.
    pid = np.repeat(np.arange(20), 50)
    correct = np.repeat(np.arange(20) % 2 == 0, 50)
    ci = M.bootstrap_ci(lambda c: float(np.mean(c)), (correct,), prompt_ids=pid, n_boot=300, seed=1)
    assert ci.point == pytest.approx(0.5)
    assert ci.high - ci.low > 0.3
    assert ci.low < 0.5 < ci.high


def test_bootstrap_draws_whole_prompts_and_relabels_duplicates():
    pid = np.repeat([10, 20, 30, 40], [3, 1, 2, 4])
    sample_idx = np.arange(len(pid))
    seen = []

    def metric(prompt_ids, idx, orig):
        # every draw holds ALL samples of one original prompt, and a prompt drawn twice gets two ids
        for d in np.unique(prompt_ids):
            members = idx[prompt_ids == d]
            assert len(np.unique(orig[prompt_ids == d])) == 1
            np.testing.assert_array_equal(np.sort(members), np.flatnonzero(pid == orig[prompt_ids == d][0]))
        assert len(np.unique(prompt_ids)) == 4
        seen.append(len(idx))
        return float(len(idx))

    M.bootstrap_ci(metric, {"prompt_ids": pid, "idx": sample_idx, "orig": pid.copy()}, prompt_ids=pid,
                   n_boot=50, seed=0)
    assert len(set(seen)) > 1  # replicate sizes vary: prompts, not samples, were drawn


def test_bootstrap_deterministic_with_seed_and_per_prompt_metrics():
    conf, correct, pid = _random_data(0)
    a = M.bootstrap_ci(M.auroc, (conf, correct), prompt_ids=pid, n_boot=200, seed=7)
    b = M.bootstrap_ci(M.auroc, (conf, correct), prompt_ids=pid, n_boot=200, seed=7)
    c = M.bootstrap_ci(M.auroc, (conf, correct), prompt_ids=pid, n_boot=200, seed=8)
    assert a == b and a != c
    assert isinstance(a, M.BootstrapCI) and a.low <= a.point <= a.high
    assert a.point == pytest.approx(M.auroc(conf, correct))
    # per-prompt metrics: prompt ids travel in the tuple (same object) or dict and get relabelled
    m = M.bootstrap_ci(M.mean_at_k, (correct, pid), prompt_ids=pid, n_boot=100)
    assert m.point == pytest.approx(M.mean_at_k(correct, pid)) and m.low < m.point < m.high
    pp = M.bootstrap_ci(M.per_prompt_auroc, {"confidence": conf, "correct": correct, "prompt_ids": pid},
                        prompt_ids=pid, n_boot=100)
    assert pp.point == pytest.approx(M.per_prompt_auroc(conf, correct, pid).mean)
    assert pp.low < pp.point < pp.high


# ------------------------------------------------------------------------------------ internals / fast paths
def test_group_index_paths_agree_with_unique():
    from calibrl.metrics._arrays import group_index

    rng = np.random.default_rng(0)
    for ids in (rng.integers(-50, 50, 300), rng.integers(0, 10**12, 300), np.array(["b", "a", "c", "a"]),
                np.array([3, "x", 3], dtype=object), np.array([True, False, True])):
        inv, n = group_index(ids)
        ref_uniq, ref_inv = np.unique(ids.astype(str) if ids.dtype == object else ids, return_inverse=True)
        np.testing.assert_array_equal(inv, ref_inv.reshape(-1))
        assert n == len(ref_uniq)


def test_stable_argsort_small_ints_and_many_groups():
    from calibrl.metrics._arrays import stable_argsort_small_ints

    rng = np.random.default_rng(0)
    for high in (100, 70_000, 2**33):
        keys = rng.integers(0, high, 5000)
        np.testing.assert_array_equal(stable_argsort_small_ints(keys), np.argsort(keys, kind="stable"))
    # more than 2**16 prompts (two radix passes): 70,000 prompts with one correct and one wrong sample each;
    # per-prompt AUROC is 1 if the correct sample scores higher, 1/2 on a tie, 0 otherwise
    n_p = 70_000
    pid = np.repeat(rng.permutation(n_p), 2)
    correct = np.tile([True, False], n_p)
    conf = np.round(rng.random(2 * n_p), 1)
    res, values = M.per_prompt_auroc(conf, correct, pid, return_values=True)
    c_pos, c_neg = conf[0::2], conf[1::2]
    expected = np.empty(n_p)
    expected[pid[0::2]] = np.where(c_pos > c_neg, 1.0, np.where(c_pos == c_neg, 0.5, 0.0))
    np.testing.assert_array_equal(values, expected)
    assert res.n_prompts == n_p and res.mean == pytest.approx(expected.mean())


# ------------------------------------------------------------------------------------------------ properties
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.booleans()), min_size=1, max_size=40))
def test_property_auroc_and_per_prompt_match_sklearn(rows):
    pid = np.array([r[0] for r in rows])
    conf = np.array([r[1] for r in rows], dtype=float) / 3  # heavy ties, values on bin edges
    y = np.array([r[2] for r in rows])
    if y.all() or not y.any():
        assert np.isnan(M.auroc(conf, y))
    else:
        assert M.auroc(conf, y) == pytest.approx(roc_auc_score(y, conf), abs=1e-12)
    vals = [roc_auc_score(y[pid == p], conf[pid == p]) for p in np.unique(pid)
            if y[pid == p].any() and not y[pid == p].all()]
    res = M.per_prompt_auroc(conf, y, pid)
    assert res.n_prompts == len(vals)
    if vals:
        assert res.mean == pytest.approx(np.mean(vals), abs=1e-12)
    # abstention: the last step answers everything; AURC lies in [0, 1]
    cov, prec = M.precision_coverage(conf, y)
    assert cov[-1] == 1.0 and prec[-1] == pytest.approx(y.mean())
    assert 0.0 <= M.aurc(conf, y) <= 1.0


def test_nll_clip_differs_from_sklearn_log_loss_only_at_the_ends():
    # documented: clipped at 1e-12 here, machine epsilon in sklearn
    assert M.nll([1.0], [0]) == pytest.approx(-np.log(1e-12))
    assert log_loss([0, 1], [1.0, 0.5]) > M.nll([1.0, 0.5], [0, 1]) + 4
    p, y = [0.2, 0.7, 1e-9, 0.999], [0, 1, 0, 1]
    assert M.nll(p, y) == pytest.approx(log_loss(y, p), rel=1e-12)


def test_aurc_and_precision_at_coverage_tie_rules_documented_example():
    s, y = [0.9, 0.5, 0.5], [0, 1, 0]
    assert M.aurc(s, y) == pytest.approx(1 / 3 + (2 / 3) * (2 / 3))
    pac = M.precision_at_coverage(s, y, [1 / 3, 2 / 3, 1.0])
    assert list(pac.values()) == pytest.approx([0.0, 0.25, 1 / 3])
    assert np.mean([1 - v for v in pac.values()]) == pytest.approx((1 + 0.75 + 2 / 3) / 3)
    # without ties the two agree
    s2 = [0.9, 0.6, 0.5]
    pac2 = M.precision_at_coverage(s2, y, [1 / 3, 2 / 3, 1.0])
    assert M.aurc(s2, y) == pytest.approx(np.mean([1 - v for v in pac2.values()]))


def test_calibrated_abstention_heldout_figures_are_pooled_over_heldout_samples():
    rng = np.random.default_rng(11)
    pids = rng.permutation(np.repeat(np.arange(300), 5))
    conf = rng.random(pids.size)
    y = rng.random(pids.size) < conf**0.3
    res = M.calibrated_abstention(conf, y, pids, target_precision=0.75, delta=0.1, seed=2, method="bonferroni")
    assert res.threshold is not None
    cal, draw = M.calibration_split(pids, seed=2)
    # the threshold is the one abstention_threshold finds on the one-sample-per-prompt calibration draw
    assert res.threshold == M.abstention_threshold(conf[draw], y[draw], target_precision=0.75, delta=0.1).threshold
    held = ~cal
    answered = held & (conf >= res.threshold)
    assert res.coverage == pytest.approx(answered.sum() / held.sum())
    assert res.precision_heldout == pytest.approx(y[answered].mean())
    assert res.n_heldout_prompts == 150 and res.n_heldout_samples == held.sum() == 750
    # the certified threshold's calibration lower bound is at least the target
    assert res.calibration_lower_bound >= 0.75


def test_weighted_auroc_matches_sklearn_sample_weight_and_batches_rows():
    from sklearn.metrics import roc_auc_score

    from calibrl.metrics import weighted_auroc

    rng = np.random.default_rng(7)
    scores = np.round(rng.normal(size=300), 1)  # rounded: many ties
    labels = rng.random(300) < 0.4
    weights = rng.integers(0, 4, size=(5, 300)).astype(float)
    batch = weighted_auroc(scores, labels, weights)
    for row, w in zip(batch, weights):
        assert row == pytest.approx(roc_auc_score(labels, scores, sample_weight=w))
        assert weighted_auroc(scores, labels, w) == pytest.approx(row)
    assert weighted_auroc(scores, labels, np.ones(300)) == pytest.approx(roc_auc_score(labels, scores))
    no_positive = np.where(labels, 0.0, 1.0)
    assert np.isnan(weighted_auroc(scores, labels, no_positive))
    with pytest.raises(ValueError, match="one entry per sample"):
        weighted_auroc(scores, labels, np.ones(299))
