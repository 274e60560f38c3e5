"""calibrl.losses: PPO-clip / GSPO (against TRL 1.16's own _compute_loss), aggregations, k3 KL, decision-token
calibration loss, SimKO. Hand-worked values and autograd checks; CPU, well under a second each."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from calibrl.losses import (
    aggregate_loss,
    chosen_classes,
    decision_token_loss,
    find_decision_positions,
    gather_decision_logits,
    kl_k3,
    policy_loss,
    simko_policy_loss,
    zero_decision_advantages,
)
from calibrl.losses.simko import row_quantile

AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

# ----------------------------------------------------------------------------------------------------- helpers


def _batch(n=4, t=6, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g, dtype=dtype) * 3
    logp = (old + 0.3 * torch.randn(n, t, generator=g, dtype=dtype)).requires_grad_(True)
    mask = torch.ones(n, t, dtype=dtype)
    for i in range(n):  # ragged lengths, at least 2 tokens
        mask[i, 2 + (i * 3) % (t - 1):] = 0
    adv = torch.randn(n, generator=g, dtype=dtype)
    return logp, old, mask, adv


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x, retain_graph=True)
    return g


# ----------------------------------------------------------------------------------------------------- aggregation


def test_aggregations_hand_worked_2x3():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate_loss(per_token, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert aggregate_loss(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4.0) / 2)
    assert aggregate_loss(per_token, mask, "seq-mean-token-sum").item() == pytest.approx((3.0 + 4.0) / 2)
    # Dr.GRPO: sum / (N * max_completion_length); default length is T = 3
    assert aggregate_loss(per_token, mask, "seq-mean-token-sum-norm").item() == pytest.approx(7 / (2 * 3))
    assert aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", max_completion_length=4).item() == \
        pytest.approx(7 / (2 * 4))


def test_aggregation_empty_rows_and_errors():
    per_token = torch.ones(2, 3)
    mask = torch.zeros(2, 3)
    for mode in AGGS:
        assert aggregate_loss(per_token, mask, mode).item() == 0.0
    with pytest.raises(ValueError, match="unknown mode"):
        aggregate_loss(per_token, mask, "sum")
    with pytest.raises(ValueError, match="differ"):
        aggregate_loss(per_token, torch.ones(2, 2))


# ----------------------------------------------------------------------------------------------------- PPO-clip


@pytest.mark.parametrize("aggregation", AGGS)
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_gradient_at_ratio_one_is_minus_advantage_over_normaliser(aggregation, ratio_level):
    logp, _, mask, adv = _batch()
    loss, _ = policy_loss(logprobs=logp, old_logprobs=logp.detach(), advantages=adv, completion_mask=mask,
                          aggregation=aggregation, ratio_level=ratio_level, max_completion_length=10)
    n, t = mask.shape
    normaliser = {
        "token-mean": mask.sum().expand(n, 1),
        "seq-mean-token-mean": n * mask.sum(-1, keepdim=True),
        "seq-mean-token-sum": torch.full((n, 1), float(n), dtype=mask.dtype),
        "seq-mean-token-sum-norm": torch.full((n, 1), float(n * 10), dtype=mask.dtype),
    }[aggregation]
    expected = -adv.unsqueeze(1) * mask / normaliser
    torch.testing.assert_close(_grad(loss, logp), expected)
    assert loss.item() == pytest.approx((-adv.unsqueeze(1) * mask / normaliser).sum().item())


def _single_token_grad(ratio, advantage, eps_low=0.2, eps_high=None):
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss(logprobs=logp, old_logprobs=torch.zeros(1, 1, dtype=torch.float64),
                                advantages=torch.tensor([advantage], dtype=torch.float64),
                                completion_mask=torch.ones(1, 1), eps_low=eps_low, eps_high=eps_high)
    return _grad(loss, logp).item(), metrics


def test_clipping_zeroes_gradient_only_on_the_side_that_matches_the_advantage_sign():
    # A > 0: ratio above 1 + eps is clipped (no gradient), below 1 - eps is not (PPO keeps the un-clipped term)
    g, m = _single_token_grad(1.5, 1.0)
    assert g == 0.0 and m["clip_fraction_high"] == 1.0 and m["clip_fraction"] == 1.0
    g, m = _single_token_grad(0.5, 1.0)
    assert g == pytest.approx(-0.5) and m["clip_fraction"] == 0.0
    # A < 0: ratio below 1 - eps is clipped, above 1 + eps is not
    g, m = _single_token_grad(0.5, -1.0)
    assert g == 0.0 and m["clip_fraction_low"] == 1.0
    g, m = _single_token_grad(1.5, -1.0)
    assert g == pytest.approx(1.5) and m["clip_fraction"] == 0.0
    # inside the range the gradient is -A * r
    g, _ = _single_token_grad(1.1, 2.0)
    assert g == pytest.approx(-2.2)


def test_asymmetric_clip():
    # eps_low 0.2, eps_high 0.28 (DAPO's clip-higher): 1.25 is inside for A > 0, 1.3 outside
    assert _single_token_grad(1.25, 1.0, 0.2, 0.28)[0] == pytest.approx(-1.25)
    assert _single_token_grad(1.30, 1.0, 0.2, 0.28)[0] == 0.0
    # the low side still uses eps_low
    assert _single_token_grad(0.78, -1.0, 0.2, 0.28)[0] == 0.0
    assert _single_token_grad(0.82, -1.0, 0.2, 0.28)[0] == pytest.approx(0.82)
    # eps_high None -> symmetric
    assert _single_token_grad(1.25, 1.0, 0.2, None)[0] == 0.0


@pytest.mark.parametrize("aggregation", AGGS)
def test_gspo_equals_token_level_when_every_token_has_the_same_ratio(aggregation):
    _, old, mask, adv = _batch(seed=3)
    shift = torch.tensor([0.05, -0.4, 0.5, 0.0], dtype=torch.float64)  # in and out of the clip range
    results = {}
    for level in ("token", "sequence"):
        logp = (old + shift.unsqueeze(1)).requires_grad_(True)
        loss, metrics = policy_loss(logprobs=logp, old_logprobs=old, advantages=adv, completion_mask=mask,
                                    ratio_level=level, aggregation=aggregation)
        results[level] = (loss.detach(), _grad(loss, logp), metrics)
    torch.testing.assert_close(results["token"][0], results["sequence"][0])
    torch.testing.assert_close(results["token"][1], results["sequence"][1])
    assert results["token"][2] == pytest.approx(results["sequence"][2])


def test_sequence_ratio_is_geometric_mean_over_masked_tokens():
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.tensor([[0.1, 0.3, 5.0, 9.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    _, metrics = policy_loss(logprobs=logp, old_logprobs=old, advantages=torch.ones(1, dtype=torch.float64),
                             completion_mask=mask, ratio_level="sequence", eps_low=1.0)
    assert metrics["ratio_mean"] == pytest.approx(math.exp(0.2))


def test_kl_k3_hand_value_and_zero_when_equal():
    logp = torch.tensor([[0.0, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[math.log(2.0), -1.0]], dtype=torch.float64)
    torch.testing.assert_close(kl_k3(logp, ref), torch.tensor([[1.0 - math.log(2.0), 0.0]], dtype=torch.float64))
    x = torch.randn(3, 5)
    assert torch.equal(kl_k3(x, x), torch.zeros(3, 5))
    assert (kl_k3(torch.randn(50), torch.randn(50)) >= 0).all()


@pytest.mark.parametrize("aggregation", AGGS)
def test_kl_term_is_coef_times_aggregated_k3(aggregation):
    logp, old, mask, adv = _batch(seed=5)
    ref = old + 0.2
    base, _ = policy_loss(logprobs=logp, old_logprobs=old, advantages=adv, completion_mask=mask,
                          aggregation=aggregation)
    with_kl, metrics = policy_loss(logprobs=logp, old_logprobs=old, advantages=adv, completion_mask=mask,
                                   aggregation=aggregation, ref_logprobs=ref, kl_coef=0.3)
    kl = kl_k3(logp, ref)
    torch.testing.assert_close(with_kl, base + 0.3 * aggregate_loss(kl, mask, aggregation))
    assert metrics["kl"] == pytest.approx(((kl * mask).sum() / mask.sum()).item())
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logprobs=logp, old_logprobs=old, advantages=adv, completion_mask=mask, kl_coef=0.1)


def test_metrics_and_per_token_advantages():
    logp, old, mask, _ = _batch(seed=7)
    adv_tok = torch.randn(mask.shape, dtype=torch.float64)
    ent = torch.rand(mask.shape, dtype=torch.float64)
    loss, metrics = policy_loss(logprobs=logp, old_logprobs=old, advantages=adv_tok, completion_mask=mask,
                                entropies=ent)
    assert set(metrics) == {"policy_loss", "clip_fraction", "clip_fraction_low", "clip_fraction_high",
                            "ratio_mean", "entropy"}
    ratio = torch.exp(logp.detach() - old)
    low = ((ratio < 0.8) & (adv_tok < 0)).double()
    high = ((ratio > 1.2) & (adv_tok > 0)).double()
    assert metrics["clip_fraction_low"] == pytest.approx(((low * mask).sum() / mask.sum()).item())
    assert metrics["clip_fraction_high"] == pytest.approx(((high * mask).sum() / mask.sum()).item())
    assert metrics["entropy"] == pytest.approx(((ent * mask).sum() / mask.sum()).item())
    assert metrics["policy_loss"] == pytest.approx(loss.item())
    # old_logprobs=None is on-policy
    on, _ = policy_loss(logprobs=logp, old_logprobs=None, advantages=adv_tok, completion_mask=mask)
    torch.testing.assert_close(on, (-(adv_tok * mask)).sum() / mask.sum())
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logprobs=logp, old_logprobs=old, advantages=torch.ones(3), completion_mask=mask)


# ----------------------------------------------------------------------------------------------------- vs TRL 1.16

import trl.trainer.grpo_trainer as trl_grpo  # noqa: E402


class _FakeAccelerator:
    num_processes = 1

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def _trl_loss(logp, old, ref, mask, adv, *, loss_type, level, beta, eps_low, eps_high, max_len):
    """Run TRL's own GRPOTrainer._compute_loss on given per-token log-probs (the model forward is stubbed)."""
    ent = torch.zeros_like(logp)
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, ent, None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=beta, loss_type=loss_type, epsilon_low=eps_low,
        epsilon_high=eps_high, use_vllm=False, vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=max_len, accelerator=_FakeAccelerator(), _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
    )
    n, t = mask.shape
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, t, dtype=torch.long), "completion_mask": mask,
        "advantages": adv, "old_per_token_logps": old, "num_items_in_batch": mask.sum(),
    }
    if beta:
        inputs["ref_per_token_logps"] = ref
    return trl_grpo.GRPOTrainer._compute_loss(fake, None, inputs)


