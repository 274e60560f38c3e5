"""Advantage estimators: hand-worked values, properties (hypothesis), numerics, and error messages."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from calibrl import RolloutBatch, RolloutBatchError, available_estimators, compute_advantages
from calibrl.advantages import capo as capo_module

SETTINGS = settings(max_examples=25, deadline=None)
LN3 = math.log(3.0)
ALL = ["grpo", "dr_grpo", "rloo", "capo", "seed_grpo", "gcpo", "codapo", "cde"]


def full_batch(rewards, group_ids, lpm=None, ref=None, emb=None, answers=None, dtype=torch.float64) -> RolloutBatch:
    n = len(rewards)
    g = torch.Generator().manual_seed(n)
    return RolloutBatch(
        rewards=torch.as_tensor(rewards, dtype=dtype),
        group_ids=torch.as_tensor(group_ids),
        logprob_mean=torch.as_tensor(lpm, dtype=dtype) if lpm is not None else -torch.rand(n, generator=g, dtype=dtype),
        ref_logprob_mean=torch.as_tensor(ref, dtype=dtype) if ref is not None else -torch.rand(n, generator=g, dtype=dtype),
        embeddings=torch.as_tensor(emb, dtype=dtype) if emb is not None else torch.randn(n, 5, generator=g, dtype=dtype),
        answer_ids=torch.as_tensor(answers) if answers is not None else torch.randint(0, 3, (n,), generator=g),
    )


def adv(batch, name, **params):
    return compute_advantages(batch, name, **params)


# ----------------------------------------------------------------------------------------------- registry


def test_all_estimators_registered():
    assert set(ALL) <= set(available_estimators())


# ------------------------------------------------------------------------------------ hand-worked values


def test_grpo_dr_grpo_rloo_hand_values():
    b = full_batch([1, 0, 0, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 1, 1, 2])
    # group 0 = [1, 0, 0]: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    s = math.sqrt(1 / 3) + 1e-4
    torch.testing.assert_close(adv(b, "grpo")[:3], torch.tensor([2 / 3 / s, -1 / 3 / s, -1 / 3 / s], dtype=torch.float64))
    torch.testing.assert_close(adv(b, "dr_grpo")[:3], torch.tensor([2 / 3, -1 / 3, -1 / 3], dtype=torch.float64))
    # rloo: [1, 0, 0] -> 1 - 0, 0 - (1 + 0)/2; [1, 1, 0, 0] -> 1 - 1/3, 0 - 2/3; a lone sample -> 0
    expected = torch.tensor([1, -0.5, -0.5, 2 / 3, 2 / 3, -2 / 3, -2 / 3, 0], dtype=torch.float64)
    torch.testing.assert_close(adv(b, "rloo"), expected)
    # grpo: the lone sample of group 2 gets 0 (std 0, centred 0)
    assert adv(b, "grpo")[7] == 0


def test_capo_hand_values_and_normalisers():
    # one correct (lpm -1) vs wrong at -1 + ln3 (more confident: misranked) and -1 - ln3 (well ranked), tau = 1:
    # s(correct, wrong1) = sigmoid(ln3) = 3/4, s(correct, wrong2) = sigmoid(-ln3) = 1/4
    b = full_batch([1, 0, 0], [5, 5, 5], lpm=[-1.0, -1.0 + LN3, -1.0 - LN3])
    # group: divide by tau * G = 3 -> correct (3/4 + 1/4)/3 = 1/3; wrong1 -(3/4)/3 = -1/4; wrong2 -(1/4)/3 = -1/12
    torch.testing.assert_close(adv(b, "capo", tau=1.0), torch.tensor([1 / 3, -1 / 4, -1 / 12], dtype=torch.float64))
    # pairs: divide by n_correct * n_wrong = 2
    torch.testing.assert_close(adv(b, "capo", tau=1.0, normalize="pairs"),
                               torch.tensor([1 / 2, -3 / 8, -1 / 8], dtype=torch.float64))
    # none: divide by tau only; tau = 0.5 doubles the argument: sigmoid(2 ln3) = 9/10, sigmoid(-2 ln3) = 1/10
    torch.testing.assert_close(adv(b, "capo", tau=0.5, normalize="none"),
                               torch.tensor([2.0, -1.8, -0.2], dtype=torch.float64))


def test_capo_mask_hand_values_masked_samples_stay_opponents():
    # correct sample 0 has PPL_ref = 3 > 2.5 (lucky guess); wrong sample 2 has PPL_ref = 1 < 1.05 (near miss)
    b = full_batch([1, 0, 0], [0, 0, 0], lpm=[-1.0, -1.0 + LN3, -1.0 - LN3], ref=[-LN3, -1.0, 0.0])
    a, info = compute_advantages(b, "capo", tau=1.0, mask="fixed", return_info=True)
    # sample 0 and 2 zeroed; sample 1 keeps -1/4: the masked correct sample is still its opponent
    torch.testing.assert_close(a, torch.tensor([0.0, -1 / 4, 0.0], dtype=torch.float64))
    assert info["mask_fraction"] == pytest.approx(2 / 3)
    assert info["ref_high"] == 2.5 and info["ref_low"] == 1.05
    assert info["mixed_group_fraction"] == 1.0


@pytest.mark.parametrize("mask", ["batch_quantile", "quantile"])  # a stateless "quantile" call is a first batch
def test_capo_quantile_mask_thresholds_are_batch_quantiles(mask):
    ref = torch.tensor([-0.1, -0.5, -0.9, -1.3, -0.2, -0.7, -1.1, -0.4], dtype=torch.float64)
    b = full_batch([1, 0, 1, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1], ref=ref)
    a, info = compute_advantages(b, "capo", mask=mask, return_info=True)
    log_ppl = -ref
    hi = math.exp(float(torch.quantile(log_ppl, 0.75)))
    lo = math.exp(float(torch.quantile(log_ppl, 0.25)))
    assert info["ref_high"] == pytest.approx(hi) and info["ref_low"] == pytest.approx(lo)
    ppl = torch.exp(log_ppl)
    correct = b.rewards > 0.5
    masked = (correct & (ppl > hi)) | (~correct & (ppl < lo))
    unmasked = adv(b, "capo")
    torch.testing.assert_close(a, torch.where(masked, torch.zeros_like(unmasked), unmasked))
    assert info["mask_fraction"] == pytest.approx(float(masked.double().mean()))


def test_seed_grpo_hand_values():
    # answers [a, a, b, c], count-based p = [1/2, 1/4, 1/4]: SE = 1.5 ln 2, SE_max = ln 4 -> x = alpha * 0.75
    b = RolloutBatch(rewards=[1.0, 1.0, 0.0, 0.0], group_ids=[0, 0, 0, 0], answer_ids=[7, 7, 8, 9])
    g = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # GRPO: mean 1/2, unbiased std sqrt(1/3)
    expected = torch.tensor([g, g, -g, -g]) / 1.75  # f = 1 / (1 + x), alpha = 1
    a, info = compute_advantages(b, "seed_grpo", base="grpo", alpha=1.0, return_info=True)
    torch.testing.assert_close(a, expected)
    assert info["semantic_entropy_mean"] == pytest.approx(1.5 * math.log(2), rel=1e-5)
    torch.testing.assert_close(adv(b, "seed_grpo", base="grpo", alpha=1.0, f="linear"),
                               torch.tensor([g, g, -g, -g]) * 0.25)
    torch.testing.assert_close(adv(b, "seed_grpo", base="grpo", f="exp", alpha=2.0),
                               torch.tensor([g, g, -g, -g]) * math.exp(-1.5))
    # the paper's default: Dr.GRPO base r - mean = +-1/2, alpha = 0.042 -> scale 1 / (1 + 0.042 * 0.75)
    torch.testing.assert_close(adv(b, "seed_grpo"), torch.tensor([0.5, 0.5, -0.5, -0.5]) / (1 + 0.042 * 0.75))
    torch.testing.assert_close(adv(b, "seed_grpo", alpha=1.0), torch.tensor([0.5, 0.5, -0.5, -0.5]) / 1.75)
    # probability-weighted: exp(lpm) = [.5, .5, .25, .75] / 2 -> p(a) = 1/2, p(b) = 1/8, p(c) = 3/8
    lpm = torch.log(torch.tensor([0.5, 0.5, 0.25, 0.75], dtype=torch.float64))
    b2 = full_batch([1, 1, 0, 0], [0, 0, 0, 0], lpm=lpm, answers=[7, 7, 8, 9])
    se = -(0.5 * math.log(0.5) + 0.125 * math.log(0.125) + 0.375 * math.log(0.375))
    expected2 = torch.tensor([g, g, -g, -g], dtype=torch.float64) / (1 + se / math.log(4))
    torch.testing.assert_close(adv(b2, "seed_grpo", base="grpo", alpha=1.0), expected2)
    # unanimous group: SE = 0, plain GRPO / Dr.GRPO
    b3 = RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0], answer_ids=[3, 3])
    torch.testing.assert_close(adv(b3, "seed_grpo", base="grpo"), adv(b3, "grpo"))
    torch.testing.assert_close(adv(b3, "seed_grpo"), adv(b3, "dr_grpo"))


def test_gcpo_hand_values():
    e1, e2 = [1.0, 0.0], [0.0, 2.0]  # orthogonal; norms do not matter
    # group of 4, rewards [1, 0, 0, 0], embeddings e1 e2 e1 e2 (uniform weights: no logprob_mean)
    b = RolloutBatch(rewards=[1.0, 0.0, 0.0, 0.0], group_ids=[0] * 4, embeddings=[e1, e2, e1, e2])
    cd = 1 - math.sqrt(0.5)  # 1 - ||(1/2, 1/2)||
    rd = math.sqrt(0.25 * 0.75) / 0.5  # population std / 0.5
    grpo = adv(b, "grpo")
    a, info = compute_advantages(b, "gcpo", return_info=True)
    torch.testing.assert_close(a, grpo * (1 - 0.5 * cd * (1 - rd)))
    assert info["cd_mean"] == pytest.approx(cd, rel=1e-5)
    assert info["bot_mean"] == pytest.approx(0.5, rel=1e-5)  # 1 - ||b||^2 = 1 - 1/2
    assert info["rd_mean"] == pytest.approx(math.sqrt(0.25 * 0.75), rel=1e-5)
    torch.testing.assert_close(adv(b, "gcpo", measure="barycentric"), grpo * (1 - 0.5 * 0.5 * (1 - rd)))
    # half-right group: rd = 1, scale 1 however much the responses disagree
    b2 = RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0], embeddings=[e1, e2])
    torch.testing.assert_close(adv(b2, "gcpo"), adv(b2, "grpo"))
    # probability-weighted barycentre: softmax(lpm) = [3/4, 1/4] -> b = (3/4, 1/4), BoT = 1 - 10/16 = 3/8
    b3 = RolloutBatch(rewards=[1.0, 0.0, 0.0], group_ids=[0, 0, 0], embeddings=[e1, e2, e2],
                      logprob_mean=[math.log(0.75), math.log(0.125), math.log(0.125)])
    _, info3 = compute_advantages(b3, "gcpo", measure="barycentric", return_info=True)
    assert info3["bot_mean"] == pytest.approx(1 - (0.75**2 + 0.25**2), rel=1e-5)


def test_codapo_hand_values():
    # rewards [1, 0, 0, 0], lpm all ln(1/2): c = 1/2, accuracy 1/4, d = 3/4, d_w = 1 - 4 (1/4)^2 = 3/4
    # w = 1/2 * 3/4 + 0.1 = 0.475; GRPO (eps 1e-6): mean 1/4, unbiased std 1/2
    b = full_batch([1, 0, 0, 0], [0, 0, 0, 0], lpm=[math.log(0.5)] * 4)
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64) / (0.5 + 1e-6) * 0.475
    a, info = compute_advantages(b, "codapo", return_info=True)
    torch.testing.assert_close(a, expected)
    assert info["weight_mean"] == pytest.approx(0.475)
    # half-right group: d_w = 1 -> w = c + 0.1
    b2 = full_batch([1, 0], [0, 0], lpm=[math.log(0.8)] * 2)
    torch.testing.assert_close(adv(b2, "codapo"), adv(b2, "grpo", eps=1e-6) * 0.9)
    # a one-row group, as the reference code (verl's mean 0 / std 1): r / (1 + 1e-6) times w; all right, d = 0,
    # d_w = 0, w = 0.1
    b3 = full_batch([1.0], [0], lpm=[math.log(0.8)])
    torch.testing.assert_close(adv(b3, "codapo"), torch.tensor([0.1 / (1 + 1e-6)], dtype=torch.float64))


def test_cde_hand_values():
    # r' = r + min(|r| / 2, -lpm): [1 + min(0.5, 0.2), 0 + min(0, 3)] = [1.2, 0]
    b = full_batch([1, 0], [0, 0], lpm=[-0.2, -3.0])
    s = math.sqrt(2 * 0.6**2) + 1e-4  # unbiased std of [1.2, 0]
    a, info = compute_advantages(b, "cde", return_info=True)
    torch.testing.assert_close(a, torch.tensor([0.6 / s, -0.6 / s], dtype=torch.float64))
    assert info["bonus_mean"] == pytest.approx(0.1)
    # bonus capped at |r| / kappa: lpm -3 -> min(0.5, 3) = 0.5; with {-1, 1} rewards wrong answers get it too
    b2 = full_batch([1, -1], [0, 0], lpm=[-3.0, -0.1])
    torch.testing.assert_close(adv(b2, "cde", scale=False), torch.tensor([1.2, -1.2], dtype=torch.float64))


# ------------------------------------------------------------------------------------------- properties


@st.composite
def batches(draw, min_groups=1, max_groups=5, max_size=6, uniform=False):
    n_groups = draw(st.integers(min_groups, max_groups))
    sizes = [draw(st.integers(1, max_size)) for _ in range(n_groups)]
    rewards, gids = [], []
    for g, size in enumerate(sizes):
        if uniform:
            value = draw(st.sampled_from([0.0, 1.0]))
            rewards += [value] * size
        else:
            rewards += [float(draw(st.integers(0, 1))) for _ in range(size)]
        gids += [g] * size
    n = len(rewards)
    floats = st.floats(-5.0, 0.0, allow_nan=False)
    lpm = draw(st.lists(floats, min_size=n, max_size=n))
    ref = draw(st.lists(floats, min_size=n, max_size=n))
    emb = draw(st.lists(st.lists(st.floats(-2, 2, allow_nan=False), min_size=3, max_size=3), min_size=n, max_size=n))
    answers = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return full_batch(rewards, gids, lpm=lpm, ref=ref, emb=emb, answers=answers)


ZERO_ON_UNIFORM = [("grpo", {}), ("dr_grpo", {}), ("rloo", {}), ("capo", {}), ("capo", {"normalize": "pairs"}),
                   ("capo", {"mask": "quantile"}), ("capo", {"mask": "batch_quantile"}), ("seed_grpo", {}), ("gcpo", {}),
                   ("gcpo", {"measure": "barycentric"})]


@SETTINGS
@given(batches(uniform=True))
def test_uniform_reward_groups_get_zero_advantage(b):
    for name, params in ZERO_ON_UNIFORM:
        a = adv(b, name, **params)
        assert torch.all(a == 0), (name, params, a)
    # codapo follows its reference code (verl's rule): a group of one row keeps r / (1 + eps) x w, the others 0
    one_row = torch.bincount(torch.unique(b.group_ids, return_inverse=True)[1])[
        torch.unique(b.group_ids, return_inverse=True)[1]] == 1
    assert torch.all(adv(b, "codapo")[~one_row] == 0)
    # cde shapes rewards with a confidence bonus, so only all-zero groups (no bonus: |r| = 0) stay at zero
    zero_groups = adv(b, "cde")[b.rewards == 0]
    assert torch.all(zero_groups == 0)


@SETTINGS
@given(batches())
def test_capo_huge_tau_is_dr_grpo(b):
    tau = 1e7
    torch.testing.assert_close(2 * tau * adv(b, "capo", tau=tau), adv(b, "dr_grpo"), atol=1e-5, rtol=0)


@SETTINGS
@given(st.lists(st.floats(-5.0, 0.0), min_size=4, max_size=8, unique=True), st.floats(0.2, 2.0), st.data())
def test_capo_misranked_samples_get_larger_weight(lpms, tau, data):
    lpms = sorted(lpms)
    assume(min(b - a for a, b in zip(lpms, lpms[1:])) >= 1e-3)  # distinct confidences
    n = len(lpms)
    n_correct = data.draw(st.integers(1, n - 1))
    perm = data.draw(st.permutations(range(n)))
    rewards = [1.0 if perm[i] < n_correct else 0.0 for i in range(n)]
    b = full_batch(rewards, [0] * n, lpm=lpms)
    a = adv(b, "capo", tau=tau)
    correct = [i for i in range(n) if rewards[i] == 1.0]
    wrong = [i for i in range(n) if rewards[i] == 0.0]
    # lpms ascend with the index: among correct samples the LESS confident gets the larger advantage,
    # among wrong samples the MORE confident gets the larger |advantage|
    for i, j in zip(correct, correct[1:]):
        assert a[i] > a[j] > 0
    for i, j in zip(wrong, wrong[1:]):
        assert -a[j] > -a[i] > 0
    # and a pair: misranked (correct less confident than wrong) beats well ranked in |A|
    b2 = full_batch([1, 0, 1, 0], [0, 0, 1, 1], lpm=[lpms[0], lpms[-1], lpms[-1], lpms[0]])
    a2 = adv(b2, "capo", tau=tau)
    assert a2[0] > a2[2] > 0 and -a2[1] > -a2[3] > 0


@pytest.mark.parametrize("name,params", [(n, {}) for n in ALL] + [("capo", {"mask": "fixed"}),
                                                                   ("capo", {"mask": "quantile", "tau": 0.01}),
                                                                   ("grpo_mask", {"mask": "quantile"}),
                                                                   ("gcpo", {"measure": "barycentric"})])
def test_finite_for_extreme_logprobs(name, params):
    n = 4096
    g = torch.Generator().manual_seed(1)
    b = RolloutBatch(
        rewards=(torch.rand(n, generator=g) < 0.5).float(),
        group_ids=torch.arange(n) // 16,
        logprob_mean=torch.where(torch.rand(n, generator=g) < 0.5, torch.tensor(-1e4), torch.tensor(1e4)),
        ref_logprob_mean=torch.where(torch.rand(n, generator=g) < 0.5, torch.tensor(-1e4), torch.tensor(1e4)),
        embeddings=torch.randn(n, 8, generator=g) * 1e4,
        answer_ids=torch.randint(0, 5, (n,), generator=g),
    )
    a = adv(b, name, **params)
    assert a.dtype == torch.float32 and a.shape == (n,)
    assert torch.isfinite(a).all()


EQUIVARIANT = [("grpo", {}), ("dr_grpo", {}), ("rloo", {}), ("capo", {}), ("capo", {"normalize": "pairs"}),
               ("capo", {"mask": "fixed"}), ("capo", {"mask": "quantile"}), ("capo", {"mask": "batch_quantile"}),
               ("seed_grpo", {}), ("gcpo", {}),
               ("gcpo", {"measure": "barycentric", "center": True}), ("gcpo", {"center": "batch", "standardize": True}),
               ("codapo", {}), ("cde", {}), ("grpo_mask", {"mask": "fixed"}), ("grpo_mask", {"mask": "quantile"})]


@SETTINGS
@given(batches(max_groups=4), st.data())
def test_equivariance_under_permutation_and_relabelling(b, data):
    n = len(b)
    perm = torch.tensor(data.draw(st.permutations(range(n))))
    n_groups = int(b.group_ids.max()) + 1
    new_ids = torch.tensor(data.draw(st.lists(st.integers(-10**9, 10**9), min_size=n_groups, max_size=n_groups,
                                              unique=True)))
    permuted = RolloutBatch(rewards=b.rewards[perm], group_ids=new_ids[b.group_ids][perm],
                            logprob_mean=b.logprob_mean[perm], ref_logprob_mean=b.ref_logprob_mean[perm],
                            embeddings=b.embeddings[perm], answer_ids=b.answer_ids[perm] * 3 + 5)  # negative ids mean "no answer"
    for name, params in EQUIVARIANT:
        torch.testing.assert_close(adv(permuted, name, **params), adv(b, name, **params)[perm], msg=name)


def test_grpo_equals_trl_formula():
    g = torch.Generator().manual_seed(0)
    n_groups, size = 32, 8
    rewards = torch.rand(n_groups * size, generator=g).round() * torch.rand(n_groups * size, generator=g)
    b = RolloutBatch(rewards=rewards, group_ids=torch.arange(n_groups).repeat_interleave(size))
    # TRL GRPOTrainer (scale_rewards="group"): view(-1, G), mean / std (Bessel), (r - mean) / (std + 1e-4)
    mean = rewards.view(-1, size).mean(dim=1).repeat_interleave(size)
    std = rewards.view(-1, size).std(dim=1).repeat_interleave(size)
    torch.testing.assert_close(adv(b, "grpo"), (rewards - mean) / (std + 1e-4))
    torch.testing.assert_close(adv(b, "dr_grpo"), rewards - mean)


def capo_reference(rewards, group_ids, lpm, tau, normalize):
    """Plain-Python CAPO, group by group, as the paper writes it (test oracle)."""
    out = [0.0] * len(rewards)
    for g in set(group_ids):
        idx = [i for i, x in enumerate(group_ids) if x == g]
        correct = [i for i in idx if rewards[i] > 0.5]
        wrong = [i for i in idx if rewards[i] <= 0.5]
        denom = {"group": tau * len(idx), "pairs": tau * max(1, len(correct) * len(wrong)), "none": tau}[normalize]
        sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
        for i in correct:
            out[i] = sum(sig((lpm[j] - lpm[i]) / tau) for j in wrong) / denom
        for j in wrong:
            out[j] = -sum(sig((lpm[j] - lpm[i]) / tau) for i in correct) / denom
    return torch.tensor(out, dtype=torch.float64)


@SETTINGS
@given(batches(max_groups=6, max_size=9), st.sampled_from(["group", "pairs", "none"]), st.floats(0.1, 3.0))
def test_capo_unequal_group_sizes_match_reference(b, normalize, tau):
    expected = capo_reference(b.rewards.tolist(), b.group_ids.tolist(), b.logprob_mean.tolist(), tau, normalize)
    torch.testing.assert_close(adv(b, "capo", tau=tau, normalize=normalize), expected)


def test_capo_blocks_over_groups_give_same_result(monkeypatch):
    g = torch.Generator().manual_seed(3)
    gids = torch.randint(0, 50, (400,), generator=g)
    b = full_batch((torch.rand(400, generator=g) < 0.4).double(), gids)
    whole = adv(b, "capo")
    monkeypatch.setattr(capo_module, "_MAX_PAIR_ELEMENTS", 7)  # forces one group per block
    torch.testing.assert_close(adv(b, "capo"), whole)


def test_capo_mask_zeroes_only_masked_samples():
    g = torch.Generator().manual_seed(4)
    n = 64
    b = full_batch((torch.rand(n, generator=g) < 0.5).double(), torch.arange(n) // 8,
                   ref=-torch.rand(n, generator=g, dtype=torch.float64) * 2)
    masked_adv = adv(b, "capo", mask="fixed", ref_high=2.0, ref_low=1.5)
    plain = adv(b, "capo")
    ppl = torch.exp(-b.ref_logprob_mean)
    correct = b.rewards > 0.5
    masked = (correct & (ppl > 2.0)) | (~correct & (ppl < 1.5))
    assert masked.any() and (~masked).any()
    assert torch.all(masked_adv[masked] == 0)
    torch.testing.assert_close(masked_adv[~masked], plain[~masked])


def test_capo_mask_without_reference_explains_fix():
    b = RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0], logprob_mean=[-0.1, -0.2])
    for mask in ("fixed", "quantile"):
        with pytest.raises(RolloutBatchError) as err:
            compute_advantages(b, "capo", mask=mask)
        message = str(err.value)
        assert "ref_logprob_mean" in message and "beta > 0" in message and "capo_mask" in message
    compute_advantages(b, "capo")  # no mask: fine


@pytest.mark.parametrize("name,field", [("capo", "logprob_mean"), ("codapo", "logprob_mean"), ("cde", "logprob_mean"),
                                        ("gcpo", "embeddings"), ("seed_grpo", "answer_ids")])
def test_missing_field_names_it(name, field):
    b = RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0])
    with pytest.raises(RolloutBatchError, match=field):
        compute_advantages(b, name)


@pytest.mark.parametrize("name,params", [("capo", {"tau": 0.0}), ("capo", {"normalize": "mean"}),
                                         ("capo", {"mask": "yes"}), ("gcpo", {"measure": "l2"}),
                                         ("gcpo", {"strength": 2.0}), ("seed_grpo", {"f": "log"}),
                                         ("seed_grpo", {"base": "rloo"}),
                                         ("cde", {"kappa": 0.0})])
def test_bad_parameters_raise(name, params):
    b = full_batch([1, 0], [0, 0])
    with pytest.raises(ValueError):
        compute_advantages(b, name, **params)


@pytest.mark.parametrize("name", ALL)
def test_output_dtype_follows_rewards(name):
    b = full_batch([1, 0, 0, 1], [0, 0, 1, 1], dtype=torch.float64)
    assert adv(b, name).dtype == torch.float64
    b32 = RolloutBatch(rewards=b.rewards.float(), group_ids=b.group_ids, logprob_mean=b.logprob_mean,
                       embeddings=b.embeddings.float(), answer_ids=b.answer_ids)
    assert adv(b32, name).dtype == torch.float32


def test_info_keys():
    b = full_batch([1, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1])
    _, info = compute_advantages(b, "capo", mask="quantile", return_info=True)
    assert {"mask_fraction", "mixed_group_fraction", "ref_high", "ref_low"} <= set(info)
    assert info["mixed_group_fraction"] == 0.5
    _, info = compute_advantages(b, "gcpo", return_info=True)
    assert {"cd_mean", "bot_mean", "rd_mean", "scale_mean"} <= set(info)
    assert all(isinstance(v, float) for v in info.values())


@pytest.mark.parametrize("n", [1, 2, 5, 100])
def test_selection_quantiles_equal_torch_quantile(n):
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    qs = (0.0, 0.25, 0.333, 0.75, 1.0)
    got = capo_module._quantiles(x, qs)
    for q, value in zip(qs, got):
        assert value == pytest.approx(float(torch.quantile(x, q)), abs=1e-12)


@pytest.mark.parametrize("sizes", [(4, 4, 4, 4), (3, 5, 1, 4)])
def test_layout_paths_agree(sizes):
    """Contiguous groups (views), shuffled equal-size groups (row gather) and unequal groups (padded scatter)
    all give the same advantages."""
    g = torch.Generator().manual_seed(sum(sizes))
    gids = torch.cat([torch.full((s,), i) for i, s in enumerate(sizes)])
    n = gids.numel()
    b = full_batch((torch.rand(n, generator=g) < 0.5).double(), gids, lpm=-torch.rand(n, generator=g, dtype=torch.float64))
    perm = torch.randperm(n, generator=g)
    shuffled = RolloutBatch(rewards=b.rewards[perm], group_ids=b.group_ids[perm], logprob_mean=b.logprob_mean[perm],
                            ref_logprob_mean=b.ref_logprob_mean[perm], embeddings=b.embeddings[perm],
                            answer_ids=b.answer_ids[perm])
    for name, params in [("capo", {}), ("capo", {"mask": "batch_quantile"}), ("gcpo", {}),
                         ("gcpo", {"measure": "barycentric"}), ("seed_grpo", {})]:
        torch.testing.assert_close(adv(shuffled, name, **params), adv(b, name, **params)[perm], msg=name)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_bf16_rewards_are_summed_in_float32(name):
    # one group of 300 rewards: bf16 group sums would be off by tenths (8 bits of mantissa)
    gen = torch.Generator().manual_seed(3)
    rewards = torch.rand(300, generator=gen).to(torch.bfloat16)
    group_ids = torch.zeros(300, dtype=torch.long)
    got = compute_advantages(RolloutBatch(rewards=rewards, group_ids=group_ids), name)
    want = compute_advantages(RolloutBatch(rewards=rewards.float(), group_ids=group_ids), name)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)


# ------------------------------------------------------------------------------------- rows without tokens


def batches_with_empty_rows(dtype=torch.float64):
    """(batch with lengths, the same batch restricted to its rows with tokens, keep mask). Rows 2, 5, 9 have no
    tokens and, as the adapters fill them, lpm = ref_lpm = 0 (perplexity 1); each would shift its group's mean."""
    g = torch.Generator().manual_seed(7)
    n = 12
    lengths = torch.tensor([5, 7, 0, 3, 4, 0, 6, 2, 9, 0, 1, 8])
    keep = lengths > 0
    fields = dict(
        rewards=torch.tensor([1, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0, 1], dtype=dtype),
        group_ids=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]),
        logprob_mean=torch.where(keep, -0.1 - torch.rand(n, generator=g, dtype=dtype), torch.zeros((), dtype=dtype)),
        ref_logprob_mean=torch.where(keep, -0.1 - torch.rand(n, generator=g, dtype=dtype),
                                     torch.zeros((), dtype=dtype)),
        embeddings=torch.randn(n, 4, generator=g, dtype=dtype),
        answer_ids=torch.tensor([1, 2, 2, 1, 3, 3, 4, 3, 5, 6, 6, 5]),
        lengths=lengths,
    )
    full = RolloutBatch(**fields)
    kept = RolloutBatch(**{k: v[keep] for k, v in fields.items()})
    return full, kept, keep


