"""The fast paths of ``calibrl eval`` against the code they replace: RPC's batched L-BFGS-B fit vs scipy's per-prompt
fit, the prompt bootstrap from draw counts vs :func:`calibrl.metrics.bootstrap_ci`, and the integer shortcut of
answer equivalence vs math-verify."""

import functools

import numpy as np
import pytest
from scipy.optimize import minimize

from calibrl import metrics as M
from calibrl.evaluation.scoring import prompt_bootstrap
from calibrl.selection import answers as A
from calibrl.selection import pruning as P


def _groups(n_prompts, n, seed):
    rng = np.random.default_rng(seed)
    pid = np.repeat(np.arange(n_prompts), n)
    wrong = rng.uniform(size=pid.size) < 0.4
    return pid, -rng.exponential(rng.uniform(0.1, 0.6, size=n_prompts)[pid]) - 0.2 * wrong


def test_mixture_objective_equals_scipy_stats_and_its_gradient_finite_differences():
    from scipy.optimize import check_grad
    from scipy.stats import weibull_min

    from calibrl.selection._lbfgsb import mixture_nll_grad

    rng = np.random.default_rng(4)
    for _ in range(20):
        x = rng.uniform(0.05, 1.0, size=int(rng.integers(2, 12)))
        params = np.array([rng.uniform(0.2, 0.8), *rng.uniform(0.3, 4.0, size=4)])
        w, k1, l1, k2, l2 = params
        ref = -np.sum(np.log(w * weibull_min.pdf(x, k1, scale=l1) + (1 - w) * weibull_min.pdf(x, k2, scale=l2)))
        grad = np.empty(5)
        assert mixture_nll_grad(params, x, np.log(x), grad) == pytest.approx(ref, rel=1e-10)

        def value(v, x=x):
            return mixture_nll_grad(v, x, np.log(x), np.empty(5))

        def gradient(v, x=x):
            out = np.empty(5)
            mixture_nll_grad(v, x, np.log(x), out)
            return out

        assert check_grad(value, gradient, params, epsilon=1e-7) < 1e-4 * (1 + np.abs(gradient(params)).max())
    grad = np.full(5, 7.0)  # a point where exp(k z) overflows: huge, with no gradient (the search steps back)
    assert mixture_nll_grad(np.array([0.5, 500.0, 1e-3, 500.0, 1e-3]), np.array([0.9, 0.8]), np.log([0.9, 0.8]),
                            grad) == 1e300 and not grad.any()


@pytest.mark.parametrize("n, share", [(6, 0.75), (12, 0.9)])
def test_compiled_lbfgsb_lands_where_scipy_lands(n, share):
    # scipy's own minimize from the reference start: with 6 or more paths the mixture's optimum is well posed, so the
    # same steps land on the same point (to 1e-6) on most prompts; rounding sends the rest to other local optima
    from calibrl.selection._lbfgsb import fit_weibull_mixtures

    rng = np.random.default_rng(n)
    wrong = rng.uniform(size=(60, n)) < 0.4
    x = np.exp(-rng.exponential(rng.uniform(0.1, 0.6, size=(60, 1)), size=(60, n)) - 0.2 * wrong)
    lower, upper = np.array([0.2, 0.01, 0.01, 0.01, 0.01]), np.array([0.8, np.inf, np.inf, np.inf, np.inf])
    got = fit_weibull_mixtures(x, P._RPC_X0, lower, upper)
    ref = np.array([minimize(P._mixture_nll_grad, P._RPC_X0, args=(x[i],), jac=True, method="L-BFGS-B",
                             bounds=P._RPC_BOUNDS).x for i in range(60)])
    assert np.isclose(got, ref, rtol=1e-6, atol=1e-9).all(axis=1).mean() >= share
    assert ((got >= lower) & (got <= upper)).all()
    assert (got[:, 0] == 0.8).any() or (got[:, 0] == 0.2).any()  # a bound is reached: the projections are used


@pytest.mark.parametrize("n", [2, 5, 16])
def test_batched_rpc_fit_follows_scipys_steps(n):
    pid, lpm = _groups(40, n, seed=n)
    batched = P.rpc_keep_mask(pid, lpm).reshape(40, n)
    scipy_fit = P.rpc_keep_mask(pid, lpm, solver="scipy").reshape(40, n)
    assert (batched == scipy_fit).all(axis=1).mean() >= 0.95
    assert not batched.all()  # something is pruned, so the comparison means something