@pytest.mark.parametrize("loss_type,aggregation", [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean"),
                                                   ("bnpo", "token-mean"), ("dr_grpo", "seq-mean-token-sum-norm")])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_matches_trl_compute_loss(loss_type, aggregation, level, beta):
    logp, old, mask, adv = _batch(n=6, t=7, seed=11)
    ref = old + 0.1 * torch.randn(old.shape, dtype=old.dtype, generator=torch.Generator().manual_seed(1))
    kwargs = dict(eps_low=0.2, eps_high=0.28)
    trl_loss = _trl_loss(logp, old, ref, mask, adv, loss_type=loss_type, level=level, beta=beta, max_len=9,
                         **kwargs)
    ours, _ = policy_loss(logprobs=logp, old_logprobs=old, advantages=adv, completion_mask=mask,
                          ratio_level=level, aggregation=aggregation, max_completion_length=9,
                          ref_logprobs=ref if beta else None, kl_coef=beta, **kwargs)
    torch.testing.assert_close(ours, trl_loss)
    torch.testing.assert_close(_grad(ours, logp), _grad(trl_loss, logp))


# ----------------------------------------------------------------------------------------------------- decision


CLASS_IDS = [7, 9]  # e.g. "Y", "N"


def test_find_decision_positions_and_chosen_classes():
    ids = torch.tensor([[1, 7, 2, 9, 0],     # last class token at 3
                        [7, 3, 3, 3, 9],     # the 9 at 4 is padding -> 0
                        [1, 2, 3, 4, 5]])    # none
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    pos = find_decision_positions(completion_ids=ids, completion_mask=mask, class_token_ids=CLASS_IDS)
    assert pos.tolist() == [3, 0, -1] and pos.dtype == torch.long
    chosen = chosen_classes(completion_ids=ids, decision_positions=pos, class_token_ids=CLASS_IDS)
    assert chosen.tolist() == [1, 0, -1]
    logits = torch.arange(3 * 5 * 4, dtype=torch.float32).view(3, 5, 4)
    torch.testing.assert_close(gather_decision_logits(logits, pos), logits[[0, 1, 2], [3, 0, 0]])