@pytest.mark.parametrize("name,params", EQUIVARIANT, ids=[f"{n}{p}" for n, p in EQUIVARIANT])
def test_rows_without_tokens_are_out_of_every_statistic(name, params):
    full, kept, keep = batches_with_empty_rows()
    a, info = compute_advantages(full, name, return_info=True, **params)
    want, want_info = compute_advantages(kept, name, return_info=True, **params)
    assert torch.all(a[~keep] == 0)
    torch.testing.assert_close(a[keep], want)
    assert info.pop("n_empty_rows") == 3 and want_info.pop("n_empty_rows") == 0
    assert info == pytest.approx(want_info)
    # the empty rows would have changed the kept rows' advantages
    with_them = RolloutBatch(**{**full.__dict__, "lengths": None})
    assert not torch.allclose(compute_advantages(with_them, name, **params)[keep], want)


def test_capo_quantile_thresholds_ignore_rows_without_tokens():
    full, kept, keep = batches_with_empty_rows()
    _, info = compute_advantages(full, "capo", mask="quantile", return_info=True)
    log_ppl = -full.ref_logprob_mean[keep]
    assert info["ref_high"] == pytest.approx(math.exp(float(torch.quantile(log_ppl, 0.75))))
    assert info["ref_low"] == pytest.approx(math.exp(float(torch.quantile(log_ppl, 0.25))))
    with_them = RolloutBatch(**{**full.__dict__, "lengths": None})
    _, info_with_them = compute_advantages(with_them, "capo", mask="quantile", return_info=True)
    assert info_with_them["ref_low"] != pytest.approx(info["ref_low"])
    assert info["ref_low"] > 1.0  # perplexity 1 of the empty rows no longer drags the lower quartile down


