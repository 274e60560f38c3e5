"""Self-certainty (INTUITOR, arXiv 2505.19590) against a direct computation and the authors' formula."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from calibrl.self_certainty import chunked_token_self_certainty, completion_self_certainty, token_self_certainty


def _intuitor_self_certainty_from_logits(logits):
    """REFERENCE, TEST ONLY: sunblaze-ucb/Intuitor, verl-intuitor/verl/utils/torch_functional.py
    ``self_certainty_from_logits`` (the same line as open-r1-intuitor's ``_get_per_token_self_certainty``)."""
    return torch.logsumexp(logits, dim=-1) - logits.mean(dim=-1)


def test_hand_values_uniform_and_concentrated():
    v = 4
    assert float(token_self_certainty(torch.zeros(v))) == pytest.approx(0.0, abs=1e-7)  # uniform: KL 0
    # p = (1/2, 1/6, 1/6, 1/6): KL(U || p) = (1/4) sum log((1/4) / p_j) = (1/4)[log(1/2) + 3 log(3/2)]
    logits = torch.tensor([math.log(3.0), 0.0, 0.0, 0.0])
    expected = 0.25 * (math.log(0.5) + 3 * math.log(1.5))
    assert float(token_self_certainty(logits)) == pytest.approx(expected, rel=1e-6)
    # temperature 2 halves the logits: p = (sqrt3, 1, 1, 1) / (sqrt3 + 3)
    p = torch.tensor([math.sqrt(3), 1, 1, 1]) / (math.sqrt(3) + 3)
    direct = float((0.25 * torch.log(0.25 / p)).sum())
    assert float(token_self_certainty(logits, temperature=2.0)) == pytest.approx(direct, abs=1e-6)  # float32


def test_equals_the_kl_from_uniform_and_the_authors_formula_up_to_log_v():
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(5, 7, 50, generator=gen)
    p = torch.softmax(logits.double(), -1)
    direct = (torch.full_like(p, 1 / 50) * torch.log((1 / 50) / p)).sum(-1)  # KL(U || p), float64
    torch.testing.assert_close(token_self_certainty(logits), direct.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(token_self_certainty(logits, subtract_log_vocab=False),
                               _intuitor_self_certainty_from_logits(logits))
    kl = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), torch.full_like(p, 1 / 50).float(),
                                    reduction="none").sum(-1)  # torch's KL(target || input)
    torch.testing.assert_close(token_self_certainty(logits), kl, rtol=1e-5, atol=1e-5)


def test_chunked_equals_the_whole_logits_and_projects_chunks_only():
    gen = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(8, 300, bias=False)
    hidden = torch.randn(23, 8, generator=gen)
    seen = []

    def project(h):
        seen.append(h.shape[0])
        return head(h)

    with torch.no_grad():
        out = chunked_token_self_certainty(hidden, project=project, chunk=5, temperature=0.7)
        whole = token_self_certainty(head(hidden), temperature=0.7)
    torch.testing.assert_close(out, whole)
    assert seen == [5, 5, 5, 5, 3]  # never more than `chunk` positions' logits at once


def test_completion_mean_over_the_masked_tokens():
    per_token = torch.tensor([[1.0, 2.0, 9.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    torch.testing.assert_close(completion_self_certainty(per_token, mask), torch.tensor([1.5, 0.0]))


# REFERENCE, TEST ONLY: verl 0.9.1 ``verl/trainer/ppo/core_algos.py::compute_grpo_outcome_advantage`` (what
# sunblaze-ucb/Intuitor's verl-intuitor at 3f0cdd7 feeds the self-certainty to), transcribed loop for loop on
# one score per row. Not part of calibrl.
def _ref_verl_grpo(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    from collections import defaultdict

    id2score, id2mean, id2std = defaultdict(list), {}, {}
    scores = scores.clone()
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2mean[idx] = torch.tensor(0.0)
            id2std[idx] = torch.tensor(1.0)
        else:
            stacked = torch.stack(id2score[idx])
            id2mean[idx] = torch.mean(stacked)
            id2std[idx] = torch.std(stacked)
    for i in range(len(scores)):
        if norm_adv_by_std_in_grpo:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    return scores


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("spread", [1.0, 1e-3, 1e-5])
def test_intuitor_equals_verl_intuitors_advantage_with_one_row_and_near_tied_groups(norm_by_std, spread):
    """Groups not contiguous, two of one row, self-certainties whose group std is 1e-3 or 1e-5 (where open-r1's
    eps 1e-4 moves the advantage by 0.57 and 1.42): calibrl's default equals verl-intuitor's."""
    from calibrl import RolloutBatch, compute_advantages

    rng = np.random.default_rng(int(spread * 1e5) + norm_by_std)
    group = np.array([0, 1, 2, 0, 1, 0, 3, 1, 0, 4, 1, 0])  # groups 2, 3 and 4 have one row
    sc = torch.tensor(2.0 + spread * rng.standard_normal(group.size), dtype=torch.float64)
    batch = RolloutBatch(rewards=torch.zeros(group.size), group_ids=torch.tensor(group), self_certainty=sc)
    ours, _ = compute_advantages(batch, "intuitor", norm_by_std=norm_by_std, return_info=True)
    theirs = _ref_verl_grpo(sc, [f"u{g}" for g in group], norm_adv_by_std_in_grpo=norm_by_std)
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-7)  # verl keeps a one-row std in float32
    assert ours[2] == pytest.approx(float(sc[2]) / (1 + 1e-6) if norm_by_std else float(sc[2]), rel=1e-6)
