"""RLCR (arXiv 2507.16806): the correctness-plus-Brier reward, its properness, the missing-confidence rule, the
registered ``rlcr`` reward on completions, the confidence instruction added to prompts, and a recipe using it."""

import numpy as np
import pytest
import torch

from calibrl.tasks.datasets import decision_prompt, math_prompt
from calibrl.tasks.registry import get_reward
from calibrl.tasks.rewards import rlcr_completion_reward, rlcr_reward
from calibrl.tasks.verbalized import CONFIDENCE_INSTRUCTION, parse_verbalized_confidence, with_confidence_instruction

GRID = np.linspace(0.0, 1.0, 101)


def test_rlcr_reward_hand_values():
    # 1[c] - (q - 1[c])^2
    assert rlcr_reward(correct=True, confidence=0.8) == pytest.approx(1 - 0.04)
    assert rlcr_reward(correct=False, confidence=0.8) == pytest.approx(-0.64)
    assert rlcr_reward(correct=True, confidence=1.0) == 1.0
    assert rlcr_reward(correct=False, confidence=0.0) == 0.0
    assert rlcr_reward(correct=True, confidence=0.0) == 0.0
    assert rlcr_reward(correct=False, confidence=1.0) == -1.0
    assert rlcr_reward(correct=1, confidence=0.5) == pytest.approx(0.75)
    assert rlcr_reward(correct=0, confidence=0.3) == pytest.approx(-0.09)


def test_rlcr_reward_on_arrays_and_tensors():
    correct = [True, False, True, False]
    confidence = [0.8, 0.8, None, None]
    expected = [0.96, -0.64, 0.0, -1.0]
    assert rlcr_reward(correct=correct, confidence=confidence) == pytest.approx(expected)
    tensor = rlcr_reward(correct=torch.tensor(correct), confidence=torch.tensor([0.8, 0.8, float("nan"), float("nan")]))
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    assert tensor.tolist() == pytest.approx(expected)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("inf")])
def test_rlcr_reward_refuses_out_of_range_confidence(bad):
    with pytest.raises(ValueError, match="confidence must be in"):
        rlcr_reward(correct=True, confidence=bad)
    with pytest.raises(ValueError, match="confidence must be in"):
        rlcr_reward(correct=torch.tensor([True, True]), confidence=torch.tensor([0.5, bad]))


@pytest.mark.parametrize("p", [0.0, 0.13, 0.5, 0.72, 1.0])
def test_expected_rlcr_reward_is_maximised_at_the_true_probability(p):
    # correctness ~ Bernoulli(p): E[R(q)] = p R(correct, q) + (1 - p) R(wrong, q), maximised at q = p (proper)
    expected = p * rlcr_reward(correct=np.ones_like(GRID), confidence=GRID) + (1 - p) * rlcr_reward(
        correct=np.zeros_like(GRID), confidence=GRID)
    assert GRID[np.argmax(expected)] == pytest.approx(p, abs=0.005)
    # and the gap to the optimum is exactly (q - p)^2: a wrong sign or a missing term would change it
    assert expected.max() - expected == pytest.approx((GRID - p) ** 2, abs=1e-12)


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_omitting_the_confidence_never_beats_stating_one(p):
    for correct in (True, False):
        missing = rlcr_reward(correct=correct, confidence=None)
        assert missing <= rlcr_reward(correct=correct, confidence=GRID).min() + 1e-12
    # in expectation too, whatever the chance of being right
    stated = p * rlcr_reward(correct=np.ones_like(GRID), confidence=GRID) + (1 - p) * rlcr_reward(
        correct=np.zeros_like(GRID), confidence=GRID)
    missing = p * rlcr_reward(correct=True, confidence=None) + (1 - p) * rlcr_reward(correct=False, confidence=None)
    assert missing <= stated.min() + 1e-12
    # but a right answer still beats a wrong one without a confidence
    assert rlcr_reward(correct=True, confidence=None) > rlcr_reward(correct=False, confidence=None)