def _logits_with_class_logits(values, vocab=12):
    logits = torch.zeros(len(values), vocab, dtype=torch.float64)
    for i, (a, b) in enumerate(values):
        logits[i, CLASS_IDS[0]] = a
        logits[i, CLASS_IDS[1]] = b
    return logits


def test_decision_loss_hand_values_one_hot_and_uniform():
    logits = _logits_with_class_logits([(2.0, 0.0), (2.0, 0.0), (0.0, 0.0)])
    chosen = torch.tensor([0, 0, -1])
    correct = torch.tensor([True, False, True])
    loss, metrics = decision_token_loss(decision_logits=logits, class_token_ids=CLASS_IDS, chosen_class=chosen,
                                        correct=correct, lam=0.5)
    p = 1 / (1 + math.exp(-2.0))
    one_hot = -math.log(p)
    uniform = -(math.log(p) + math.log(1 - p)) / 2
    assert loss.item() == pytest.approx(0.5 * (one_hot + uniform) / 2)  # mean over the 2 rows with a decision
    assert metrics["decision_ce"] == pytest.approx((one_hot + uniform) / 2)
    assert metrics["decision_prob_mean"] == pytest.approx(p)
    assert metrics["frac_uniform_active"] == 1.0
    assert metrics["frac_with_decision"] == pytest.approx(2 / 3)


