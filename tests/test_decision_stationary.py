"""Stationary points of the decision-token term (docs/losses.md), found numerically with decision_token_loss itself.

Setup: one decision with classes 0..C-1; P[c] = probability that choosing c is rewarded as correct. The expected
loss is the sum over (chosen class c, correct r) of weight(c, r) * loss(c, r), with weight = q[c] (on-policy: the
decision is sampled from q itself, q held fixed inside the expectation as in a policy-gradient step) or 1[c = c0]
(the decision copies the reasoning's conclusion c0), times P[c] (r = 1) or 1 - P[c] (r = 0). Gradient descent on
the logits from several starts converges to the stationary point the docs derive; a wrong formula or sign in the
loss moves it.
"""

from __future__ import annotations

import pytest
import torch

from calibrl.losses.decision import decision_token_loss


def _settle(P, *, target, gate, copy_of=None, start=None, steps=3000, lr=3.0, tol=1e-10):
    """q after gradient descent on the expected loss (float64; V = C so every vocabulary token is a class), stopped
    once no logit moves by ``tol`` in a step: q then lies within about 1e-10 of where all ``steps`` would take it
    (the cases here settle in 8-400 steps; one on the gate's edge chatters and takes them all).

    One call per step: every (c, r) case is a row of its own copy of the logits, so the mean loss's gradient
    gives each row's gradient (times 1 / rows), which the weights then combine."""
    P = torch.tensor(P, dtype=torch.float64)
    n = P.numel()
    z = torch.zeros(n, dtype=torch.float64) if start is None else torch.tensor(start, dtype=torch.float64)
    chosen = torch.arange(n).repeat_interleave(2)  # rows: (c, correct), (c, wrong) for each c
    correct = torch.tensor([True, False]).repeat(n)
    p_outcome = torch.where(correct, P[chosen], 1 - P[chosen])
    for _ in range(steps):
        rows = z.expand(2 * n, n).clone().requires_grad_(True)
        q = torch.softmax(z, -1)
        pick = q[chosen] if copy_of is None else (chosen == copy_of).double()
        weight = pick * p_outcome  # [2n]
        loss, _ = decision_token_loss(decision_logits=rows, class_token_ids=list(range(n)), chosen_class=chosen,
                                      correct=correct, lam=1.0, target=target, consistency_gate=gate)
        (grad_rows,) = torch.autograd.grad(loss, rows)  # [2n, n]: each row's gradient / (2n)
        step = lr * (2 * n) * (weight[:, None] * grad_rows).sum(0)
        z = z - step
        if float(step.abs().max()) < tol:
            break
    return torch.softmax(z, -1)


STARTS = [None, [1.0, -1.0], [-1.5, 0.5]]


@pytest.mark.parametrize("start", STARTS)
def test_paper_target_two_classes_on_policy_no_gate_is_calibrated(start):
    q = _settle([0.7, 0.3], target="onehot_uniform", gate=False, start=start)
    assert q[0] == pytest.approx(0.7, abs=1e-3)


@pytest.mark.parametrize("start", [None, [1.0, -1.0]])
def test_paper_target_with_gate_is_overconfident_two_classes(start):
    # majority class settles at (3P - 1) / (2P): 0.786 at P = 0.7
    q = _settle([0.7, 0.3], target="onehot_uniform", gate=True, start=start)
    assert q[0] == pytest.approx((3 * 0.7 - 1) / (2 * 0.7), abs=1e-3)
    assert q[0] > 0.7 + 0.05


def test_paper_target_many_classes_on_policy_settles_at_inverse_one_minus_p():
    P = torch.tensor([0.5, 0.3, 0.2])
    q = _settle(P.tolist(), target="onehot_uniform", gate=False, start=[0.3, -0.2, 0.1])
    expected = (1 / (1 - P)) / (1 / (1 - P)).sum()
    assert torch.allclose(q.float(), expected, atol=1e-3)
    assert not torch.allclose(q.float(), P, atol=0.02)  # i.e. not calibrated


@pytest.mark.parametrize("n_classes", [2, 4])
def test_paper_target_copying_the_reasoning_settles_at_p_plus_share_of_the_rest(n_classes):
    p = 0.6
    P = [p] + [(1 - p) / (n_classes - 1)] * (n_classes - 1)
    q = _settle(P, target="onehot_uniform", gate=True, copy_of=0)
    assert float(q[0]) == pytest.approx(p + (1 - p) / n_classes, abs=1e-3)


@pytest.mark.parametrize("P", [[0.7, 0.3], [0.5, 0.3, 0.2], [0.1, 0.2, 0.3, 0.4]])
def test_binary_target_on_policy_is_calibrated_for_any_number_of_classes(P):
    q = _settle(P, target="binary", gate=False, start=[0.4 * (-1) ** i for i in range(len(P))])
    assert torch.allclose(q.float(), torch.tensor(P), atol=1e-3)


@pytest.mark.parametrize("p,gate,expected", [(0.6, False, 0.6), (0.6, True, 0.6), (0.2, False, 0.2),
                                             (0.2, True, 0.25)])
def test_binary_target_copying_the_reasoning(p, gate, expected):
    # four classes; the reasoning concludes class 0, right with probability p. Gate on: max(p, 1/|C|).
    P = [p, (1 - p) / 3, (1 - p) / 3, (1 - p) / 3]
    # with the gate the point sits on the gate's edge, where a large step chatters across it: small steps there
    q = _settle(P, target="binary", gate=gate, copy_of=0, **({"lr": 0.05, "steps": 2000} if gate else {}))
    assert float(q[0]) == pytest.approx(expected, abs=2e-3)


def test_binary_target_values_by_hand():
    z = torch.tensor([[2.0, 0.0, -1.0]])
    q = torch.softmax(z, -1)[0]
    ids = [0, 1, 2]
    right, _ = decision_token_loss(decision_logits=z, class_token_ids=ids, chosen_class=torch.tensor([1]),
                                   correct=torch.tensor([True]), lam=1.0, target="binary")
    wrong, _ = decision_token_loss(decision_logits=z, class_token_ids=ids, chosen_class=torch.tensor([1]),
                                   correct=torch.tensor([False]), lam=0.5, target="binary")
    assert float(right) == pytest.approx(-float(torch.log(q[1])), rel=1e-6)
    assert float(wrong) == pytest.approx(-0.5 * float(torch.log(1 - q[1])), rel=1e-6)


def test_unknown_target_is_refused():
    with pytest.raises(ValueError, match="target"):
        decision_token_loss(decision_logits=torch.zeros(1, 2), class_token_ids=[0, 1], chosen_class=torch.tensor([0]),
                            correct=torch.tensor([True]), lam=1.0, target="soft")
