"""DCPO (arXiv 2603.09117): calibrl.advantages.dcpo against the authors' code, transcribed below (test only), and
hand-worked values."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from calibrl import RolloutBatch, compute_advantages
from calibrl.advantages._groups import dense_group_index
from calibrl.advantages.dcpo import NO_CONFIDENCE, dcpo_advantages, dcpo_calibration_scores

# ------------------------------------------------------------------------------------------------------------------
# REFERENCE, TEST ONLY: the authors' code (icip-cas/DCPO at 8692242), transcribed loop for loop.
#   _ref_grpo_normalize            <- verl/trainer/ppo/core_algos.py::_grpo_normalize
#   _ref_confidence_advantage      <- verl/trainer/ppo/core_algos.py::compute_confidence_outcome_advantage
#   _ref_hybrid_reward_tensor      <- verl/workers/reward_manager/hybrid.py::HybridRewardManager.__call__, the part
#                                     after the verifier and the CONFIDENCE parsing: where the two scores are
#                                     written (num_rollouts = 8 consecutive rows per group, gamma = weight = 0.5)
# Not part of calibrl; do not import from here.
# ------------------------------------------------------------------------------------------------------------------


def _ref_grpo_normalize(scores, index, eps):
    id2scores = defaultdict(list)
    for i in range(len(scores)):
        id2scores[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for k, v in id2scores.items():
        if len(v) == 1:
            id2mean[k] = torch.tensor(0.0)
            id2std[k] = torch.tensor(1.0)
        else:
            stacked = torch.stack(v)
            id2mean[k] = stacked.mean()
            id2std[k] = stacked.std()
    advantages = scores.clone()
    for i in range(len(scores)):
        advantages[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + eps)
    return advantages


def _ref_confidence_advantage(token_level_rewards, response_mask, index, confidence_pos, epsilon=1e-6):
    confidence_pos = torch.tensor(confidence_pos).long()
    bs, response_len = token_level_rewards.shape
    answer_scores = torch.zeros(bs)
    confidence_scores = torch.zeros(bs)
    for i in range(bs):
        cpos = confidence_pos[i].item()
        confidence_scores[i] = token_level_rewards[i, cpos]
        answer_scores[i] = token_level_rewards[i].sum() - confidence_scores[i]
    answer_adv = _ref_grpo_normalize(answer_scores, index, epsilon)
    confidence_adv = _ref_grpo_normalize(confidence_scores, index, epsilon)
    advantages = torch.zeros_like(token_level_rewards)
    for i in range(bs):
        cpos = confidence_pos[i].item()
        for t in range(response_len):
            if not response_mask[i, t]:
                continue
            if t >= cpos:
                advantages[i, t] = confidence_adv[i]
            else:
                advantages[i, t] = answer_adv[i]
    return advantages


def _ref_hybrid_reward_tensor(rewards, confidences, confidence_token_pos, lengths, width):
    """rewards: verifier scores; confidences: parsed q (-1 when no CONFIDENCE line); confidence_token_pos: the token
    index the code finds for the CONFIDENCE line, or None; -> (reward_tensor, pos list)."""
    reward_tensor = torch.zeros(len(rewards), width)
    pos_list = []
    for i, reward in enumerate(rewards):
        valid_response_length = lengths[i]
        if confidence_token_pos[i] is not None:
            pos = max(confidence_token_pos[i] - 1, 0)
        else:
            pos = max(valid_response_length - 2, 0)
        reward_tensor[i, pos] = reward
        pos_list.append(pos)
    accuracy_tensor = torch.tensor(rewards)
    confidence_tensor = torch.tensor(confidences)
    num_rollouts = 8
    if len(rewards) % num_rollouts != 0:
        num_rollouts = 1
    group_mean = accuracy_tensor.view(-1, num_rollouts).mean(dim=1).repeat_interleave(num_rollouts)
    gamma = 0.5
    hybrid = gamma * accuracy_tensor + (1 - gamma) * group_mean
    calibration_scores = torch.square(hybrid - confidence_tensor)
    weight = 0.5
    for i in range(len(rewards)):
        reward_tensor[i, lengths[i] - 1] -= weight * calibration_scores[i]
    return reward_tensor, pos_list

# ------------------------------------------------------------------------------------------------- end of REFERENCE


def _rollouts(seed: int, n_groups: int = 4, width: int = 12):
    """Groups of 8 consecutive rows (the code's grouping), random correctness, stated confidences (some missing),
    confidence positions and lengths (some one-token rows)."""
    rng = np.random.default_rng(seed)
    n = 8 * n_groups
    lengths = rng.integers(1, width + 1, n)
    lengths[3] = 1
    rewards = rng.integers(0, 2, n).astype(float).tolist()
    stated = rng.random(n) < 0.75
    confidences = [float(np.round(rng.random(), 2)) if s else -1.0 for s in stated]
    token_pos = [int(rng.integers(0, lengths[i])) if stated[i] else None for i in range(n)]
    return rewards, confidences, token_pos, lengths.tolist(), width


@pytest.mark.parametrize("seed", range(5))
def test_dcpo_equals_the_authors_code(seed):
    """Our per-token advantages equal the code's (reward manager + advantage) on the same rollouts, to float32
    rounding (assert_close: 1.3e-6 relative, 1e-5 absolute)."""
    rewards, confidences, token_pos, lengths, width = _rollouts(seed)
    reward_tensor, pos = _ref_hybrid_reward_tensor(rewards, confidences, token_pos, lengths, width)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    uid = np.array([f"p{i // 8}" for i in range(len(rewards))], dtype=object)
    expected = _ref_confidence_advantage(reward_tensor, mask, uid, pos)

    batch = RolloutBatch(rewards=rewards, group_ids=[i // 8 for i in range(len(rewards))], lengths=lengths,
                         stated_confidence=confidences, confidence_start=pos)
    ours = compute_advantages(batch, "dcpo")
    torch.testing.assert_close(ours, expected[:, : max(lengths)])


def test_dcpo_paper_assignment_swaps_the_two_advantages():
    rewards, confidences, token_pos, lengths, width = _rollouts(7)
    batch = RolloutBatch(rewards=rewards, group_ids=[i // 8 for i in range(len(rewards))], lengths=lengths,
                         stated_confidence=confidences,
                         confidence_start=[max(p - 1, 0) if p is not None else max(n - 2, 0)
                                           for p, n in zip(token_pos, lengths)])
    code = compute_advantages(batch, "dcpo")
    paper = compute_advantages(batch, "dcpo", assignment="paper")
    split = batch.confidence_start
    t = torch.arange(code.shape[1])[None, :]
    longer = (batch.lengths > split + 1)[:, None]  # rows with tokens on both sides of the split
    before, after = (t < split[:, None]) & longer, (t >= split[:, None]) & (t < batch.lengths[:, None]) & longer
    # the code's "after" advantage (one value per row) is the paper's "before", and the other way round
    for row in range(len(batch)):
        if before[row].any() and after[row].any():
            assert torch.allclose(code[row][after[row]], paper[row][before[row]][:1].expand(int(after[row].sum())))
            assert torch.allclose(code[row][before[row]], paper[row][after[row]][:1].expand(int(before[row].sum())))


def test_dcpo_hand_values():
    """One group of 4: correct 1, 1, 0, 0 (mean 0.5); stated 0.9, 0.5, 0.3, none. Target (gamma 0.5) 0.75 for the
    right answers, 0.25 for the wrong; c = -0.5 (target - q)^2 = -0.01125, -0.03125, -0.00125, -0.78125.
    Accuracy normalised: mean 0.5, std sqrt(1/3) -> +-0.866; each row 4 tokens, split at 2."""
    batch = RolloutBatch(rewards=[1.0, 1.0, 0.0, 0.0], group_ids=[0, 0, 0, 0], lengths=[4, 4, 4, 4],
                         stated_confidence=[0.9, 0.5, 0.3, NO_CONFIDENCE], confidence_start=[2, 2, 2, 2])
    index, n_groups = dense_group_index(batch.group_ids)
    c = dcpo_calibration_scores(correct=batch.rewards, confidence=batch.stated_confidence, group_index=index,
                                n_groups=n_groups)
    torch.testing.assert_close(c, torch.tensor([-0.01125, -0.03125, -0.00125, -0.78125]))
    adv = compute_advantages(batch, "dcpo", assignment="paper")
    acc = torch.tensor([1.0, 1, -1, -1]) * 0.5 / (3 ** -0.5) / 1.0
    torch.testing.assert_close(adv[:, :2], acc[:, None].expand(4, 2), rtol=1e-5, atol=1e-5)
    cal = (c - c.mean()) / (c.std() + 1e-6)
    torch.testing.assert_close(adv[:, 2:], cal[:, None].expand(4, 2))
    assert adv[3, 2] < -1.4  # stating no confidence is the worst calibration score of the group
    code = compute_advantages(batch, "dcpo")  # the released code: the other way round
    torch.testing.assert_close(code[:, :2], adv[:, 2:])
    torch.testing.assert_close(code[:, 2:], adv[:, :2])


def test_dcpo_leaves_padding_and_empty_rows_at_zero_and_names_missing_inputs():
    batch = RolloutBatch(rewards=[1.0, 0.0, 1.0], group_ids=[0, 0, 0], lengths=[3, 0, 2],
                         stated_confidence=[0.8, -1.0, 0.4], confidence_start=[1, 0, 0])
    adv = compute_advantages(batch, "dcpo")
    assert adv.shape == (3, 3) and torch.all(adv[1] == 0) and adv[2, 2] == 0
    with pytest.raises(Exception, match="stated_confidence"):
        compute_advantages(RolloutBatch(rewards=[1.0, 0.0], group_ids=[0, 0], lengths=[2, 2]), "dcpo")
    with pytest.raises(ValueError, match="assignment"):
        dcpo_advantages(correct=torch.ones(2), confidence=torch.ones(2), split=torch.zeros(2, dtype=torch.long),
                        lengths=torch.ones(2, dtype=torch.long), group_index=torch.zeros(2, dtype=torch.long),
                        n_groups=1, assignment="both")


@pytest.mark.parametrize("seed", range(3))
def test_dcpo_on_a_reordered_batch_true_groups_by_default_the_authors_chunks_as_an_option(seed):
    """The batch as the authors' trainer hands it to the reward manager after verl's balance_batch: the rows of a
    prompt scattered. By default the calibration target's group accuracy is the prompt's (the uid the advantage
    normalises by); target_group_rows=8 is the authors' code on that reordered batch (its 8 consecutive rows),
    equal to the transcription."""
    rewards, confidences, token_pos, lengths, width = _rollouts(seed)
    perm = np.random.default_rng(100 + seed).permutation(len(rewards))  # a reordering that splits the prompts
    rewards, confidences = [rewards[i] for i in perm], [confidences[i] for i in perm]
    token_pos, lengths = [token_pos[i] for i in perm], [lengths[i] for i in perm]
    group = [int(i) // 8 for i in perm]  # each row keeps its prompt
    reward_tensor, pos = _ref_hybrid_reward_tensor(rewards, confidences, token_pos, lengths, width)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    uid = np.array([f"p{g}" for g in group], dtype=object)
    authors = _ref_confidence_advantage(reward_tensor, mask, uid, pos)[:, : max(lengths)]
    batch = RolloutBatch(rewards=rewards, group_ids=group, lengths=lengths, stated_confidence=confidences,
                         confidence_start=pos)
    torch.testing.assert_close(compute_advantages(batch, "dcpo", target_group_rows=8), authors)
    ours = compute_advantages(batch, "dcpo")
    assert not torch.allclose(ours, authors)  # their chunks are not prompts here
    # ours: the same code with each chunk a prompt (the rows sorted back into generation order)
    order = np.argsort(perm)
    sorted_back = _ref_hybrid_reward_tensor([rewards[i] for i in order], [confidences[i] for i in order],
                                            [token_pos[i] for i in order], [lengths[i] for i in order], width)
    reference = _ref_confidence_advantage(sorted_back[0], mask[order], uid[order], sorted_back[1])
    torch.testing.assert_close(ours[order], reference[:, : max(lengths)])