def test_decision_loss_full_vocab_variant():
    logits = _logits_with_class_logits([(2.0, 0.0)], vocab=5 + max(CLASS_IDS))
    loss, _ = decision_token_loss(decision_logits=logits, class_token_ids=CLASS_IDS, chosen_class=torch.tensor([0]),
                                  correct=torch.tensor([True]), lam=1.0, renormalize=False)
    z = math.exp(2.0) + (logits.shape[1] - 1)
    assert loss.item() == pytest.approx(-math.log(math.exp(2.0) / z))


def test_decision_loss_no_gradient_when_wrong_and_chosen_at_or_below_uniform():
    # 3 classes; wrong rows: chosen prob 1/3 exactly (gate closed), below 1/3 (closed), above (open)
    ids = [3, 5, 8]
    logits = torch.zeros(3, 10, dtype=torch.float64)
    logits[1, 5] = 1.0  # row 1 chose class 0 (id 3), which is now below 1/3
    logits[2, 3] = 1.0  # row 2 chose class 0, above 1/3
    logits.requires_grad_(True)
    loss, metrics = decision_token_loss(decision_logits=logits, class_token_ids=ids,
                                        chosen_class=torch.tensor([0, 0, 0]),
                                        correct=torch.tensor([False, False, False]), lam=1.0)
    grad = _grad(loss, logits)
    assert torch.equal(grad[0], torch.zeros(10, dtype=torch.float64))
    assert torch.equal(grad[1], torch.zeros(10, dtype=torch.float64))
    assert grad[2, 3] > 0  # gradient descent lowers the over-confident chosen class towards uniform
    assert metrics["frac_uniform_active"] == pytest.approx(1 / 3)


def test_decision_loss_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, dtype=torch.float64, generator=g)
    ids = [2, 4, 6]
    chosen = logits[:, ids].argmax(dim=1)  # wrong rows have p(chosen) > 1/3: gate open, away from the boundary
    chosen[3] = -1
    correct = torch.tensor([True, False, False, True])
    for renormalize in (True, False):
        def fn(x):
            return decision_token_loss(decision_logits=x, class_token_ids=ids, chosen_class=chosen, correct=correct,
                                       lam=0.7, renormalize=renormalize)[0]

        assert torch.autograd.gradcheck(fn, (logits.clone().requires_grad_(True),))


def test_decision_loss_without_decisions_is_a_connected_zero():
    logits = torch.randn(2, 12, requires_grad=True)
    loss, metrics = decision_token_loss(decision_logits=logits, class_token_ids=CLASS_IDS,
                                        chosen_class=torch.tensor([-1, -1]), correct=torch.tensor([True, False]),
                                        lam=1.0)
    assert loss.item() == 0.0 and loss.requires_grad
    assert torch.equal(_grad(loss, logits), torch.zeros(2, 12))
    assert math.isnan(metrics["decision_prob_mean"]) and math.isnan(metrics["frac_uniform_active"])
    with pytest.raises(ValueError, match="chosen_class"):
        decision_token_loss(decision_logits=logits, class_token_ids=CLASS_IDS, chosen_class=torch.tensor([2, 0]),
                            correct=torch.tensor([True, False]), lam=1.0)


def test_zero_decision_advantages_only_at_the_decision_position():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    pos = torch.tensor([2, 0, -1])
    adv = torch.tensor([1.0, -2.0, 3.0])
    out = zero_decision_advantages(advantages=adv, completion_mask=mask, decision_positions=pos)
    expected = adv.unsqueeze(1).expand(3, 4).clone()
    expected[0, 2] = 0.0
    expected[1, 0] = 0.0
    assert torch.equal(out, expected)
    per_token = torch.arange(12, dtype=torch.float32).view(3, 4) + 1
    before = per_token.clone()
    out2 = zero_decision_advantages(advantages=per_token, completion_mask=mask, decision_positions=pos)
    assert torch.equal(per_token, before)  # input untouched
    assert (out2 == 0).sum() == 2 and out2[0, 2] == 0 and out2[1, 0] == 0
    with pytest.raises(ValueError):
        zero_decision_advantages(advantages=torch.ones(2), completion_mask=mask, decision_positions=pos)


