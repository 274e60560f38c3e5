"""Rewards for real workloads: math (last \\boxed{} + math-verify), format, decision letters, verl adapters."""

import threading

import pytest

from calibrl.tasks.registry import get_reward
from calibrl.tasks.rewards import (
    check_math,
    completion_text,
    extract_decision,
    label_to_class,
    last_boxed,
    math_equal,
    verl_compute_score,
    verl_decision_score,
    verl_math_score,
)

import math_verify  # noqa: E402,F401


def _last_boxed_by_regex(text):
    """The reference: every match of the box command left to right, tried from the last back."""
    import re

    for match in reversed(list(re.finditer(r"\\(?:boxed|fbox)\s*", text))):
        start = match.end()
        if start < len(text) and text[start] == "{":
            depth = 0
            for i in range(start, len(text)):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    return text[start + 1 : i].strip()
            continue
        m = re.match(r"[^\s${}]+", text[start:])
        if m:
            return m.group(0).strip()
    return None


def test_last_boxed_equals_a_scan_of_every_match_from_the_last():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    atoms = st.sampled_from(["\\boxed", "\\fbox", "{", "}", " ", "x", "1", "$", "\\", "oxed", "\\boxed{", "\n"])

    @settings(max_examples=1000, deadline=None)
    @given(st.lists(atoms, max_size=14).map("".join))
    def check(text):
        assert last_boxed(text) == _last_boxed_by_regex(text)

    check()


def test_last_boxed_takes_the_last_and_matches_nested_braces():
    assert last_boxed(r"first \boxed{1}, then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{x^{2}+\sqrt{y_{1}}}") == r"x^{2}+\sqrt{y_{1}}"
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed(r"so \boxed 5$") == "5"
    assert last_boxed(r"\boxed{3} and a truncated \boxed{4") == "3"  # unclosed last box: previous one
    assert last_boxed("no answer here") is None


def test_math_equal_uses_math_verify():
    assert math_equal("0.5", r"\frac{1}{2}")
    assert math_equal(r"\dfrac{1}{2}", "1/2")
    assert math_equal("10", 10)  # numeric gold (AMC23 stores floats)
    assert math_equal("-2, 2", "2, -2")  # OlympiadBench multiple answers
    assert math_equal("2", ["$3$", "$2$"])  # a list of acceptable golds
    assert not math_equal("3", "4")
    assert not math_equal(None, "4")
    assert not math_equal("", "4")


def test_math_reward_signature_conversational_and_missing_gold():
    reward = get_reward("math")
    completions = [
        r"... so the answer is \boxed{2}.",
        r"first \boxed{2} then I change my mind \boxed{3}",  # the LAST box counts
        [{"role": "assistant", "content": r"\boxed{\sqrt{4}}"}],  # conversational completion
        "I don't know",  # no box -> 0.0
        r"\boxed{\text{\{garbage}",  # unparseable -> 0.0
        r"\boxed{2}",
    ]
    answers = ["2", "2", "2", "2", "2", None]
    assert reward(["p"] * 6, completions, answer=answers) == [1.0, 0.0, 1.0, 0.0, 0.0, None]


def test_math_reward_in_a_thread_runs_without_signal_timeouts():
    results = []
    thread = threading.Thread(target=lambda: results.append(check_math(r"\boxed{\frac{2}{4}}", "0.5")))
    thread.start()
    thread.join()
    assert results == [(r"\frac{2}{4}", True)]


def test_format_reward():
    reward = get_reward("format")
    assert reward(["p"] * 3, [r"\boxed{1}", r"\boxed{}", "none"]) == [1.0, 0.0, 0.0]


def test_extract_decision_is_the_last_standalone_class():
    classes = ["A", "B", "C", "D", "E"]
    assert extract_decision("Answer: B", classes) == ("B", 8)
    assert extract_decision("A is wrong and so is B, hence C.", classes)[0] == "C"
    assert extract_decision("Bananas are Delicious", classes) == (None, -1)
    assert extract_decision("(D)", classes)[0] == "D"
    assert extract_decision("ss:Y", ["Y", "N"])[0] == "Y"


def test_decision_reward_with_index_and_letter_labels():
    reward = get_reward("decision")
    classes = [["A", "B", "C", "D"]] * 4
    completions = ["Answer: B", "Answer: C", "no letter at all", [{"role": "assistant", "content": "I pick A"}]]
    assert reward(["p"] * 4, completions, classes=classes, label=[1, "B", "B", "A"]) == [1.0, 0.0, 0.0, 1.0]
    assert reward(["p"], ["B"], classes=[["A", "B"]], label=[None]) == [None]
    assert label_to_class("3", ["A", "B", "C", "D"]) == "D"
    assert label_to_class("Z", ["A", "B"]) is None


def test_verl_compute_score_dispatch():
    assert verl_compute_score("agentica-org/DeepScaleR-Preview-Dataset", r"thus \boxed{12}", "12") == 1.0
    assert verl_compute_score("math500", r"thus \boxed{13}", "12") == 0.0
    assert verl_compute_score("tau/commonsense_qa", "Answer: C", "C") == 1.0
    assert verl_compute_score("anything", "Answer: C", 2, extra_info={"task": "decision", "classes": list("ABCD")}) == 1.0
    assert verl_math_score("x", r"\boxed{1/2}", "0.5") == 1.0
    assert verl_decision_score("x", "Answer: E", "E") == 1.0
    with pytest.raises(ValueError, match="unknown task"):
        verl_compute_score("x", "", "", extra_info={"task": "poetry"})


def test_completion_text_variants():
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]) == "x"
    assert completion_text(None) == ""
