"""The generated tasks (calibrl.tasks.synthetic): determinism, disjoint splits, correct gold answers (recomputed
here by Python's own expression evaluation), and grading through the project's answer equivalence."""

from __future__ import annotations

import ast
import operator
import re

import pytest

from calibrl.tasks.registry import available_datasets, dataset_reward, get_dataset_loader, get_reward
from calibrl.tasks.synthetic import final_answer, split_of

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def python_value(expression: str) -> int:
    """The value of an integer expression by Python's parser and precedence (independent of the task's code)."""

    def walk(node):
        if isinstance(node, ast.BinOp):
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant):
            return node.value
        raise AssertionError(f"unexpected node {node!r}")

    return walk(ast.parse(expression, mode="eval").body)


def question_expression(text: str) -> str:
    """The expression a prompt asks about, read off the prompt text itself (not the row's expression column)."""
    match = re.search(r"(?:What is(?: the value of)?|Compute|Calculate) ([0-9+\-* ]+?)[?.]", text)
    assert match, text
    return match.group(1)


def prompt_text(prompt) -> str:
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


@pytest.mark.parametrize("name", ["arithmetic", "multiple_choice"])
def test_registered_and_deterministic(name):
    assert name in available_datasets()
    load = get_dataset_loader(name)
    first, again = load("test", size=60), load("test", size=60)
    assert first.to_list() == again.to_list()
    other_seed = load("test", size=60, seed=1)
    assert first["expression"] != other_seed["expression"]
    # a limit keeps the first rows of the same draw
    assert load("test", size=60, limit=10).to_list() == first.to_list()[:10]


@pytest.mark.parametrize("name", ["arithmetic", "multiple_choice"])
def test_splits_disjoint_across_seeds(name):
    load = get_dataset_loader(name)
    expressions = {}
    for split in ("train", "validation", "test"):
        rows = []
        for seed in (0, 1):
            rows += load(split, size=300 if split == "train" else 120, seed=seed)["expression"]
        expressions[split] = set(rows)
        assert all(split_of(e) == split for e in rows)
    assert not expressions["train"] & expressions["test"]
    assert not expressions["train"] & expressions["validation"]
    assert not expressions["validation"] & expressions["test"]
    one = load("test", size=120)["expression"]
    assert len(set(one)) == len(one)  # no problem twice within a split
    assert load("eval", size=5).to_list() == load("validation", size=5).to_list()


def test_arithmetic_gold_answers_and_levels():
    rows = get_dataset_loader("arithmetic")("test", size=200).to_list()
    assert {r["level"] for r in rows} == {1, 2, 3, 4}
    for r in rows:
        expression = question_expression(prompt_text(r["prompt"]))
        assert expression == r["expression"]
        assert r["answer"] == str(python_value(expression))
        operations = len(re.findall(r" [+\-*] ", expression))
        assert operations == {1: 1, 2: 1, 3: 2, 4: 3}[r["level"]]
        assert prompt_text(r["prompt"]).endswith("Answer with just the number.")
    assert isinstance(rows[0]["prompt"], list)  # chat template by default
    text = get_dataset_loader("arithmetic")("test", size=3, template="text")
    assert all(isinstance(p, str) for p in text["prompt"])


def test_multiple_choice_options_and_label():
    rows = get_dataset_loader("multiple_choice")("test", size=200).to_list()
    for r in rows:
        assert r["classes"] == ["A", "B", "C", "D"]
        expression = question_expression(r["prompt"])
        options = dict(re.findall(r"^([A-D])\. (-?\d+)$", r["prompt"], re.MULTILINE))
        assert sorted(options) == ["A", "B", "C", "D"]
        values = [int(v) for v in options.values()]
        assert len(set(values)) == 4  # distinct options
        right = python_value(expression)
        assert [k for k, v in options.items() if int(v) == right] == [r["label"]]
        assert r["prompt"].endswith("Answer: ")
    chat = get_dataset_loader("multiple_choice")("test", size=3, template="chat-direct").to_list()
    for r, c in zip(rows, chat):  # same problem and options, as one user message without the "Answer: " cue
        assert c["label"] == r["label"] and c["prompt"][0]["content"] + "\nAnswer: " == r["prompt"]
    labels = [r["label"] for r in rows]
    assert all(labels.count(c) > 20 for c in "ABCD")  # the right letter is not always in the same place


def test_final_answer_reading():
    assert final_answer("6 + 6 = 12") == "12"
    assert final_answer("The answer is -3.") == "-3"
    assert final_answer("Answer: 7\nBecause 3 + 4 = 7, not 8.") == "7"
    assert final_answer("84 - 80 = 4") == "4"  # the minus of an operation is no sign
    assert final_answer("It is 1,234.") == "1234"
    assert final_answer("so \\boxed{5}, I guess 6") == "5"
    assert final_answer("I do not know") is None


def test_grading_by_answer_equivalence():
    assert dataset_reward("arithmetic") == "number"
    assert dataset_reward("multiple_choice") is None  # graded by the row format's default, "decision"
    number = get_reward("number")
    completions = ["17 + 20 = 37", "The answer is 37.0", "\\boxed{37}", "37 apples? no: 36", "I cannot say"]
    assert number([""] * 5, completions, answer=["37"] * 5) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert number([""], ["x"], answer=[None]) == [None]
    decision = get_reward("decision")
    row = get_dataset_loader("multiple_choice")("test", size=1)[0]
    wrong = next(c for c in row["classes"] if c != row["label"])
    assert decision(["p"] * 2, [row["label"], f"Answer: {wrong}"], classes=[row["classes"]] * 2,
                    label=[row["label"]] * 2) == [1.0, 0.0]


def test_generate_grades_arithmetic_with_the_number_reward(tmp_path):
    """calibrl generate's problem loading picks the "number" reward for arithmetic (none named) and its rows
    record the final number as the answer: hand-written completions, graded against the recomputed gold."""
    from calibrl.evaluation.backends import _Sample
    from calibrl.evaluation.generate import GenerateConfig, load_problems, problem_rows

    config = GenerateConfig(model="unused", dataset="arithmetic", out=tmp_path / "s.jsonl", limit=2)
    problems, decision_task, reward_fn, _ = load_problems(config)
    assert not decision_task and reward_fn is get_reward("number")
    problem = problems[0]
    gold = python_value(problem["expression"])
    texts = [f"{problem['expression']} = {gold}", f"The answer is {gold + 1}.", "No idea."]
    group = [_Sample(ids=[1, 2], logps=[-0.5, -1.5], ended=True) for _ in texts]
    rows = problem_rows(problem, group, texts, reward_fn, dataset="arithmetic", variants=None)
    assert [r["answer"] for r in rows] == [str(gold), str(gold + 1), None]
    assert [r["correct"] for r in rows] == [True, False, False]
    assert rows[0]["logprob_mean"] == pytest.approx(-1.0)


def test_unknown_options_are_errors():
    with pytest.raises(ValueError, match="split"):
        get_dataset_loader("arithmetic")("dev")
    with pytest.raises(ValueError, match="levels"):
        get_dataset_loader("arithmetic")("test", levels=[5])
    with pytest.raises(ValueError, match="template"):
        get_dataset_loader("multiple_choice")("test", template="nope")
    only_one = get_dataset_loader("arithmetic")("test", size=20, levels=[3])
    assert set(only_one["level"]) == {3}