def test_parse_verbalized_confidence():
    assert parse_verbalized_confidence(r"\boxed{2} <confidence>0.8</confidence>") == 0.8
    assert parse_verbalized_confidence("<confidence> .25 </confidence>") == 0.25
    assert parse_verbalized_confidence("<CONFIDENCE>1</CONFIDENCE>") == 1.0
    assert parse_verbalized_confidence("<confidence>0.2</confidence> no, <confidence>0.9</confidence>") == 0.9
    assert parse_verbalized_confidence("<confidence>0.2</confidence> <confidence>high</confidence>") is None
    for text in ("", "no tag", "<confidence>80%</confidence>", "<confidence>1.2</confidence>",
                 "<confidence>-0.1</confidence>", "<confidence>1e-1</confidence>", "<confidence></confidence>",
                 "<confidence>0.8"):
        assert parse_verbalized_confidence(text) is None, text


def test_registered_rlcr_reward_on_math_completions():
    reward = get_reward("rlcr")
    assert reward is rlcr_completion_reward
    completions = [
        r"so \boxed{2} <confidence>0.9</confidence>",  # right, confident: 1 - 0.01
        r"so \boxed{3} <confidence>0.9</confidence>",  # wrong, confident: -0.81
        r"so \boxed{3} <confidence>0.1</confidence>",  # wrong, unconfident: -0.01
        r"so \boxed{2}",  # right, no confidence: 0
        r"so \boxed{3} <confidence>sure</confidence>",  # wrong, malformed confidence: -1
        [{"role": "assistant", "content": r"\boxed{\frac{4}{2}} <confidence>0.5</confidence>"}],  # 0.75
        r"\boxed{2} <confidence>0.9</confidence>",  # no gold: None
    ]
    values = reward(["p"] * 7, completions, answer=["2"] * 6 + [None])
    assert values[:6] == pytest.approx([0.99, -0.81, -0.01, 0.0, -1.0, 0.75])
    assert values[6] is None


def test_registered_rlcr_reward_on_decisions_ignores_the_confidence_text():
    reward = get_reward("rlcr")
    classes = [["A", "B", "C", "0", "1"]] * 3  # digit classes: the stated "0.1" must not be read as a decision
    completions = ["Answer: B <confidence>0.6</confidence>", "Answer: C <confidence>0.1</confidence>",
                   "Answer: B <confidence>0.1"]  # unclosed tag: no confidence, and its text is not graded
    values = reward(["p"] * 3, completions, classes=classes, label=["B", "B", "B"])
    assert values == pytest.approx([1 - 0.16, -0.01, 0.0])


