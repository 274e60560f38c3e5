"""Abstention as a third outcome: reading "I don't know" from completions, the ternary and risk-threshold rewards
(values by hand, the threshold's decision rule), their TRL and verl forms, and what CAPO counts an abstention as."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibrl.tasks.abstention import final_answer_text, is_abstention, risk_threshold_reward, ternary_reward
from calibrl.tasks.registry import get_reward
from calibrl.tasks.rewards import verl_abstention_score


@pytest.mark.parametrize("text, expected", [
    (r"The numbers are missing, so \boxed{IDK}", True),
    (r"\boxed{[IDK]}", True),  # NeMo Gym's form
    (r"\boxed{ I don't know }", True),
    ("Answer: I don't know.", True),
    ("**Final answer:** I do not know", True),
    ("I don\u2019t know", True),  # curly apostrophe
    ("Let me think about it.\n\nI cannot answer this question.", True),
    ("It cannot be determined.", True),
    (r"I don't know the second number yet. 3 + 4 = 7, so \boxed{7}", False),  # the final answer counts
    ("I don't know why, but the answer is 5", False),  # the phrase must be the whole answer
    (r"\boxed{42}", False),
    ("", False),
    (r"\boxed{IDK} on second thought \boxed{12}", False),  # the last boxed answer
])
def test_abstention_is_read_from_the_final_answer(text, expected):
    assert is_abstention(text) is expected


def test_the_phrase_word_shortcut_never_changes_the_verdict():
    """A short text without any default phrase's word is declared no abstention before its final answer is found:
    the verdict equals the full reading (the final answer matched in full) on texts built from the phrases' pieces,
    in any case and spacing."""
    import re

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from calibrl.tasks.abstention import ABSTENTION_PHRASES

    full = re.compile("|".join(f"(?:{p})" for p in ABSTENTION_PHRASES), re.IGNORECASE)

    def read_in_full(text):
        answer = re.sub(r"\s+", " ", final_answer_text(text))
        return bool(answer) and full.fullmatch(answer) is not None

    pieces = st.sampled_from(["I", "i", " ", "  ", "\n", "\t", "don't", "DON’T", "do not", "know", "KNOW", "idk",
                              "[IDK]", "cannot", "can't", "can not", "answer", "this question", "unanswerable",
                              "It cannot be determined", "not enough information", "\\boxed{", "}", "Answer:",
                              "**", ".", "42", "we can", "the answer is"])

    @settings(max_examples=1500, deadline=None)
    @given(st.lists(pieces, max_size=10).map("".join))
    def check(text):
        assert is_abstention(text) == read_in_full(text), text

    check()


def test_custom_patterns_replace_the_phrases_and_conversations_are_read():
    assert is_abstention("Answer: pass", patterns=[r"pass"])
    assert not is_abstention("I don't know", patterns=[r"pass"])
    assert is_abstention([{"role": "assistant", "content": r"\boxed{IDK}"}])
    assert final_answer_text("reasoning\n**Answer:** 12.") == "12"


def test_ternary_reward_by_hand():
    assert ternary_reward(True, False) == 1.0
    assert ternary_reward(False, True) == 0.0
    assert ternary_reward(False, False) == -1.0
    assert ternary_reward(True, True) == 0.0  # an abstention is never also right
    got = ternary_reward([True, False, False], [False, True, False], right=1.0, abstain=0.3, wrong=0.0)
    np.testing.assert_array_equal(got, [1.0, 0.3, 0.0])


def test_risk_threshold_reward_makes_answering_pay_exactly_above_the_threshold():
    assert risk_threshold_reward(False, False, threshold=0.75) == pytest.approx(-3.0)  # -t / (1 - t)
    assert risk_threshold_reward(True, False, threshold=0.75) == 1.0
    assert risk_threshold_reward(False, True, threshold=0.75) == 0.0
    for t in (0.2, 0.5, 0.75, 0.9):
        wrong = risk_threshold_reward(False, False, threshold=t)
        for p in np.linspace(0.01, 0.99, 99):
            answering = p * 1.0 + (1 - p) * wrong  # abstaining earns 0
            if abs(p - t) > 1e-9:
                assert (answering > 0) == (p > t), (t, p)
    outcomes = ([True, False, False], [False, True, False])
    np.testing.assert_array_equal(risk_threshold_reward(*outcomes, threshold=0.5), ternary_reward(*outcomes))
    with pytest.raises(ValueError, match="threshold"):
        risk_threshold_reward(True, False, threshold=1.0)


def test_registered_rewards_grade_math_rows_and_need_their_threshold():
    completions = [r"\boxed{4}", r"\boxed{5}", r"\boxed{IDK}", r"\boxed{4}"]
    answers = ["4", "4", "4", None]
    ternary = get_reward("ternary")
    assert ternary(None, completions, answer=answers) == [1.0, -1.0, 0.0, None]
    assert ternary(None, completions, answer=answers, abstain=0.25, wrong=0.0) == [1.0, 0.0, 0.25, None]
    risk = get_reward("risk_threshold")
    assert risk(None, completions, answer=answers, threshold=0.8) == pytest.approx([1.0, -4.0, 0.0, None])
    with pytest.raises(ValueError, match="params: {threshold"):
        risk(None, completions, answer=answers)


def test_registered_rewards_grade_decisions_by_label():
    completions = ["The answer is B", "I don't know", "The answer is C"]
    got = get_reward("ternary")(None, completions, classes=[["A", "B", "C"]] * 3, label=[1, 1, 1])
    assert got == [1.0, 0.0, -1.0]


def test_verl_score_returns_the_outcome_beside_the_score():
    right = verl_abstention_score("math", r"\boxed{4}", "4")
    idk = verl_abstention_score("math", r"\boxed{IDK}", "4")
    wrong = verl_abstention_score("math", r"\boxed{3}", "4", threshold=0.75)
    assert right == {"score": 1.0, "acc": 1.0, "abstained": False}
    assert idk == {"score": 0.0, "acc": 0.0, "abstained": True}
    assert wrong["score"] == pytest.approx(-3.0) and wrong["acc"] == 0.0 and not wrong["abstained"]


def test_capo_counts_an_abstention_with_the_wrong_answers():
    """CAPO splits a group into correct (reward > 0.5) and not: with the ternary reward an abstention (0) falls on
    the wrong answers' side (-1), so the advantages are those of a group where it had been a wrong answer."""
    from calibrl.advantages.capo import capo_advantages

    correct = [True, False, False, True, False, False]
    abstained = [False, True, False, False, False, True]
    lpm = torch.tensor([-0.2, -0.5, -0.9, -0.4, -0.3, -1.1])
    layout = dict(group_index=torch.tensor([0, 0, 0, 1, 1, 1]), n_groups=2, logprob_mean=lpm)
    with_idk = torch.tensor(ternary_reward(correct, abstained))
    as_wrong = torch.tensor(ternary_reward(correct, [False] * 6))
    a, _ = capo_advantages(rewards=with_idk, **layout)
    b, _ = capo_advantages(rewards=as_wrong, **layout)
    torch.testing.assert_close(a, b)
    assert (a[[0, 3]] > 0).all() and (a[[1, 2, 4, 5]] < 0).all()


def test_a_recipe_passes_a_rewards_params_and_refuses_an_unknown_one():
    from calibrl.trl.recipes import RecipeError, parse_recipe
    from calibrl.trl.train import _reward_funcs

    def recipe(rewards):
        return parse_recipe({"model": "builtin:tiny", "dataset": {"name": "arithmetic"}, "rewards": rewards,
                             "trainer": {"max_steps": 1}}, source="r.yaml")

    (risk,) = _reward_funcs(recipe([{"name": "risk_threshold", "params": {"threshold": 0.75}}]))
    assert risk.__name__ == "risk_threshold_completion_reward"  # TRL logs rewards/<__name__>
    assert risk(None, [r"\boxed{3}", r"\boxed{IDK}"], answer=["4", "4"]) == pytest.approx([-3.0, 0.0])
    with pytest.raises(RecipeError, match="r.yaml: rewards: 'risk_threshold' takes no parameter 'treshold'"):
        _reward_funcs(recipe([{"name": "risk_threshold", "params": {"treshold": 0.75}}]))
    with pytest.raises(RecipeError, match="params of 'ternary' must be a mapping"):
        recipe([{"name": "ternary", "params": [0.3]}])