def test_rpc_keep_mask_mixed_group_sizes_and_cache():
    pid = np.r_[np.zeros(6), np.ones(3), np.full(1, 2), np.full(4, 3)]
    lpm = np.log(np.r_[[0.9, 0.8, 0.1, 0.15, 0.85, 0.12], [0.5, 0.2, 0.6], [0.3], [0.4, 0.4, 0.4, 0.4]])
    batched = P.rpc_keep_mask(pid, lpm)
    assert batched.tolist() == P.rpc_keep_mask(pid, lpm, solver="scipy").tolist()
    assert batched[9] and batched[10:].all()  # one path, or all equal: nothing to prune
    assert P.rpc_keep_mask(pid, lpm).tolist() == batched.tolist()  # the cached answer is the same
    with pytest.raises(ValueError, match="solver"):
        P.rpc_keep_mask(pid, lpm, solver="em")


@pytest.mark.parametrize("seed", [0, 1])
def test_prompt_bootstrap_uses_bootstrap_cis_draws(seed):
    rng = np.random.default_rng(seed)
    pid = np.unique(rng.integers(0, 60, size=300), return_inverse=True)[1]
    correct = rng.uniform(size=pid.size) < 0.6
    score = np.round(-rng.exponential(0.5, size=pid.size) - 0.3 * ~correct, 2)  # rounded: ties
    conf = np.exp(score)
    fast = prompt_bootstrap(correct, pid, score, conf, correct, n_bins=10, n_boot=200, alpha=0.1, seed=seed)
    ci = functools.partial(M.bootstrap_ci, prompt_ids=pid, n_boot=200, alpha=0.1, seed=seed)
    ref = {"accuracy": ci(M.mean_at_k, {"correct": correct, "prompt_ids": pid}), "auroc": ci(M.auroc, (score, correct)),
           "ece": ci(functools.partial(M.ece, n_bins=10, strategy="uniform"), (conf, correct)),
           "brier": ci(M.brier, (conf, correct))}
    for key in ("accuracy", "auroc"):  # the same sums, so the same numbers
        assert fast[key] == (ref[key].low, ref[key].high), key
    for key in ("ece", "brier"):  # sums in another order
        np.testing.assert_allclose(fast[key], (ref[key].low, ref[key].high), rtol=1e-12, atol=1e-15)
    assert fast["auroc"][0] < fast["auroc"][1]
    only_acc = prompt_bootstrap(correct, pid, None, None, None, n_bins=10, n_boot=200, alpha=0.1, seed=seed)
    assert set(only_acc) == {"accuracy"} and only_acc["accuracy"] == fast["accuracy"]


def test_integer_shortcut_agrees_with_math_verify():
    pytest.importorskip("math_verify")
    pairs = [("12", "13"), ("7", "-7"), ("5", "500"), ("1", "100"), ("0", "-0"), ("-0", "00"), ("1000", "1,000"),
             ("123456789", "123456788"), ("3", "3.0"), ("3", "03"), ("10", "10\\%")]
    for a, b in pairs:
        shortcut = A.answers_equivalent(a, b)
        x, y = sorted((a, b))
        verified = (A.normalize_answer(a) == A.normalize_answer(b) or A._latex_key(a) == A._latex_key(b)
                    or A._verify_pair(x, y, None))
        assert shortcut == verified, (a, b)


def test_bfgs_matrix_from_ring_buffers_equals_the_plain_recursion():
    # problems holding 0 .. 10 pairs, their oldest pair anywhere in the ring: B = theta I, then per pair (oldest
    # first) B - Bss'B / s'Bs + yy' / s'y, written out with np.matmul on [n, n] matrices
    from calibrl.selection import _lbfgsb as L

    rng = np.random.default_rng(0)
    n, m = 5, 10
    cols = set()
    for _ in range(40):
        S = rng.normal(size=(n, m))
        Y = S + 0.3 * rng.normal(size=(n, m))
        SY = np.einsum("nm,nm->m", S, Y)
        col, head, theta = int(rng.integers(0, m + 1)), int(rng.integers(0, m)), rng.uniform(0.5, 2.0)
        got = np.empty((n, n))
        L._bfgs_matrix(theta, S, Y, SY, col, head, got, np.empty(n))
        B = theta * np.eye(n)
        for j in range(col):
            slot = (head - col + j) % m
            s, y = S[:, slot], Y[:, slot]
            bs = B @ s
            B = B - np.outer(bs, bs) / (s @ bs) + np.outer(y, y) / SY[slot]
        np.testing.assert_allclose(got, B, rtol=1e-10, atol=1e-12)
        cols.add(col)
    assert 0 in cols and m in cols