# ----------------------------------------------------------------------------------------------------- SimKO


def _simko_inputs(n=4, t=8, v=6, k=3, seed=0, off_policy=True):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, t, v, dtype=torch.float64, generator=g).requires_grad_(True)
    logp_all = torch.log_softmax(logits, -1)
    sampled = torch.multinomial(logp_all.detach().exp().view(-1, v), 1, generator=g).view(n, t)
    logp = logp_all.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    top_idx = logits.detach().topk(k, dim=-1).indices
    topk = logp_all.gather(-1, top_idx)
    old = logp.detach() + (0.1 * torch.randn(n, t, dtype=torch.float64, generator=g) if off_policy else 0.0)
    old_topk = topk.detach() + (0.1 * torch.randn(n, t, k, dtype=torch.float64, generator=g) if off_policy else 0.0)
    entropies = -(logp_all.exp() * logp_all).sum(-1).detach()
    is_top1 = sampled == top_idx[..., 0]
    mask = torch.ones(n, t, dtype=torch.float64)
    if n >= 4:
        mask[1, 5:] = 0
        mask[3, 3:] = 0
    return dict(logits=logits, logp_all=logp_all, sampled=sampled, logp=logp, topk=topk, top_idx=top_idx, old=old,
                old_topk=old_topk, entropies=entropies, is_top1=is_top1, mask=mask)


def _simko(d, adv, correct, **kw):
    return simko_policy_loss(logprobs=d["logp"], old_logprobs=d["old"], topk_logprobs=d["topk"],
                             old_topk_logprobs=d.get("old_topk_arg", d["old_topk"]), entropies=d["entropies"],
                             sampled_is_top1=d["is_top1"], advantages=adv, completion_mask=d["mask"],
                             correct=correct, **kw)


def test_row_quantile_matches_torch_quantile():
    x = torch.randn(6, 9)
    mask = torch.rand(6, 9) > 0.4
    mask[0] = True
    mask[5] = False
    q = row_quantile(x, mask, 0.8)
    for i in range(5):
        if mask[i].any():
            assert q[i].item() == pytest.approx(torch.quantile(x[i][mask[i]], 0.8).item(), abs=1e-6)
    assert q[5].item() == math.inf


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_simko_reduces_to_ppo_when_lam_zero_and_neg_scale_one(aggregation):
    d = _simko_inputs()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3], dtype=torch.float64)
    correct = adv > 0
    loss, metrics = _simko(d, adv, correct, lam=0.0, neg_scale=1.0, aggregation=aggregation)
    ref, ref_metrics = policy_loss(logprobs=d["logp"], old_logprobs=d["old"], advantages=adv,
                                   completion_mask=d["mask"], aggregation=aggregation)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(_grad(loss, d["logits"]), _grad(ref, d["logits"]))
    for key in ("clip_fraction", "ratio_mean"):
        assert metrics[key] == pytest.approx(ref_metrics[key])
    assert metrics["simko_frac_forking"] > 0


def test_simko_value_is_ppo_value_and_old_topk_cancels():
    d = _simko_inputs(seed=2)
    adv = torch.tensor([1.0, 1.0, -1.0, 0.7], dtype=torch.float64)
    correct = adv > 0
    loss, _ = _simko(d, adv, correct, lam=0.3)
    ppo, _ = policy_loss(logprobs=d["logp"], old_logprobs=d["old"], advantages=adv, completion_mask=d["mask"])
    # value: the top-K terms evaluate to r_t, and neg scaling changes the value only where it applies
    d_no_neg = dict(d, is_top1=torch.zeros_like(d["is_top1"]))
    loss_no_neg, _ = _simko(d_no_neg, adv, correct, lam=0.3)
    torch.testing.assert_close(loss_no_neg, ppo)
    # the rollout policy's top-K log-probs cancel (SimKO's 1e-8 aside)
    loss_none, _ = _simko(dict(d, old_topk_arg=None), adv, correct, lam=0.3)
    torch.testing.assert_close(loss_none, loss)
    torch.testing.assert_close(_grad(loss_none, d["logits"]), _grad(loss, d["logits"]), rtol=1e-6, atol=1e-9)