def test_user_estimators_see_only_rows_with_tokens_and_per_token_output_scatters():
    full, kept, keep = batches_with_empty_rows()
    seen = []

    def batch_centred(batch):  # a batch-wide statistic: any empty row in it would shift every advantage
        seen.append(len(batch))
        assert bool((batch.lengths > 0).all())
        return batch.rewards - batch.rewards.mean()

    a = compute_advantages(full, batch_centred)
    assert seen == [9]
    torch.testing.assert_close(a[keep], kept.rewards - kept.rewards.mean())
    assert torch.all(a[~keep] == 0)

    def per_token(batch):  # [N, T] advantages
        steps = torch.arange(1, 4, dtype=batch.rewards.dtype)
        return (batch.rewards - batch.rewards.mean())[:, None] * steps

    t = compute_advantages(full, per_token)
    assert t.shape == (12, 3)
    torch.testing.assert_close(t[keep], per_token(kept))
    assert torch.all(t[~keep] == 0)


def test_batch_without_any_tokens_gives_zeros():
    full, _, _ = batches_with_empty_rows()
    empty = RolloutBatch(**{**full.__dict__, "lengths": torch.zeros(12, dtype=torch.long)})

    def never(batch):  # pragma: no cover - must not be called
        raise AssertionError("estimator called on a batch without tokens")

    for estimator, params in [("grpo", {}), ("capo", {"mask": "quantile"}), (never, {})]:
        a, info = compute_advantages(empty, estimator, return_info=True, **params)
        assert a.shape == (12,) and a.dtype == full.rewards.dtype and torch.all(a == 0)
        assert info["n_empty_rows"] == 12