def test_lbfgsb_problems_do_not_affect_each_other():
    # each problem's steps depend on its own values only: fitting them all at once or a few at a time gives the
    # same points to the last bit
    from calibrl.selection._lbfgsb import fit_weibull_mixtures

    pid, lpm = _groups(60, 6, seed=3)
    prob = np.exp(lpm).reshape(60, 6)
    fit = functools.partial(fit_weibull_mixtures, x0=P._RPC_X0, lower=np.array([0.2, 0.01, 0.01, 0.01, 0.01]),
                            upper=np.array([0.8, np.inf, np.inf, np.inf, np.inf]))
    together = fit(prob)
    apart = np.concatenate([fit(prob[i:i + 7]) for i in range(0, 60, 7)])
    assert np.array_equal(together, apart)
    assert len({tuple(np.round(r, 6)) for r in together}) > 30  # different optima, so the check means something
    with pytest.raises(ValueError, match="x0 must hold the mixture's 5 parameters"):
        fit_weibull_mixtures(prob, x0=P._RPC_X0[:4], lower=np.zeros(5), upper=np.ones(5))


def test_prompt_bootstrap_auroc_in_blocks_equals_bootstrap_ci(monkeypatch):
    # replicates split into blocks of 3 and ties between positives and negatives: still bootstrap_ci's AUROCs
    from calibrl.evaluation import scoring

    rng = np.random.default_rng(7)
    pid = np.unique(rng.integers(0, 40, size=200), return_inverse=True)[1]
    correct = rng.uniform(size=pid.size) < 0.5
    score = np.round(rng.normal(size=pid.size) + 0.8 * correct, 1)  # one decimal: many ties
    neg_g, pos_g, lo, hi = scoring._ranked_negatives(score, correct, pid)
    assert (hi > lo).sum() > 20
    monkeypatch.setattr(scoring, "_AUROC_BLOCK", 3 * pid.size)
    fast = prompt_bootstrap(correct, pid, score, np.exp(-np.abs(score)), correct, n_bins=10, n_boot=50,
                            alpha=0.2, seed=3)
    ref = M.bootstrap_ci(M.auroc, (score, correct), prompt_ids=pid, n_boot=50, alpha=0.2, seed=3)
    assert fast["auroc"] == (ref.low, ref.high)


def test_rpc_masks_are_the_same_bits_split_over_processes(monkeypatch):
    """RPC's fits split by prompts over worker processes (``CALIBRL_WORKERS``) give this process's masks exactly."""
    rng = np.random.default_rng(5)
    pid = np.repeat(np.arange(700), 4)
    lpm = rng.normal(-1.0, 0.6, pid.size)
    monkeypatch.setattr(P, "_MIN_CHUNK", 100)  # small chunks, so 700 prompts are split
    monkeypatch.setenv("CALIBRL_WORKERS", "1")
    P._KEEP_CACHE.clear()
    alone = P.rpc_keep_mask(pid, lpm)
    monkeypatch.setenv("CALIBRL_WORKERS", "3")
    P._KEEP_CACHE.clear()
    split = P.rpc_keep_mask(pid, lpm)
    assert P._POOL  # the pool ran (two other processes)
    np.testing.assert_array_equal(split, alone)
    assert 0 < (~alone).sum() < alone.size
    monkeypatch.setenv("CALIBRL_WORKERS", "two")
    with pytest.raises(ValueError, match="CALIBRL_WORKERS must be a whole number"):
        P.rpc_workers()


def _vote_accuracy(weights, ans, correct, pid):
    from calibrl.selection.voting import _vote

    prompts, _ = np.unique(pid, return_inverse=True)
    return _vote("rpc", weights, ans, correct, pid, prompts.size, prompts).correct  # [P] per prompt


