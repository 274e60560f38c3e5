"""Unanswerable items: the generated tasks' variants, a file's ``answerable`` field, how every reward grades them
(TRL and verl), and what ``calibrl generate`` writes for them.

On an item with no right answer the right response is to decline: the binary rewards grade "I don't know" 1 and any
answer 0; the abstention rewards give no answer the right answer's value (declining earns the abstention's, an
answer the wrong answer's)."""

from __future__ import annotations

import json
import math

import pytest

from calibrl.tasks.datasets import load_file, to_verl_rows
from calibrl.tasks.rewards import (
    decision_reward,
    math_reward,
    risk_threshold_completion_reward,
    ternary_completion_reward,
    verl_abstention_score,
    verl_compute_score,
)
from calibrl.tasks.synthetic import (
    UNKNOWN_OPERAND,
    evaluate_expression,
    load_arithmetic,
    load_multiple_choice,
    number_reward,
)

DECLINE = "Let me see.\nI don't know."


def _tokens(expression: str) -> list:
    return [part if part in "+-*" else int(part) for part in expression.split()]


def test_share_zero_leaves_the_tasks_as_they_were():
    for load in (load_arithmetic, load_multiple_choice):
        plain, zero = load("test", size=30), load("test", size=30, unanswerable=0.0)
        assert plain[:] == zero[:]
        assert "answerable" not in plain.column_names


def test_arithmetic_variants_miss_one_operand_and_keep_the_answerable_rows():
    plain = load_arithmetic("test", size=400)
    mixed = load_arithmetic("test", size=400, unanswerable=0.25)
    n_out = sum(not r["answerable"] for r in mixed)
    # each row independently with probability 0.25: 100 expected, standard deviation sqrt(400 * 0.25 * 0.75) = 8.7
    assert abs(n_out - 100) < 4 * math.sqrt(400 * 0.25 * 0.75)
    for before, row in zip(plain, mixed):
        text = row["prompt"][0]["content"]
        assert text.endswith("or \"I don't know\" if it cannot be determined.")  # every prompt offers it
        assert row["prompt_id"] == before["prompt_id"] and row["level"] == before["level"]
        if row["answerable"]:
            assert (row["answer"], row["expression"]) == (before["answer"], before["expression"])
            assert text.split("?")[0].split(".")[0] == before["prompt"][0]["content"].split("?")[0].split(".")[0]
        else:
            assert row["answer"] is None
            parts, original = row["expression"].split(), before["expression"].split()
            assert parts.count(UNKNOWN_OPERAND) == 1 and UNKNOWN_OPERAND in text
            missing = parts.index(UNKNOWN_OPERAND)
            assert missing % 2 == 0  # an operand, never an operator
            assert parts[:missing] + parts[missing + 1:] == original[:missing] + original[missing + 1:]


def test_a_rows_fate_depends_on_neither_the_size_nor_the_other_rows():
    small = load_arithmetic("test", size=40, unanswerable=0.3)
    large = load_arithmetic("test", size=400, unanswerable=0.3, limit=40)
    assert small[:] == large[:]
    assert 0 < sum(not a for a in small["answerable"]) < 40


def test_multiple_choice_variants_have_no_right_option():
    mixed = load_multiple_choice("test", size=200, unanswerable=0.5, template="reasoning")
    unanswerable = [r for r in mixed if not r["answerable"]]
    assert 60 < len(unanswerable) < 140
    for row in mixed:
        options = [int(line.split(". ", 1)[1]) for line in row["prompt"].splitlines() if line[:3] in
                   ("A. ", "B. ", "C. ", "D. ")]
        value = evaluate_expression(_tokens(row["expression"]))
        assert len(set(options)) == 4
        assert '"Answer: I don\'t know" if no option is right' in row["prompt"]
        if row["answerable"]:
            assert options["ABCD".index(row["label"])] == value
        else:
            assert row["label"] is None and value not in options


def test_a_bad_share_is_refused():
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="unanswerable must be a share"):
            load_arithmetic("test", size=5, unanswerable=bad)


def test_binary_rewards_grade_declining_right_on_unanswerable_rows_only():
    completions = [DECLINE, "The answer is 7.", DECLINE, "7"]
    columns = {"answer": [None, None, "7", "7"], "answerable": [False, False, True, True]}
    assert number_reward(None, completions, **columns) == [1.0, 0.0, 0.0, 1.0]
    math_completions = [DECLINE, r"\boxed{7}", DECLINE, r"\boxed{7}"]
    assert math_reward(None, math_completions, **columns) == [1.0, 0.0, 0.0, 1.0]
    decision = ["I don't know", "Answer: B", "I don't know", "Answer: B"]
    assert decision_reward(None, decision, classes=[["A", "B"]] * 4, label=[None, None, "B", "B"],
                           answerable=[False, False, True, True]) == [1.0, 0.0, 0.0, 1.0]
    # without the column every row is answerable, as before
    assert number_reward(None, ["7", DECLINE], answer=["7", "7"]) == [1.0, 0.0]