# ------------------------------------------------------------------------------ SEED: rows without an answer


def test_seed_grpo_negative_answer_id_is_a_singleton_cluster():
    r = [1.0, 0.0, 0.0, 1.0]
    unanswered = RolloutBatch(rewards=r, group_ids=[0] * 4, answer_ids=[5, -1, -1, 5])
    distinct = RolloutBatch(rewards=r, group_ids=[0] * 4, answer_ids=[5, 8, 9, 5])
    shared = RolloutBatch(rewards=r, group_ids=[0] * 4, answer_ids=[5, 8, 8, 5])
    # clusters {5, 5}, {-1}, {-1}: p = [1/2, 1/4, 1/4], SE = 1.5 ln 2, x = SE / ln 4 = 0.75; Dr.GRPO base +-1/2
    a, info = compute_advantages(unanswered, "seed_grpo", alpha=1.0, return_info=True)
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, -0.5, 0.5]) / 1.75)
    assert info["semantic_entropy_mean"] == pytest.approx(1.5 * math.log(2), rel=1e-5)
    torch.testing.assert_close(a, adv(distinct, "seed_grpo", alpha=1.0))
    assert not torch.allclose(a, adv(shared, "seed_grpo", alpha=1.0))
    # probability-weighted, several groups, any negative id: every unanswered row is its own cluster
    lpm = [-0.3, -1.2, -0.7, -0.2, -0.9, -0.4, -1.5, -0.6]
    many = full_batch([1, 0, 0, 1, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1, 1], lpm=lpm, answers=[4, -1, -3, 4, -1, 2, -1, 2])
    renamed = full_batch([1, 0, 0, 1, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1, 1], lpm=lpm, answers=[4, 10, 11, 4, 12, 2, 13, 2])
    torch.testing.assert_close(adv(many, "seed_grpo"), adv(renamed, "seed_grpo"))