def test_prompts_whose_accuracy_pruning_cannot_change_keep_it_under_every_pruning():
    """Where :func:`_pruning_cannot_change_accuracy` says so, zeroing ANY set of below-mean paths leaves the
    vote's accuracy as it is (wrong answers of several clusters, clusters whose paths disagree on correctness,
    ties); it does not say so where some pruning changes the accuracy; and it says so where pruning can only swap
    one wrong answer for another, which a test of the winner alone would fit."""
    rng = np.random.default_rng(7)
    groups, k = 400, 6
    pid = np.repeat(np.arange(groups), k)
    ans = rng.integers(0, 4, pid.size)
    correct = (ans == 0) ^ (rng.random(pid.size) < 0.05)  # a few clusters whose paths disagree
    prob = np.exp(rng.normal(-1.0, 0.7, pid.size))
    prob[rng.random(pid.size) < 0.1] = 0.3  # ties
    weights = np.where(rng.random(pid.size) < 0.1, 0.0, prob)  # a few duplicates zeroed
    safe = P._pruning_cannot_change_accuracy(weights, prob, ans, correct, pid, groups)
    assert 0.2 < safe.mean() < 0.95  # both kinds occur
    below = prob < (np.bincount(pid, prob) / k)[pid]
    base = _vote_accuracy(weights, ans, correct, pid)
    changed = np.zeros(groups, dtype=bool)
    winner_changed = np.zeros(groups, dtype=bool)
    from calibrl.selection.voting import _vote

    base_answer = _vote("rpc", weights, ans, correct, pid, groups, np.arange(groups)).answer_ids
    for _ in range(60):
        zero = below & (rng.random(pid.size) < rng.uniform(0.2, 1.0))
        acc = _vote_accuracy(np.where(zero, 0.0, weights), ans, correct, pid)
        np.testing.assert_array_equal(acc[safe], base[safe])
        changed |= acc != base
        answer = _vote("rpc", np.where(zero, 0.0, weights), ans, correct, pid, groups, np.arange(groups)).answer_ids
        winner_changed |= answer != base_answer
    assert changed[~safe].any()  # the flagged prompts include ones a pruning does change
    assert (safe & winner_changed).any()  # safe although the winner changes: a wrong answer for another
    # by hand: one prompt, answers A A B with probabilities 0.9, 0.1, 0.5 (mean 0.5): pruning can take A's 0.1
    # (A keeps 0.9 > B's 0.5): safe; with 0.4, 0.1, 0.45 (mean 0.317; A may drop to 0.4 < B's 0.45): not safe
    # when A is right and B wrong, safe when both are wrong; and not safe when A's two paths disagree (A's
    # correctness 0.5 against B's 0)
    one = np.zeros(3, dtype=np.int64)
    for probs, right, expect in (([0.9, 0.1, 0.5], [1, 1, 0], True), ([0.4, 0.1, 0.45], [1, 1, 0], False),
                                 ([0.4, 0.1, 0.45], [0, 0, 0], True), ([0.4, 0.1, 0.45], [1, 0, 0], False),
                                 ([0.4, 0.1, 0.45], [1, 1, 1], True)):
        probs = np.array(probs)
        got = P._pruning_cannot_change_accuracy(probs, probs, np.array([0, 0, 1]), np.array(right, bool), one, 1)
        assert got[0] == expect, (probs, right)


def test_rpc_scaling_curve_fits_only_undecided_prompts_and_equals_the_full_computation(monkeypatch):
    from calibrl.selection import scaling

    rng = np.random.default_rng(3)
    groups, k = 600, 8
    pid = np.repeat(np.arange(groups), k)
    ans = rng.integers(0, rng.integers(1, 5, groups), (k, groups)).T.reshape(-1)
    lpm = np.round(rng.normal(-1.0, 0.6, pid.size), 1)  # ties of probability too
    P._KEEP_CACHE.clear()
    fitted = []
    real_mask = P.rpc_keep_mask
    monkeypatch.setattr(P, "rpc_keep_mask", lambda p, l, **kw: fitted.append(len(np.unique(p))) or real_mask(p, l))
    fast = scaling.scaling_curve("rpc", ans, ans == 0, pid, logprob_mean=lpm, n_draws=3)
    assert fitted and all(n < groups for n in fitted)  # the full group too fits only the undecided prompts
    # and its accuracy is the full fit's: RPC of every path, all prompts fitted
    P._KEEP_CACHE.clear()
    whole = P.rpc(ans, ans == 0, pid, logprob_mean=lpm)
    assert fast.accuracy[-1] == whole.accuracy
    assert P.rpc(ans, ans == 0, pid, logprob_mean=lpm, accuracy_only=True).accuracy == whole.accuracy
    monkeypatch.setattr(P, "_pruning_cannot_change_accuracy", lambda w, pr, a, c, p, n: np.zeros(n, dtype=bool))
    P._KEEP_CACHE.clear()
    full = scaling.scaling_curve("rpc", ans, ans == 0, pid, logprob_mean=lpm, n_draws=3)
    np.testing.assert_array_equal(fast.accuracy, full.accuracy)
    np.testing.assert_array_equal(fast.std, full.std)