def test_simko_topk_redistribution_hand_check():
    """On-policy, one correct completion with A = 1: at a forking token the gradient of the loss w.r.t. the
    logits is -(1/n_tok) [(1 - lam) d log pi(y_t) + (lam / K) sum_k d log pi(k)]; elsewhere PPO's."""
    d = _simko_inputs(n=1, t=10, v=7, k=3, seed=4, off_policy=False)
    d["mask"] = torch.ones(1, 10, dtype=torch.float64)
    lam, k = 0.4, 3
    adv = torch.ones(1, dtype=torch.float64)
    loss, metrics = _simko(d, adv, torch.tensor([True]), lam=lam, top_k=k)
    grad = _grad(loss, d["logits"])[0]  # [T, V]

    threshold = torch.quantile(d["entropies"][0], 0.8)
    forking = d["entropies"][0] > threshold
    assert forking.sum() == 2  # 10 tokens: the two above the 0.8 quantile
    assert metrics["simko_frac_topk_mixed"] == pytest.approx(0.2)
    probs = d["logp_all"].detach().exp()[0]  # [T, V]
    eye = torch.eye(7, dtype=torch.float64)
    for t in range(10):
        dlog_sampled = eye[d["sampled"][0, t]] - probs[t]  # d log pi(y_t) / d logits
        dlog_topk = (eye[d["top_idx"][0, t]] - probs[t]).sum(0)
        w = lam if forking[t] else 0.0
        expected = -((1 - w) * dlog_sampled + (w / k) * dlog_topk) / 10
        torch.testing.assert_close(grad[t], expected)


def test_simko_negative_scaling_at_forking_top1_tokens():
    d = _simko_inputs(n=1, t=10, v=7, seed=6, off_policy=False)
    d["mask"] = torch.ones(1, 10, dtype=torch.float64)
    d["is_top1"] = torch.ones(1, 10, dtype=torch.bool)
    adv = torch.tensor([-1.0], dtype=torch.float64)
    loss, metrics = _simko(d, adv, torch.tensor([False]), lam=0.5, neg_scale=1.1)
    ppo, _ = policy_loss(logprobs=d["logp"], old_logprobs=d["old"], advantages=adv, completion_mask=d["mask"])
    forking = d["entropies"][0] > torch.quantile(d["entropies"][0], 0.8)
    g_simko = _grad(loss, d["logp"])[0]
    g_ppo = _grad(ppo, d["logp"])[0]
    scale = torch.where(forking, 1.1, 1.0).to(torch.float64)
    torch.testing.assert_close(g_simko, g_ppo * scale)
    assert metrics["simko_frac_neg_scaled"] == pytest.approx(0.2)
    assert metrics["simko_frac_topk_mixed"] == 0.0  # incorrect completions are never mixed
    # not top-1 -> no scaling
    loss2, _ = _simko(dict(d, is_top1=torch.zeros(1, 10, dtype=torch.bool)), adv, torch.tensor([False]))
    torch.testing.assert_close(_grad(loss2, d["logp"])[0], g_ppo)


def test_simko_float_correct_means_reward_equal_to_one():
    d = _simko_inputs(seed=2)
    adv = torch.tensor([1.0, 1.0, -1.0, 0.7], dtype=torch.float64)
    as_bool, metrics_bool = _simko(d, adv, torch.tensor([True, False, False, False]), lam=0.3)
    as_float, metrics_float = _simko(d, adv, torch.tensor([1.0, 0.5, 0.0, 0.9], dtype=torch.float64), lam=0.3)
    torch.testing.assert_close(as_float, as_bool)
    assert metrics_float["simko_frac_topk_mixed"] == metrics_bool["simko_frac_topk_mixed"]


def test_simko_shape_errors():
    d = _simko_inputs()
    adv = torch.ones(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="top_k"):
        _simko(d, adv, adv > 0, top_k=5)
    with pytest.raises(ValueError, match="correct"):
        _simko(d, adv, torch.ones(3, dtype=torch.bool))