# ----------------------------------------------------------------------------------------- CAPO tiny tau


def test_capo_tiny_tau_saturates_without_nan():
    # tau -> 0: sigmoid((lpm_j - lpm_i) / tau) -> 1 if lpm_j > lpm_i, 1/2 if equal, 0 if less; tau * A is then
    # group 0 (correct -1; wrong -0.5, -2): [1, -1, 0] / 3; group 1 (correct -1, -3; wrong -1): [1/2, -3/2, 1] / 3
    lpm = [-10.0, -5.0, -20.0, -10.0, -10.0, -30.0]  # lpm / tau overflows float32 at tau = 2e-38
    expected = torch.tensor([1 / 3, -1 / 3, 0.0, 1 / 6, -1 / 2, 1 / 3], dtype=torch.float64)
    for dtype, tau in [(torch.float32, 2e-38), (torch.float64, 1e-40), (torch.float64, 1e-307)]:
        b = full_batch([1, 0, 0, 1, 0, 1], [0, 0, 0, 1, 1, 1], lpm=lpm, dtype=dtype)
        a = adv(b, "capo", tau=tau)
        assert torch.isfinite(a).all(), (dtype, tau, a)
        torch.testing.assert_close(a.double() * tau, expected, rtol=1e-5, atol=0)


def test_capo_tau_too_small_for_the_dtype_is_rejected():
    b = full_batch([1, 0, 0], [0, 0, 0], lpm=[-1.0, -0.5, -2.0], dtype=torch.float32)
    # the advantages reach 1 / tau = 1e40, beyond float32's range: a clear error rather than inf / NaN
    with pytest.raises(ValueError, match=r"capo: tau = 1e-40 is too small"):
        adv(b, "capo", tau=1e-40)


# ----------------------------------------------------------------------------------- CAPO frozen quantile mask


def _ref_batch(seed: int, n: int = 32, shift: float = 0.0, dtype=torch.float32) -> RolloutBatch:
    """Mixed groups of 8 whose reference log-probs are drawn around ``-(0.5 + shift)``."""
    g = torch.Generator().manual_seed(seed)
    return RolloutBatch(rewards=(torch.rand(n, generator=g) < 0.5).to(dtype), group_ids=torch.arange(n) // 8,
                        logprob_mean=-torch.rand(n, generator=g, dtype=dtype),
                        ref_logprob_mean=-(0.5 + shift) - 0.5 * torch.rand(n, generator=g, dtype=dtype))


