"""The testbed's abstain task (a decline and items with no right answer, where the optimal policy is known), the
regret under the risk threshold, and the abstention study's threshold chosen afterwards: worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibrl.metrics.stated_abstention import risk_threshold_regret
from calibrl.testbed import tasks as tb


def test_prompts_hide_a_digit_in_about_a_quarter_by_each_codes_own_draw():
    rows = tb.build_rows("abstain", 2000)
    hidden = [r for r in rows if not r["answerable"]]
    assert 0.2 < len(hidden) / len(rows) < 0.3
    for r in hidden:
        assert r["prompt"][:4].count(tb.HIDDEN_DIGIT) == 1 and r["p_true"] == 0.0
        shown = sum(int(ch) for ch in r["prompt"][:4] if ch.isdigit())
        assert r["answer"] == f"{shown:02d}" and r["likely"] == str(shown % 10)
    for r in rows:
        if r["answerable"]:
            ss = sum(int(ch) for ch in r["prompt"][:4])
            assert r["p_true"] == tb.STOCHASTIC_C[ss % 8]
    # a prompt's fate is its code's: the first 40 of 400 are the 40 drawn alone, and the verbalized task hides the
    # same digit of the same code
    first = [r["prompt"] for r in tb.build_rows("abstain", 40)]
    assert first == [r["prompt"] for r in tb.build_rows("abstain", 400)[:40]]
    verbalized = tb.build_rows("abstain_verbalized", 2000)
    assert [r["prompt"][:4] for r in verbalized] == [r["prompt"][:4] for r in rows]
    assert {r["prompt"][-1] for r in verbalized} == {"$"} and {r["prompt"][-1] for r in rows} == {"@"}


def test_success_probabilities_by_hand():
    # 5324: sum 14, c = STOCHASTIC_C[14 % 8 = 6] = 0.8, likely digit 4
    assert tb.true_success_probability("abstain", "5324@", "14;4") == pytest.approx(0.8)
    assert tb.true_success_probability("abstain", "5324@", "14;7") == pytest.approx(0.2 / 9)
    assert tb.true_success_probability("abstain", "5324@", "13;4") == 0.0  # the sum wrong
    assert tb.true_success_probability("abstain", "5324@", "14;?") == 0.0  # a decline is not right where an answer is
    assert tb.true_success_probability("abstain", "5324@", "14") == 0.0  # malformed
    # 53_4: shown sum 12, no right answer; a decline is right there (calibrl's binary grading), any answer wrong
    assert tb.true_success_probability("abstain", "53_4@", "12;?") == 1.0
    assert tb.true_success_probability("abstain", "53_4@", "12;4") == 0.0
    assert tb.best_success_probability("abstain", "5324@") == pytest.approx(0.8)
    assert tb.best_success_probability("abstain", "53_4@") == 0.0
    parsed = tb.parse("abstain_verbalized", "5324$", "14;4:7")
    assert parsed["choice"] == "4" and parsed["confidence"] == pytest.approx(0.7) and not parsed["abstained"]
    assert tb.parse("abstain_verbalized", "5324$", "14;?")["abstained"]
    with pytest.raises(ValueError, match="not an abstain task"):
        tb.best_success_probability("stochastic_reasoning", "5324?")


class _Always:
    """A stand-in generator: every draw is ``value``."""

    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


def test_the_rewards_by_hand(monkeypatch):
    t = tb.ABSTAIN_THRESHOLD
    prompts = ["5324@", "5324@", "5324@", "53_4@", "53_4@"]
    completions = ["14;4", "14;7", "14;?", "12;?", "12;4"]
    # every outcome drawn right where it can be (u = 0 < any positive success probability)
    monkeypatch.setattr(np.random, "default_rng", lambda seed=None: _Always(0.0))
    assert tb.make_reward("abstain", 0, scheme="binary")(prompts, completions) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert tb.make_reward("abstain", 0, scheme="ternary")(prompts, completions) == [1.0, 1.0, 0.0, 0.0, -1.0]
    risk = tb.make_reward("abstain", 0, scheme="risk")(prompts, completions)
    assert risk == pytest.approx([1.0, 1.0, 0.0, 0.0, -t / (1 - t)])
    # RLCR's arm: the risk reward plus -(k/10 - 1[right])^2 on an answer
    rlcr = tb.make_reward("abstain_verbalized", 0)(["5324$", "5324$", "53_4$"], ["14;4:7", "14;?", "12;4:9"])
    assert rlcr == pytest.approx([1.0 - 0.09, 0.0, -t / (1 - t) - 0.81])
    with pytest.raises(ValueError, match="choose from binary, risk, ternary"):
        tb.make_reward("abstain", 0, scheme="rlcr_risk")
    with pytest.raises(ValueError, match="only the abstain tasks"):
        tb.make_reward("stochastic_reasoning", 0, scheme="risk")


def test_the_warm_start_teacher_declines_at_random_and_otherwise_answers_by_the_law():
    rows = tb.build_rows("abstain", 400)
    rng = np.random.default_rng(0)
    texts = [tb.sample_true_completion("abstain", r, rng) for r in rows for _ in range(10)]
    declines = np.array([t.endswith(";?") for t in texts])
    assert abs(declines.mean() - tb.ABSTAIN_WARM_RATE) < 0.03
    answerable = np.repeat([r["answerable"] for r in rows], 10)
    assert abs(declines[~answerable].mean() - declines[answerable].mean()) < 0.06  # uninformed
    assert all(t[:2] == r["answer"] for t, r in zip(texts, np.repeat(rows, 10)))


def test_regret_by_hand():
    t = 0.65
    # prompt 0: best 0.8 -> optimum (0.8 - 0.65) / 0.35 = 3/7; its samples answer with s 0.8 and decline: mean u
    #   (3/7 + 0) / 2 = 3/14, regret 3/14
    # prompt 1: best 0.6 < t -> optimum 0; one answer with s 0.6: u = -0.05 / 0.35 = -1/7, regret 1/7
    # prompt 2: unanswerable, best 0 -> optimum 0; a decline (its success, 1 by the binary grading, is not read)
    success = [0.8, 0.0, 0.6, 1.0]
    abstained = [False, True, False, True]
    best = [0.8, 0.8, 0.6, 0.0]
    r = risk_threshold_regret(success, abstained, best, [0, 0, 1, 2], threshold=t)
    assert r.per_prompt == pytest.approx([3 / 14, 1 / 7, 0.0])
    assert r.regret == pytest.approx((3 / 14 + 1 / 7) / 3)
    assert r.optimum == pytest.approx((3 / 7) / 3) and r.utility == pytest.approx(r.optimum - r.regret)
    # answering every answerable prompt the likely way: no regret where c > t, the c < t prompt's loss 1/7 there
    opt = risk_threshold_regret([0.8, 0.6, 1.0], [False, False, True], [0.8, 0.6, 0.0], [0, 1, 2], threshold=t)
    assert opt.regret == pytest.approx(1 / 21) and opt.per_prompt[0] == 0.0
    with pytest.raises(ValueError, match="threshold"):
        risk_threshold_regret([0.5], [False], [0.5], [0], threshold=1.0)


def test_the_threshold_chosen_afterwards_maximises_the_drawn_reward():
    from studies.abstention_testbed import threshold_after

    t = 0.65
    loss = -t / (1 - t)
    # lpm sorted high to low: right, right, wrong, right, wrong, wrong; answering the top k earns
    # 1, 2, 2 + loss, 3 + loss, 3 + 2 loss, 3 + 3 loss: best k = 2 -> the threshold is the 2nd's lpm
    calibration = {"logprob_mean": np.array([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]),
                   "drawn": np.array([True, True, False, True, False, False]),
                   "abstained": np.zeros(6, dtype=bool)}
    assert threshold_after(calibration) == -0.2
    # all wrong: keep nothing
    assert threshold_after({**calibration, "drawn": np.zeros(6, dtype=bool)}) == math.inf
    # a tie at the cut cannot be split: the two samples at -0.2 (one right, one wrong) are kept or left together
    tied = {"logprob_mean": np.array([-0.1, -0.2, -0.2]), "drawn": np.array([True, True, False]),
            "abstained": np.zeros(3, dtype=bool)}
    assert threshold_after(tied) == -0.1  # 1 > 1 + 1 + loss
    # the model's own declines earn 0 whatever the threshold
    own = {**calibration, "abstained": np.array([False, False, True, False, False, False])}
    assert threshold_after(own) == -0.4  # 1, 2, 2, 3, 3 + loss, ...