# ----------------------------------------------------------------------------------------------------- dtypes, padding


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_bf16_log_probs_give_the_float32_loss_of_the_same_values(ratio_level):
    # the loss is computed in float32 (sums of bf16 would be off in the third digit): same value and gradient as
    # float32 inputs holding exactly the bf16 values
    logp, old, mask, adv = _batch(n=8, t=64, seed=4, dtype=torch.float32)
    logp16 = logp.detach().to(torch.bfloat16).requires_grad_(True)
    logp32 = logp16.detach().float().requires_grad_(True)
    old16 = old.to(torch.bfloat16)
    kw = dict(completion_mask=mask, advantages=adv, ratio_level=ratio_level, aggregation="seq-mean-token-mean")
    loss16, _ = policy_loss(logprobs=logp16, old_logprobs=old16, **kw)
    loss32, _ = policy_loss(logprobs=logp32, old_logprobs=old16.float(), **kw)
    assert loss16.dtype == torch.float32
    torch.testing.assert_close(loss16, loss32)
    torch.testing.assert_close(_grad(loss16, logp16).float(), _grad(loss32, logp32).to(torch.bfloat16).float())


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("aggregation", AGGS)
def test_non_finite_padding_does_not_reach_the_loss_or_its_gradient(ratio_level, aggregation):
    logp, old, mask, adv = _batch(seed=5)
    ref = old - 0.1
    pad = mask == 0
    kw = dict(completion_mask=mask, advantages=adv, ratio_level=ratio_level, aggregation=aggregation, kl_coef=0.1)
    loss, _ = policy_loss(logprobs=logp, old_logprobs=old, ref_logprobs=ref, **kw)
    logp_inf = torch.where(pad, torch.full_like(logp, -math.inf), logp.detach()).requires_grad_(True)
    loss_inf, metrics = policy_loss(logprobs=logp_inf, old_logprobs=old.masked_fill(pad, -math.inf),
                                    ref_logprobs=ref.masked_fill(pad, math.nan), **kw)
    torch.testing.assert_close(loss_inf, loss)
    grad_inf = _grad(loss_inf, logp_inf)
    assert torch.isfinite(grad_inf).all()
    torch.testing.assert_close(grad_inf, _grad(loss, logp))
    assert math.isfinite(metrics["kl"])


# ----------------------------------------------------------------------------------------------------- Clip-Cov / KL-Cov
# Hand example: 2 completions x 3 tokens, A = +1 / -1, the same log-probs (-0.1, -2, -3) in both rows. Means: A 0,
# logp -1.7, so cov = (1.6, -0.3, -1.3) in row 0 and (-1.6, 0.3, 1.3) in row 1: in Clip-Cov's window (1, 5) lie
# (0, 0) and (1, 2); KL-Cov's top three are (0, 0) 1.6, (1, 2) 1.3, (1, 1) 0.3.

from calibrl.losses.covariance import clip_cov_policy_loss, kl_cov_policy_loss  # noqa: E402

COV_LOGP = [[-0.1, -2.0, -3.0], [-0.1, -2.0, -3.0]]
COV_ADV = torch.tensor([1.0, -1.0])


def _cov_logp():
    return torch.tensor(COV_LOGP, requires_grad=True)


def test_clip_cov_detaches_the_tokens_in_the_covariance_window():
    logp = _cov_logp()
    loss, m = clip_cov_policy_loss(logprobs=logp, old_logprobs=None, advantages=COV_ADV, completion_mask=torch.ones(2, 3),
                                   clip_cov_ratio=0.5)  # int(0.5 * 6) = 3 >= the 2 candidates: both
    # on-policy r = 1: per-token loss -A, detached at (0,0) and (1,2); token-mean over 6
    assert float(loss) == pytest.approx((0 - 1 - 1 + 1 + 1 + 0) / 6)
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[0.0, -1, -1], [1, 1, 0]]) / 6)
    assert m["clip_cov_fraction"] == pytest.approx(2 / 6) and m["clip_fraction"] == 0.0

    logp = _cov_logp()  # window (1, 1.5): only (1, 2)
    loss, m = clip_cov_policy_loss(logprobs=logp, old_logprobs=None, advantages=COV_ADV, completion_mask=torch.ones(2, 3),
                                   clip_cov_ratio=0.5, clip_cov_ub=1.5)
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[-1.0, -1, -1], [1, 1, 0]]) / 6)


def test_clip_cov_draws_at_random_among_candidates_and_never_a_ppo_clipped_token():
    drawn = set()
    for seed in range(20):  # int(0.2 * 6) = 1 token among the 2 candidates
        logp = _cov_logp()
        loss, m = clip_cov_policy_loss(logprobs=logp, old_logprobs=None, advantages=COV_ADV,
                                       completion_mask=torch.ones(2, 3), clip_cov_ratio=0.2,
                                       generator=torch.Generator().manual_seed(seed))
        zero = (_grad(loss, logp) == 0).nonzero().tolist()
        assert len(zero) == 1 and m["clip_cov_fraction"] == pytest.approx(1 / 6)
        drawn.add(tuple(zero[0]))
    assert drawn == {(0, 0), (1, 2)}

    # (0, 0) already clipped by PPO (r = 1.5 > 1 + 0.2 with A > 0): never drawn, so (1, 2) always is
    logp = _cov_logp()
    old = logp.detach().clone()
    old[0, 0] -= math.log(1.5)
    loss, m = clip_cov_policy_loss(logprobs=logp, old_logprobs=old, advantages=COV_ADV, completion_mask=torch.ones(2, 3),
                                   clip_cov_ratio=0.2)
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[0.0, -1, -1], [1, 1, 0]]) / 6)
    assert m["clip_fraction"] == pytest.approx(1 / 6) and m["clip_cov_fraction"] == pytest.approx(1 / 6)
    assert float(loss) == pytest.approx((-1.2 - 1 - 1 + 1 + 1 + 0) / 6)  # clipped value (1 + 0.2) * -A