def test_frozen_quantile_mask_freezes_first_batch_quartiles():
    state = capo_module.FrozenQuantileMask()
    params = {"mask": "quantile", "tau": 0.6}
    first = _ref_batch(0)
    used = capo_module.frozen_quantile_params(params, batch=first, state=state)
    log_ppl = -first.ref_logprob_mean
    expected = (math.exp(float(torch.quantile(log_ppl, 0.75))), math.exp(float(torch.quantile(log_ppl, 0.25))))
    assert (used["ref_high"], used["ref_low"]) == pytest.approx(expected, rel=1e-6)
    assert state.frozen and state.thresholds == (used["ref_high"], used["ref_low"])
    # on the first batch, frozen == that batch's quantiles: the same advantages as batch_quantile
    torch.testing.assert_close(adv(first, "capo", **used), adv(first, "capo", mask="batch_quantile"))
    fractions, batch_fractions = [], []
    for seed, shift in [(1, 0.0), (2, 0.3), (3, -0.3)]:  # later batches with other perplexity distributions
        later = _ref_batch(seed, shift=shift)
        p = capo_module.frozen_quantile_params(params, batch=later, state=state)
        assert (p["ref_high"], p["ref_low"]) == state.thresholds  # constant
        a, info = compute_advantages(later, "capo", return_info=True, **p)
        torch.testing.assert_close(a, adv(later, "capo", mask="fixed", ref_high=p["ref_high"], ref_low=p["ref_low"]))
        fractions.append(info["mask_fraction"])
        _, batch_info = compute_advantages(later, "capo", mask="batch_quantile", return_info=True)
        batch_fractions.append(batch_info["mask_fraction"])
    # frozen thresholds: the dropped fraction follows the batch (a shift down in log-PPL drops more wrong samples,
    # up more correct ones); per-batch quartiles drop about the same fraction every time
    assert max(fractions) - min(fractions) > 0.2
    assert max(batch_fractions) - min(batch_fractions) < max(fractions) - min(fractions)


def test_frozen_quantile_mask_pools_first_k_batches_and_round_trips():
    import json

    a, b, c = (-_ref_batch(s, shift=0.2 * s).ref_logprob_mean for s in range(3))
    state = capo_module.FrozenQuantileMask(warmup_batches=2)
    q = lambda x: (math.exp(float(torch.quantile(x, 0.75))), math.exp(float(torch.quantile(x, 0.25))))  # noqa: E731
    assert state.update(a) == pytest.approx(q(a), rel=1e-6) and not state.frozen
    # mid-warmup checkpoint: the pool travels in the state dict
    saved = json.loads(json.dumps(state.state_dict()))
    restored = capo_module.FrozenQuantileMask(warmup_batches=2)
    restored.load_state_dict(saved)
    pooled = torch.cat([a, b])
    assert restored.update(b) == pytest.approx(q(pooled), rel=1e-6) and restored.frozen
    assert state.update(b) == pytest.approx(q(pooled), rel=1e-6)
    assert restored.update(c) == restored.thresholds == state.update(c)  # frozen after batch K = 2
    assert restored.batches_seen == 2
    # peek (evaluation) never changes the state
    fresh = capo_module.FrozenQuantileMask()
    assert fresh.peek(a) == pytest.approx(q(a), rel=1e-6) and not fresh.frozen and fresh.batches_seen == 0
    with pytest.raises(ValueError, match="configured"):
        capo_module.FrozenQuantileMask(high_quantile=0.9).load_state_dict(saved)
    with pytest.raises(ValueError):
        capo_module.FrozenQuantileMask(warmup_batches=0)


def test_frozen_quantile_mask_from_params_and_empty_rows():
    seeded = capo_module.FrozenQuantileMask.from_params({"mask": "quantile", "ref_high": 3.0, "ref_low": 1.2})
    assert seeded.frozen and seeded.thresholds == pytest.approx((3.0, 1.2), rel=1e-12)
    # rows without tokens enter no statistic: the frozen quartiles are those of the rows with tokens
    full, kept, keep = batches_with_empty_rows()
    state = capo_module.FrozenQuantileMask()
    used = capo_module.frozen_quantile_params({"mask": "quantile"}, batch=full, state=state)
    assert used["ref_low"] == pytest.approx(math.exp(float(torch.quantile(-full.ref_logprob_mean[keep], 0.25))))
    # other masks pass through; a quantile mask without the reference is left for the estimator to explain
    assert capo_module.frozen_quantile_params({"mask": "fixed"}, batch=full, state=state) == {"mask": "fixed"}
    no_ref = RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0], logprob_mean=[-0.1, -0.2])
    params = capo_module.frozen_quantile_params({"mask": "quantile"}, batch=no_ref, state=capo_module.FrozenQuantileMask())
    with pytest.raises(RolloutBatchError, match="ref_logprob_mean"):
        compute_advantages(no_ref, "capo", **params)


def test_capo_quantile_with_thresholds_equals_fixed_and_fixed_defaults_are_the_papers():
    b = _ref_batch(5, dtype=torch.float64)
    torch.testing.assert_close(adv(b, "capo", mask="quantile", ref_high=1.9, ref_low=1.7),
                               adv(b, "capo", mask="fixed", ref_high=1.9, ref_low=1.7))
    _, info = compute_advantages(b, "capo", mask="fixed", return_info=True)
    assert (info["ref_high"], info["ref_low"]) == pytest.approx((2.5, 1.05))
    with pytest.raises(ValueError, match="both"):
        compute_advantages(b, "capo", mask="quantile", ref_high=1.9)
    # batch_quantile ignores ref_high / ref_low
    torch.testing.assert_close(adv(b, "capo", mask="batch_quantile", ref_high=1.9, ref_low=1.7),
                               adv(b, "capo", mask="batch_quantile"))


# ----------------------------------------------------------------------------------- GRPO + CAPO's noise mask


def test_grpo_mask_hand_values_masked_samples_still_count_in_mean_and_std():
    # group 0 = [1, 1, 0, 0]: correct sample 0 has PPL_ref = 3 > 2.5 (a lucky guess), wrong sample 3 has PPL_ref = 1
    # < 1.05 (a near miss); samples 1 and 2 have PPL_ref = e^0.5 = 1.65, inside both thresholds. Group 1 = [1, 0, 0],
    # nothing masked.
    b = full_batch([1, 1, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 1, 1], ref=[-LN3, -0.5, -0.5, 0.0, -0.5, -0.5, -0.5])
    a, info = compute_advantages(b, "grpo_mask", mask="fixed", return_info=True)
    # group 0: mean 1/2, unbiased std sqrt(4 (1/2)^2 / 3) = sqrt(1/3) over ALL four samples, masked ones included
    # (leaving them out, [1, 0] would give 0.5 / sqrt(1/2) = 0.707 instead of 0.866); group 1 as in plain GRPO
    s = math.sqrt(1 / 3) + 1e-4
    expected = torch.tensor([0.0, 0.5 / s, -0.5 / s, 0.0, 2 / 3 / s, -1 / 3 / s, -1 / 3 / s], dtype=torch.float64)
    torch.testing.assert_close(a, expected)
    assert info == {"mask_fraction": pytest.approx(2 / 7), "ref_high": 2.5, "ref_low": 1.05}
    # unmasked samples: exactly plain GRPO's advantage
    kept = torch.tensor([False, True, True, False, True, True, True])
    assert torch.equal(a[kept], adv(b, "grpo")[kept])
    # the same mask as CAPO's: the samples capo's mask zeroes are the ones grpo_mask zeroes
    capo_masked = adv(b, "capo", mask="fixed") == 0
    assert torch.equal(capo_masked & (adv(b, "capo") != 0), ~kept)


