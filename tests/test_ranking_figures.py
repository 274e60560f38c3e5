"""One sort per score: ``ranking_figures`` against the metric functions one by one (and scikit-learn's AUROC) on
random inputs with ties, the eval's choice of sharing the sort between score and confidence, and the main
confidence's AUROC bootstrap taken from the confidence-source bootstrap."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from calibrl import metrics as M
from calibrl.evaluation.scoring import prompt_bootstrap, source_bootstrap
from calibrl.metrics.registry import _orders_like


@pytest.mark.parametrize("seed", range(6))
def test_ranking_figures_equal_the_metrics_one_by_one_with_ties(seed):
    rng = np.random.default_rng(seed)
    for _ in range(20):
        n = int(rng.integers(2, 400))
        score = np.round(rng.normal(size=n), int(rng.integers(0, 3)))  # 0-2 decimals: many ties
        correct = rng.uniform(size=n) < rng.uniform(0.05, 0.95)
        max_rejection = float(rng.choice([1.0, 0.7, 0.3]))
        coverages = (0.1, 0.25, 0.5, 0.9, 1.0)
        got = M.ranking_figures(score, correct, coverages=coverages, max_rejection=max_rejection)
        one_class = correct.all() or not correct.any()
        if one_class:
            assert np.isnan(got.auroc) and np.isnan(got.prr)
        else:
            assert got.auroc == M.auroc(score, correct)
            assert got.auroc == pytest.approx(roc_auc_score(correct, score), abs=1e-12)
            expected = M.prr(score, correct, max_rejection=max_rejection)  # nan when no sample may be rejected
            assert got.prr == expected or (np.isnan(got.prr) and np.isnan(expected))
        assert got.aurc == M.aurc(score, correct)
        assert got.precision_at_coverage == M.precision_at_coverage(score, correct, coverages)
        assert got.levels.tolist() == sorted(set(score.tolist()), reverse=True)


def test_confidence_shares_the_scores_sort_only_when_it_ranks_alike():
    lpm = np.array([-0.5, -0.2, -0.2, -3.0])
    levels = M.ranking_figures(lpm, [True, False, True, False]).levels
    assert _orders_like(lpm, np.exp(lpm), levels)  # exp keeps the three levels distinct
    assert _orders_like(lpm, lpm.copy(), levels)
    assert not _orders_like(lpm, np.exp(lpm) + 1e-3, levels)  # another confidence: its own sort
    tiny = np.array([-800.0, -900.0, -1.0])  # exp underflows both low levels to 0.0: a tie the score lacks
    assert not _orders_like(tiny, np.exp(tiny), M.ranking_figures(tiny, [True, False, True]).levels)


def test_main_confidence_auroc_intervals_reused_from_the_source_bootstrap():
    rng = np.random.default_rng(3)
    pid = np.unique(rng.integers(0, 50, size=400), return_inverse=True)[1]
    n_groups = int(pid.max()) + 1
    correct = rng.uniform(size=pid.size) < 0.55
    score = np.round(-rng.exponential(0.5, size=pid.size) - 0.3 * ~correct, 2)
    conf = np.exp(score)
    found = source_bootstrap({"logprob_mean": (pid, conf, score, correct, True)}, n_groups, n_boot=150, alpha=0.1,
                             seed=7)
    reps = found["replicates"]["logprob_mean"]["auroc"]
    own = prompt_bootstrap(correct, pid, score, conf, correct, n_bins=10, n_boot=150, alpha=0.1, seed=7)
    reused = prompt_bootstrap(correct, pid, score, conf, correct, n_bins=10, n_boot=150, alpha=0.1, seed=7,
                              auroc_replicates=reps)
    assert reused == own  # the same replicates exactly, so the same intervals, every figure
    assert found["intervals"]["logprob_mean"]["auroc"] == own["auroc"]


@pytest.mark.parametrize("n_prompts", [50, 3])  # 3: repeated draws computed once by the source bootstrap
def test_prompt_bootstrap_fed_by_the_source_bootstrap_s_draws_equals_its_own(n_prompts):
    """The eval draws its prompts once: the figures' bootstrap fed each chunk of the sources' draws (with or without
    their AUROC replicates) gives the intervals of :func:`prompt_bootstrap` drawing its own, to the last bit."""
    from calibrl.evaluation.scoring import PromptReplicates

    rng = np.random.default_rng(8)
    pid = np.unique(rng.integers(0, n_prompts, size=300), return_inverse=True)[1]
    n_groups = int(pid.max()) + 1
    correct = rng.uniform(size=pid.size) < 0.55
    score = np.round(-rng.exponential(0.5, size=pid.size) - 0.3 * ~correct, 2)
    conf = np.exp(score)
    own = prompt_bootstrap(correct, pid, score, conf, correct, n_bins=10, n_boot=150, alpha=0.1, seed=9)
    sources = {"logprob_mean": (pid, conf, score, correct, True),
               "other": (pid, conf[::-1].copy(), score[::-1].copy(), correct, True)}
    for auroc_of in ("logprob_mean", None):
        fed = PromptReplicates(correct, pid, score, conf, correct, n_bins=10, auroc_given=auroc_of is not None)
        found = source_bootstrap(sources, n_groups, n_boot=150, alpha=0.1, seed=9, prompts=fed,
                                 prompts_auroc=auroc_of)
        assert fed.intervals(0.1) == own
        assert len(np.concatenate(fed.stats["accuracy"])) == 150
    assert found["intervals"]["logprob_mean"]["auroc"] == own["auroc"]
    with pytest.raises(ValueError, match="prompts"):
        source_bootstrap(sources, n_groups + 1, n_boot=10, alpha=0.1, seed=9, prompts=fed)


def test_repeated_draws_of_few_prompts_are_computed_once_with_the_same_replicates(monkeypatch):
    """3 prompts allow 10 different bootstrap draws: each is computed once, and every replicate equals the one
    computed without that shortcut (AUROC and PRR exactly; smooth ECE to rounding: batched FFTs)."""
    from calibrl.evaluation import scoring
    from calibrl.metrics.rejection import PRRReplicates

    rng = np.random.default_rng(5)
    pid = np.repeat(np.arange(3), 5)
    conf = rng.uniform(0.05, 0.95, size=pid.size)
    correct = rng.uniform(size=pid.size) < conf
    arrays = {"logprob_mean": (pid, conf, np.log(conf), correct, True)}
    rows_computed = []
    real = PRRReplicates.with_auroc
    monkeypatch.setattr(PRRReplicates, "with_auroc", lambda self, c: rows_computed.append(len(c)) or real(self, c))
    once = source_bootstrap(arrays, 3, n_boot=200, alpha=0.1, seed=4)
    assert sum(rows_computed) <= 10
    monkeypatch.setattr(scoring, "_DEDUP_PROMPTS", 0)
    every = source_bootstrap(arrays, 3, n_boot=200, alpha=0.1, seed=4)
    assert sum(rows_computed) >= 200 + 1
    a, b = once["replicates"]["logprob_mean"], every["replicates"]["logprob_mean"]
    assert np.array_equal(a["auroc"], b["auroc"], equal_nan=True)
    assert np.array_equal(a["prr"], b["prr"], equal_nan=True)
    np.testing.assert_allclose(a["smooth_ece"], b["smooth_ece"], rtol=0, atol=1e-15)
    assert len(np.unique(a["smooth_ece"])) > 3  # the draws differ: not one value copied everywhere