def test_abstention_rewards_never_pay_an_answer_to_an_unanswerable_item():
    completions = [r"\boxed{IDK}", r"\boxed{7}", r"\boxed{IDK}", r"\boxed{7}", r"\boxed{8}"]
    columns = {"answer": [None, None, "7", "7", "7"], "answerable": [False, False, True, True, True]}
    assert ternary_completion_reward(None, completions, **columns) == [0.0, -1.0, 0.0, 1.0, -1.0]
    # t = 0.8: wrong -0.8 / 0.2 = -4
    assert risk_threshold_completion_reward(None, completions, threshold=0.8, **columns) == pytest.approx(
        [0.0, -4.0, 0.0, 1.0, -4.0])


def test_abstention_rewards_on_multiple_choice_rows_read_answerable_too():
    # decision rows (a label column): an unanswerable row has no label, and must still be graded, not None
    completions = ["I don't know", "Answer: A", "I don't know", "Answer: A", "Answer: B"]
    columns = {"classes": [["A", "B"]] * 5, "label": [None, None, "A", "A", "A"],
               "answerable": [False, False, True, True, True]}
    assert ternary_completion_reward(None, completions, **columns) == [0.0, -1.0, 0.0, 1.0, -1.0]
    assert risk_threshold_completion_reward(None, completions, threshold=0.5, **columns) == [0.0, -1.0, 0.0, 1.0,
                                                                                            -1.0]
    # the generated task's own rows, as TRL hands them over
    rows = load_multiple_choice("test", size=12, unanswerable=0.5)
    assert not all(rows["answerable"])
    scored = ternary_completion_reward(None, ["I don't know"] * len(rows), classes=rows["classes"],
                                       label=rows["label"], answerable=rows["answerable"])
    assert scored == [0.0] * len(rows)


def test_verl_reads_answerable_from_extra_info_and_the_export_writes_it():
    info = {"task": "math", "answerable": False}
    assert verl_compute_score("arithmetic", DECLINE, "", info) == 1.0
    assert verl_compute_score("arithmetic", r"\boxed{7}", "", info) == 0.0
    assert verl_abstention_score("arithmetic", DECLINE, "", info) == {"score": 0.0, "acc": 0.0, "abstained": True}
    assert verl_abstention_score("arithmetic", r"\boxed{7}", "", info)["score"] == -1.0
    assert verl_abstention_score("arithmetic", r"\boxed{7}", "7", {"task": "math"})["score"] == 1.0
    data = load_arithmetic("test", size=40, unanswerable=0.5)
    for row, exported in zip(data, to_verl_rows(data)):
        if row["answerable"]:
            assert exported["reward_model"]["ground_truth"] == row["answer"]
            assert "answerable" not in exported["extra_info"]
        else:
            assert exported["reward_model"]["ground_truth"] == ""
            assert exported["extra_info"]["answerable"] is False


def test_a_files_answerable_field(tmp_path):
    math_file = tmp_path / "mine.jsonl"
    rows = [{"problem": "What is 2 + 2?", "answer": "4"},
            {"problem": "What is 2 + y?", "answerable": False},  # no gold needed
            {"problem": "What is 3 + 3?", "answer": "6", "answerable": True},
            {"problem": "No gold and answerable: dropped"}]
    math_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_file(math_file)
    assert data["answerable"] == [True, False, True]
    assert data["answer"] == ["4", None, "6"]
    choice_file = tmp_path / "choices.jsonl"
    choice_file.write_text(
        json.dumps({"question": "Which is even?", "choices": ["1", "2"], "label": "B"}) + "\n"
        + json.dumps({"question": "Which is prime?", "choices": ["4", "6"], "answerable": False}) + "\n")
    data = load_file(choice_file)
    assert data["answerable"] == [True, False] and data["label"] == ["B", None]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "1 + 1", "answer": "2", "answerable": "no"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 1: field 'answerable': expected true or false"):
        load_file(bad)


def test_generate_writes_answerable_and_grades_declining(monkeypatch, tmp_path):
    import calibrl.evaluation.generate as generate_module
    from calibrl.evaluation.backends import _Sample
    from calibrl.evaluation.samples import load_samples

    texts = ["I don't know", "42"]

    class Scripted:
        name = "scripted"

        def generate(self, prompts, n, seed):
            return [[_Sample(ids=[i % 2], logps=[-0.5], ended=True) for i in range(n)] for _ in prompts]

        def decode(self, ids):
            return texts[ids[0]]

    monkeypatch.setattr(generate_module, "open_backend", lambda config, **kw: (Scripted(), None))
    out = tmp_path / "s.jsonl"
    generate_module.generate(model="scripted", dataset="arithmetic", out=out, limit=1, n=2, progress=False,
                             unanswerable=1.0)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["answerable"], r["correct"], r["reward"]) for r in rows] == [(False, True, 1.0), (False, False, 0.0)]
    assert json.loads((tmp_path / "s.jsonl.meta.json").read_text())["unanswerable"] == 1.0
    samples = load_samples(out)
    assert samples.abstained.tolist() == [True, False]
    with pytest.raises(generate_module.GenerateError, match="cannot make unanswerable items"):
        generate_module.generate(model="scripted", dataset="math500", out=tmp_path / "m.jsonl", limit=1, n=2,
                                 progress=False, unanswerable=0.1)