def test_grpo_mask_frozen_quantile_thresholds_are_the_first_batchs():
    state = capo_module.FrozenQuantileMask()
    params = {"mask": "quantile"}
    first, later = _ref_batch(0, dtype=torch.float64), _ref_batch(1, shift=0.3, dtype=torch.float64)
    p1 = capo_module.frozen_quantile_params(params, batch=first, state=state)
    p2 = capo_module.frozen_quantile_params(params, batch=later, state=state)
    log_ppl = -first.ref_logprob_mean
    expected = (math.exp(float(torch.quantile(log_ppl, 0.75))), math.exp(float(torch.quantile(log_ppl, 0.25))))
    assert (p1["ref_high"], p1["ref_low"]) == (p2["ref_high"], p2["ref_low"]) == state.thresholds
    assert state.thresholds == pytest.approx(expected, rel=1e-12)
    a, info = compute_advantages(later, "grpo_mask", return_info=True, **p2)
    assert (info["ref_high"], info["ref_low"]) == pytest.approx(expected, rel=1e-12)
    # the later batch with the frozen thresholds = mask="fixed" at those values; its own quartiles differ
    torch.testing.assert_close(a, adv(later, "grpo_mask", mask="fixed", ref_high=p2["ref_high"], ref_low=p2["ref_low"]))
    _, own = compute_advantages(later, "grpo_mask", mask="batch_quantile", return_info=True)
    assert own["ref_high"] != pytest.approx(expected[0], rel=1e-3)
    # on the first batch, frozen = that batch's quantiles
    torch.testing.assert_close(adv(first, "grpo_mask", **p1), adv(first, "grpo_mask", mask="batch_quantile"))