def test_confidence_instruction_keeps_each_template_ending_where_the_model_starts():
    plain = with_confidence_instruction(math_prompt("What is 1+1?", "qwen-math"))
    assert plain.endswith("\\boxed{}.\n" + CONFIDENCE_INSTRUCTION)
    chat = with_confidence_instruction(math_prompt("What is 1+1?", "qwen-math-chat"))
    assert chat.endswith(f"What is 1+1?\n{CONFIDENCE_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
    assert chat.count(CONFIDENCE_INSTRUCTION) == 1
    messages = math_prompt("What is 1+1?", "chat")
    asked = with_confidence_instruction(messages)
    assert asked[-1]["content"].endswith("\n" + CONFIDENCE_INSTRUCTION)
    assert CONFIDENCE_INSTRUCTION not in messages[-1]["content"]  # the caller's messages are left alone
    direct = with_confidence_instruction(decision_prompt("Q?", ["x", "y"], ["A", "B"], "direct"))
    assert direct.endswith(f"(A or B).\n{CONFIDENCE_INSTRUCTION}\nAnswer: ")  # the decision letter stays next
    assert with_confidence_instruction("Hi\n") == f"Hi\n{CONFIDENCE_INSTRUCTION}\n"
    with pytest.raises(ValueError, match="no user message"):
        with_confidence_instruction([{"role": "system", "content": "x"}])


def test_a_recipe_trains_on_the_rlcr_reward_with_math_as_correctness(tmp_path, monkeypatch):
    """The documented pairing: ``rewards: [{name: math, weight: 0.0}, rlcr]``: TRL sums only RLCR's value, the
    zero-weight ``math`` reward tells correctness (telemetry, capo), one step on the tiny model runs."""
    import dataclasses

    from calibrl.trl import train as training
    from calibrl.trl.recipes import RewardSpec

    monkeypatch.chdir(tmp_path)
    recipe = training.load_recipe("tiny_cpu")
    recipe = dataclasses.replace(recipe, rewards=[RewardSpec("math", 0.0), RewardSpec("rlcr")])
    args = training.validate_recipe(recipe, overrides={"advantage_estimator": "grpo"})
    assert args.reward_weights == [0.0, 1.0] and args.correctness_reward == "math"
    result = training.train(recipe, overrides={"output_dir": str(tmp_path / "run"), "max_steps": 1,
                                               "advantage_estimator": "grpo"}, progress=False)
    assert result["global_step"] == 1
    logged = {k: v for entry in result["log_history"] for k, v in entry.items()}
    # the tiny model never writes \boxed{} nor a confidence: wrong without confidence, RLCR value -1 for all
    assert logged["rewards/rlcr_completion_reward/mean"] == pytest.approx(-1.0)
    assert logged["rewards/math_reward/mean"] == 0.0 and logged["reward"] == pytest.approx(-1.0)


def test_testbed_verbalized_task_parses_the_confidence_digit_and_pays_rlcr():
    from calibrl.testbed import tasks as tb

    row = tb.build_rows("verbalized", 1)[0]
    prompt, ss, likely, c = row["prompt"], row["answer"], row["likely"], row["p_true"]
    assert prompt.endswith("!") and get_reward("testbed/verbalized") is not None
    assert tb.parse("verbalized", prompt, f"{ss};{likely}:7")["confidence"] == pytest.approx(0.7)
    assert tb.parse("verbalized", prompt, f"{ss};{likely}")["confidence"] is None
    assert tb.true_success_probability("verbalized", prompt, f"{ss};{likely}:7") == c
    reward = tb.make_reward("verbalized", seed=0)
    wrong_sum = f"{(int(ss) + 1) % 100:02d};{likely}"
    # a wrong sum is never right: -(k/10)^2 with a digit, -1 without one or when malformed
    assert reward([prompt] * 3, [wrong_sum + ":3", wrong_sum, "zz"]) == pytest.approx([-0.09, -1.0, -1.0])
    # the likely answer stated at 0.5: right (0.75) with probability c, else wrong (-0.25)
    values = np.array(reward([prompt] * 4000, [f"{ss};{likely}:5"] * 4000))
    assert set(np.round(values, 6)) <= {0.75, -0.25}
    assert np.mean(values == 0.75) == pytest.approx(c, abs=0.03)


def test_testbed_verbalized_warm_start_data_states_uninformed_confidences():
    from calibrl.testbed import tasks as tb

    ds = tb.sft_dataset("verbalized", 500)
    parsed = [tb.parse("verbalized", p, c) for p, c in zip(ds["prompt"], ds["completion"])]
    assert all(x["reasoning_ok"] for x in parsed)
    stated = np.array([x["confidence"] for x in parsed])
    assert set(np.round(stated * 10).astype(int)) == set(range(10))  # every digit appears
    p_true = np.array([tb.STOCHASTIC_C[sum(int(ch) for ch in p[:4]) % 8] for p in ds["prompt"]])
    assert abs(np.corrcoef(stated, p_true)[0, 1]) < 0.15  # unrelated to the truth


def test_stated_confidence_metrics_hand_values():
    from calibrl.testbed.methods import RLCR_METHODS, method_specs, stated_confidence_metrics

    assert set(RLCR_METHODS) <= set(method_specs())
    m = stated_confidence_metrics(stated=[0.1, 0.9, np.nan, 0.5], correct=[False, True, True, True],
                                  p_true=[0.2, 0.9, 0.5, 0.3])
    assert m["stated_fraction"] == 0.75
    # bins: 0.1 (acc 0), 0.5 (acc 1), 0.9 (acc 1): (0.1 + 0.5 + 0.1) / 3
    assert m["stated_ece"] == pytest.approx(0.7 / 3)
    assert m["stated_calib_err"] == pytest.approx((0.1 + 0.0 + 0.2) / 3)
    assert m["brier"] == pytest.approx((0.01 + 0.01 + 0.25) / 3)
    assert m["stated_auroc"] == 1.0 and m["stated_mean"] == pytest.approx(0.5)
    none = stated_confidence_metrics(stated=[np.nan], correct=[True], p_true=[0.5])
    assert none["stated_fraction"] == 0.0 and np.isnan(none["stated_ece"])