def test_kl_cov_penalises_the_largest_covariance_tokens():
    logp = _cov_logp()
    old = logp.detach().clone()
    old[0, 0] += 0.1  # log r = -0.1 at the top-covariance token
    loss, m = kl_cov_policy_loss(logprobs=logp, old_logprobs=old, advantages=COV_ADV, completion_mask=torch.ones(2, 3),
                                 kl_cov_ratio=0.2, ppo_kl_coef=0.1)  # max(1, int(1.2)) = 1 token: (0, 0)
    assert float(loss) == pytest.approx((-math.exp(-0.1) + 0.1 * 0.1 - 1 - 1 + 1 + 1 + 1) / 6, rel=1e-6)
    expected = torch.tensor([[-math.exp(-0.1) - 0.1, -1, -1], [1, 1, 1]]) / 6  # d|log r|/dlogp = sign(-0.1)
    torch.testing.assert_close(_grad(loss, logp), expected)
    assert m["kl_cov_fraction"] == pytest.approx(1 / 6) and m["ppo_kl_abs"] == pytest.approx(0.1 / 6, rel=1e-5)

    logp = _cov_logp()
    old = logp.detach() + 0.1  # every log r = -0.1; three tokens: (0,0), (1,2), (1,1)
    loss, m = kl_cov_policy_loss(logprobs=logp, old_logprobs=old, advantages=COV_ADV, completion_mask=torch.ones(2, 3),
                                 kl_cov_ratio=0.5, ppo_kl_coef=0.1)
    r = math.exp(-0.1)
    expected = torch.tensor([[-r - 0.1, -r, -r], [r, r - 0.1, r - 0.1]]) / 6
    torch.testing.assert_close(_grad(loss, logp), expected)


def test_kl_cov_on_policy_is_the_unclipped_policy_gradient():
    """At r = 1 (one update per generation, TRL's on-policy default) |log r| is 0 with zero gradient: KL-Cov is
    then the plain -A r loss, with no clip; the penalty acts only on later updates of the same rollouts."""
    logp = _cov_logp()
    loss, m = kl_cov_policy_loss(logprobs=logp, old_logprobs=None, advantages=COV_ADV, completion_mask=torch.ones(2, 3),
                                 kl_cov_ratio=0.5)
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[-1.0, -1, -1], [1, 1, 1]]) / 6)
    assert m["kl_cov_fraction"] == pytest.approx(3 / 6)


@pytest.mark.parametrize("which", ["clip_cov", "kl_cov"])
def test_cov_losses_ignore_junk_in_padding(which):
    """A padded column holding -inf log-probs and a junk advantage changes neither the selection, the loss nor the
    gradient of the real tokens (the covariance means run over the mask), and leaves no NaN."""
    fn = clip_cov_policy_loss if which == "clip_cov" else kl_cov_policy_loss
    params = {"clip_cov_ratio": 0.5} if which == "clip_cov" else {"kl_cov_ratio": 0.5}
    logp = _cov_logp()
    old = logp.detach() + 0.1
    loss, _ = fn(logprobs=logp, old_logprobs=old, advantages=COV_ADV, completion_mask=torch.ones(2, 3), **params)
    padded = torch.cat([logp.detach(), torch.full((2, 1), -math.inf)], 1).requires_grad_()
    adv = torch.cat([COV_ADV[:, None].expand(2, 3), torch.full((2, 1), 50.0)], 1)
    mask = torch.cat([torch.ones(2, 3), torch.zeros(2, 1)], 1)
    loss_pad, _ = fn(logprobs=padded, old_logprobs=torch.cat([old, torch.full((2, 1), -math.inf)], 1), advantages=adv,
                     completion_mask=mask, **params)
    torch.testing.assert_close(loss_pad, loss)
    grad = _grad(loss_pad, padded)
    assert torch.isfinite(grad).all() and (grad[:, 3] == 0).all()
    torch.testing.assert_close(grad[:, :3], _grad(loss, logp))