def test_grpo_mask_errors_and_inputs():
    from calibrl.advantages import estimator_inputs

    assert estimator_inputs("grpo_mask", {"mask": "quantile"}) == {"ref_logprob_mean"}
    no_ref = RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0])
    with pytest.raises(RolloutBatchError) as err:
        compute_advantages(no_ref, "grpo_mask", mask="quantile")
    message = str(err.value)
    assert "'grpo_mask'" in message and "ref_logprob_mean" in message and "capo_mask" in message and "'grpo'" in message
    b = full_batch([1, 0], [0, 0])
    for params in ({}, {"mask": "none"}, {"mask": "yes"}):  # without a mask it would be grpo: no default
        with pytest.raises(ValueError, match="grpo_mask: mask must be one of"):
            compute_advantages(b, "grpo_mask", **params)
    with pytest.raises(ValueError, match="both"):
        compute_advantages(b, "grpo_mask", mask="quantile", ref_high=2.0)
    with pytest.raises(ValueError, match="must be > 0"):
        compute_advantages(b, "grpo_mask", mask="fixed", ref_high=-1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        compute_advantages(b, "grpo_mask", mask="batch_quantile", ref_low_quantile=1.5)


# ----------------------------------------------------------------------------------- GCPO options


def _gcpo_batch(common: torch.Tensor | None = None, seed: int = 0) -> RolloutBatch:
    """6 groups of 4 with one correct answer each (equal RD), embeddings [24, 16] whose within-group spread grows
    with the group index; ``common`` is added to every embedding."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(6, 16, generator=g, dtype=torch.float64) * 3
    spread = torch.tensor([0.1, 0.4, 0.8, 1.6, 3.2, 6.4], dtype=torch.float64)
    emb = centres.repeat_interleave(4, 0) + spread.repeat_interleave(4)[:, None] * torch.randn(
        24, 16, generator=g, dtype=torch.float64)
    if common is not None:
        emb = emb + common
    return RolloutBatch(rewards=torch.tensor([1.0, 0.0, 0.0, 0.0] * 6, dtype=torch.float64),
                        group_ids=torch.arange(24) // 4, embeddings=emb)


def _cosine_dispersion(emb: torch.Tensor) -> torch.Tensor:
    """CD per group of 4 rows, computed directly: 1 - || mean of unit vectors ||."""
    unit = emb / emb.norm(dim=1, keepdim=True)
    return 1 - unit.view(-1, 4, emb.shape[1]).mean(1).norm(dim=1)


def test_gcpo_centring_makes_disagreement_invariant_to_a_common_vector():
    plain = _gcpo_batch()
    shifted = _gcpo_batch(common=torch.full((16,), 40.0, dtype=torch.float64))
    for measure in ("cosine", "barycentric"):
        torch.testing.assert_close(adv(shifted, "gcpo", measure=measure, center="batch"),
                                   adv(plain, "gcpo", measure=measure, center="batch"))
    _, info_plain = compute_advantages(plain, "gcpo", return_info=True)
    _, info_shifted = compute_advantages(shifted, "gcpo", return_info=True)
    # un-centred: the common vector swamps the directions, CD collapses towards 0
    assert info_shifted["cd_mean"] < 0.1 * info_plain["cd_mean"]
    # centring = cosine dispersion of e - mean_batch(e), by hand
    _, info = compute_advantages(shifted, "gcpo", center="batch", return_info=True)
    centred = shifted.embeddings - shifted.embeddings.mean(0)
    assert info["cd_mean"] == pytest.approx(float(_cosine_dispersion(centred).mean()), rel=1e-9)
    torch.testing.assert_close(adv(shifted, "gcpo", center=True), adv(shifted, "gcpo", center="batch"))


def test_gcpo_standardized_weights_hand_values_range_and_order():
    b = _gcpo_batch(common=torch.full((16,), 40.0, dtype=torch.float64))
    strength = 0.6
    a, info = compute_advantages(b, "gcpo", center="batch", standardize=True, strength=strength, return_info=True)
    grpo = adv(b, "grpo")
    scale = (a / grpo).view(6, 4)
    assert torch.allclose(scale, scale[:, :1].expand(6, 4))  # one factor per group
    scale = scale[:, 0]
    # by hand: u = CD * (1 - rd), z-scored over the 6 mixed groups (population std), 1 - strength * sigmoid(z)
    cd = _cosine_dispersion(b.embeddings - b.embeddings.mean(0))
    rd = math.sqrt(0.25 * 0.75) / 0.5
    u = cd * (1 - rd)
    z = (u - u.mean()) / (u.std(unbiased=False) + 1e-8)
    torch.testing.assert_close(scale, 1 - strength * torch.sigmoid(z))
    assert bool(((scale > 1 - strength) & (scale < 1)).all())
    # the groups' spread grows with the index: the damping follows the disagreement
    assert bool((torch.diff(cd) > 0).all()) and bool((torch.diff(scale) < 0).all())
    assert float(scale.max() - scale.min()) > 0.3 * strength  # it acts: the un-standardised range is tiny
    plain_scale = (adv(b, "gcpo", center="batch", strength=strength) / grpo).view(6, 4)[:, 0]
    assert float(plain_scale.max() - plain_scale.min()) < float(scale.max() - scale.min()) / 3


def test_gcpo_standardize_uses_mixed_groups_only_and_defaults_are_unchanged():
    b = _gcpo_batch()
    # a uniform-reward group added: its advantage stays 0 and it does not move the other groups' z-scores
    extra = RolloutBatch(rewards=torch.cat([b.rewards, torch.ones(4, dtype=torch.float64)]),
                         group_ids=torch.arange(28) // 4,
                         embeddings=torch.cat([b.embeddings, 50 * torch.randn(4, 16, dtype=torch.float64)]))
    with_extra = adv(extra, "gcpo", standardize=True)
    assert torch.all(with_extra[24:] == 0)
    torch.testing.assert_close(with_extra[:24], adv(b, "gcpo", standardize=True))
    # a single mixed group: z = 0, scale 1 - strength / 2
    one = RolloutBatch(rewards=b.rewards[:4], group_ids=b.group_ids[:4], embeddings=b.embeddings[:4])
    torch.testing.assert_close(adv(one, "gcpo", standardize=True), adv(one, "grpo") * 0.75)
    # defaults: exactly the first reading's formula, computed here independently
    cd = _cosine_dispersion(b.embeddings)
    rd = math.sqrt(0.25 * 0.75) / 0.5
    expected = adv(b, "grpo") * (1 - 0.5 * cd * (1 - rd)).repeat_interleave(4)
    torch.testing.assert_close(adv(b, "gcpo"), expected)
    torch.testing.assert_close(adv(b, "gcpo", center=False, standardize=False), expected)
    torch.testing.assert_close(adv(b, "gcpo", center="none"), expected)
    for bad in ({"center": "whiten"}, {"standardize": "yes"}):
        with pytest.raises(ValueError):
            compute_advantages(b, "gcpo", **bad)


def test_a_registration_declares_inputs_parameters_and_ranking():
    from calibrl.advantages import estimator_inputs, estimator_spec, register_estimator
    from calibrl.advantages.registry import on_register

    heard = []
    on_register(heard.append)

    @register_estimator("test/declared", inputs=("answer_ids",), ranks_by="correctness", overwrite=True)
    def declared(batch, *, scale: float = 1.0, mode: str | None = None, count: int = 2):
        return scale * batch.rewards

    spec = estimator_spec("test/declared")
    assert heard[-1] is spec and spec.fn is declared
    assert spec.inputs == {"answer_ids"} and spec.ranks_by == "correctness" and spec.noise_mask == "no"
    assert {k: (p.annotation, p.default) for k, p in spec.params.items()} == {
        "scale": (float, 1.0), "mode": (str | None, None), "count": (int, 2)}
    assert estimator_inputs("test/declared", {"mask": "fixed"}) == {"answer_ids"}  # no noise mask: no reference

    @register_estimator("test/undeclared", overwrite=True)
    def undeclared(batch, **params):  # the default inputs (what a user's estimator received before), unchecked
        return batch.rewards

    assert estimator_spec("test/undeclared").inputs == {"logprob_mean"}
    assert estimator_spec("test/undeclared").params is None
    # capo reads the reference only with a mask; grpo_mask always
    assert estimator_inputs("capo", {}) == {"logprob_mean"}
    assert estimator_inputs("capo", {"mask": "quantile"}) == {"logprob_mean", "ref_logprob_mean"}
    # the same definition again is no clash; another function under a taken name is
    register_estimator("test/declared", inputs=("answer_ids",))(declared)
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("test/declared")(lambda batch: batch.rewards)
    with pytest.raises(ValueError, match="not RolloutBatch fields"):
        register_estimator("test/bad", inputs={"logprobs"})
    with pytest.raises(ValueError, match="ranks_by"):
        register_estimator("test/bad", ranks_by="accuracy")
    with pytest.raises(ValueError, match="'omega' is not one of its parameters"):
        register_estimator("test/bad", annealed="omega")(declared)
    with pytest.raises(KeyError, match="registered:"):
        estimator_spec("test/bad")


@pytest.mark.parametrize("returned,said", [
    (lambda b: torch.full_like(b.rewards, float("nan")), "returned nan for 4 of 4 rows (row 0 and more)"),
    (lambda b: b.rewards.clone().index_fill_(0, torch.tensor([2]), float("-inf")), "returned -inf for 1 of 4 rows"),
    (lambda b: b.rewards[:3], "returned shape (3,), expected (4,) or (4, T)"),
    (lambda b: b.rewards.tolist(), "returned list, not a torch tensor"),
    (lambda b: (b.rewards, [1.0]), "returned info of type list, not a dict"),
    (lambda b: b.rewards.to(torch.complex64), "returned a torch.complex64 tensor, not real numbers"),
])
def test_every_estimator_output_is_checked_at_every_call(returned, said):
    """What an estimator returns is checked by compute_advantages, whoever wrote it: a tensor with one row per
    completion, finite values, a dict of diagnostics; else an EstimatorOutputError naming the estimator."""
    from calibrl.advantages import EstimatorOutputError

    batch = RolloutBatch(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group_ids=torch.zeros(4, dtype=torch.long))

    def odd(b):
        return returned(b)

    with pytest.raises(EstimatorOutputError, match=re.escape(f"estimator 'odd' {said}")):
        compute_advantages(batch, odd)


def test_every_builtin_estimator_gives_finite_advantages_on_edge_groups():
    """One-row groups, all-equal rewards, all-equal log-probs: no built-in estimator returns NaN or inf (the
    output check would stop a run that did)."""
    from calibrl.advantages import estimator_specs

    rows = dict(rewards=torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), group_ids=torch.tensor([0, 0, 1, 2, 2, 3]),
                logprob_mean=torch.full((6,), -0.5), ref_logprob_mean=torch.full((6,), -0.5),
                embeddings=torch.ones(6, 3), answer_ids=torch.tensor([1, 1, 2, 3, 3, 4]),
                stated_confidence=torch.full((6,), 0.5), confidence_start=torch.full((6,), 2),
                self_certainty=torch.full((6,), 1.0), lengths=torch.full((6,), 4))
    for spec in estimator_specs():
        if not spec.fn.__module__.startswith("calibrl.advantages."):
            continue
        params = {"mask": "fixed"} if spec.noise_mask == "required" else {}
        advantages = compute_advantages(RolloutBatch(**rows), spec.name, **params)
        assert torch.isfinite(advantages).all(), spec.name


def test_capo_parameters_have_one_check_for_the_config_and_the_estimator():
    """The TRL config and the estimators run the same check (calibrl.advantages.capo.check_capo_params), named by
    the config's fields in the one and by the estimator's parameters in the other."""
    from calibrl.advantages.capo import check_capo_params
    from calibrl.trl.config import CalibratedGRPOConfig

    bad = {"ref_high_quantile": 0.5, "ref_low_quantile": 0.9}
    with pytest.raises(ValueError, match=r"^capo: ref_low_quantile \(0.9\) must not exceed ref_high_quantile"):
        check_capo_params(bad)
    with pytest.raises(ValueError, match=r"^capo_ref_low_quantile \(0.9\) must not exceed capo_ref_high_quantile"):
        CalibratedGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, capo_ref_high_quantile=0.5, capo_ref_low_quantile=0.9)
    batch = RolloutBatch(rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]),
                         logprob_mean=torch.tensor([-0.1, -0.2]), ref_logprob_mean=torch.tensor([-0.1, -0.2]))
    with pytest.raises(ValueError, match=r"^capo: ref_low_quantile \(0.9\) must not exceed"):
        compute_advantages(batch, "capo", mask="batch_quantile", **bad)
    for name, value in (("tau", 0.0), ("ref_high", float("inf")), ("ref_quantile_batches", 0), ("mask", "median")):
        with pytest.raises(ValueError, match=rf"^capo_{name} "):
            CalibratedGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, **{f"capo_{name}": value})
