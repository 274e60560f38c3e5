"""Every shipped recipe (calibrl/recipes/, also reachable as configs/) loads and builds its trainer with the tiny
stand-in model on CPU (datasets read from the local fixture files: no network); the tiny CPU recipe trains for real
and leaves its per-step log history in the output folder."""

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "calibrl" / "recipes"
FIXTURES = Path(__file__).parent / "fixtures"
RECIPES = sorted(p.name for p in CONFIGS.glob("*.yaml"))

import calibrl.trl.train as training  # noqa: E402

# hub datasets replaced by the local files in the same format
LOCAL = {name: FIXTURES / f"{name}.jsonl" for name in
         ("deepscaler", "math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench", "commonsenseqa", "openbookqa")}
CPU = {"use_vllm": False, "bf16": False, "use_cpu": True, "activation_checkpointing": False, "report_to": "none"}


def _localise(recipe):
    for spec in (recipe.dataset, recipe.eval_dataset):
        if spec is not None and spec.path is None and spec.name in LOCAL:
            spec.path = str(LOCAL[spec.name])
        if spec is not None and spec.path is not None and not Path(spec.path).is_absolute():
            spec.path = str(ROOT / spec.path)
    return recipe


def test_the_expected_recipes_exist():
    assert {"capo_qwen2.5-math-1.5b_deepscaler.yaml", "grpo_qwen2.5-math-1.5b_deepscaler.yaml",
            "decision_qwen3-1.7b_commonsenseqa.yaml", "tiny_cpu.yaml"} <= set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_builds_with_the_tiny_stand_in(name, tmp_path):
    from calibrl.models import build_tiny_model

    recipe = _localise(training.load_recipe(CONFIGS / name))
    model, tokenizer = build_tiny_model()
    trainer = training.build_trainer(recipe, model=model, tokenizer=tokenizer,
                                     overrides={**CPU, "output_dir": str(tmp_path / "out")})
    args = trainer.args
    for key, value in recipe.trainer.items():
        if key in CPU or key == "output_dir":
            continue
        assert getattr(args, key) == value or str(getattr(args, key)) == str(value) or key in (
            "lr_scheduler_type", "eval_strategy", "save_strategy", "decision_classes"), key
    assert len(trainer.train_dataset) >= 1


def test_paper_settings_in_the_capo_and_grpo_twins():
    capo = training.load_recipe(CONFIGS / "capo_qwen2.5-math-1.5b_deepscaler.yaml")
    grpo = training.load_recipe(CONFIGS / "grpo_qwen2.5-math-1.5b_deepscaler.yaml")
    t = capo.trainer
    assert capo.model.name_or_path == "Qwen/Qwen2.5-Math-1.5B"
    assert (t["learning_rate"], t["num_generations"], t["epsilon"], t["beta"], t["temperature"]) == (1e-6, 8, 0.2, 0.0, 1.0)
    assert (t["advantage_estimator"], t["capo_tau"], t["capo_mask"], t["capo_ref_high"], t["capo_ref_low"]) == (
        "capo", 0.6, "fixed", 2.5, 1.05)
    # 128 prompts x 8 rollouts per generation round on 8 GPUs, two updates of 512 completions, 600 rounds
    assert t["per_device_train_batch_size"] * 8 * t["steps_per_generation"] == 128 * 8
    assert t["per_device_train_batch_size"] * 8 * t["gradient_accumulation_steps"] == 64 * 8
    assert t["max_steps"] == 600 * 2
    # the twin differs only in the advantage
    strip = lambda d: {k: v for k, v in d.items() if not k.startswith("capo_") and k not in (  # noqa: E731
        "advantage_estimator", "output_dir", "scale_rewards")}
    assert strip(capo.trainer) == strip(grpo.trainer) and grpo.trainer["advantage_estimator"] == "grpo"
    assert capo.dataset == grpo.dataset and capo.model == grpo.model and capo.rewards == grpo.rewards
    decision = training.load_recipe(CONFIGS / "decision_qwen3-1.7b_commonsenseqa.yaml")
    assert decision.model.peft["r"] == 16 and decision.model.peft["lora_alpha"] == 32
    assert decision.trainer["decision_loss_coef"] == 1e-3 and decision.dataset.limit == 500


def test_intuitor_recipe_has_the_authors_settings_and_reaches_the_estimator():
    """sunblaze-ucb/Intuitor's verl-intuitor/math_intuitor.sh: Qwen2.5-3B, lr 3e-6 cosine with 10% warm-up, n = 8,
    k3 KL 0.005, temperature 1, 3072-token responses, 128 prompts per step and one update each, 1 epoch."""
    from calibrl.advantages import available_estimators

    recipe = training.load_recipe(CONFIGS / "intuitor_qwen2.5-3b_deepscaler.yaml")
    t = recipe.trainer
    assert recipe.model.name_or_path == "Qwen/Qwen2.5-3B" and recipe.dataset.limit == 7500
    assert (t["advantage_estimator"], t["learning_rate"], t["lr_scheduler_type"], t["warmup_steps"]) == (
        "intuitor", 3e-6, "cosine", 0.1)
    assert (t["num_generations"], t["beta"], t["temperature"], t["max_completion_length"], t["num_train_epochs"]) == (
        8, 0.005, 1.0, 3072, 1)
    assert t["advantage_params"] == {"eps": 1e-4, "add_reward_advantage": False}
    per_update = t["per_device_train_batch_size"] * 8 * t["gradient_accumulation_steps"]
    assert per_update == t["per_device_train_batch_size"] * 8 * t["steps_per_generation"] == 128 * 8
    assert "intuitor" in available_estimators()


def test_configs_folder_still_names_the_shipped_recipes():
    assert {p.name for p in (ROOT / "configs").glob("*.yaml")} == set(RECIPES)
    assert training.load_recipe(ROOT / "configs" / "tiny_cpu.yaml").dataset.path == str(
        CONFIGS / "data" / "deepscaler.jsonl")


def _defined(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


@pytest.mark.slow
def test_tiny_cpu_recipe_trains_and_writes_its_log_history(tmp_path, monkeypatch):
    """By its shipped name, from any folder (its data lies next to it); two logged steps land in
    log_history.jsonl with step, epoch and the metrics, and undefined metrics (the AUROC of a batch where every
    completion is wrong: the tiny model never answers) are left out instead of logged as NaN."""
    import warnings

    monkeypatch.chdir(tmp_path)
    recipe = training.load_recipe("tiny_cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = training.train(recipe, overrides={"output_dir": str(tmp_path / "run"), "max_steps": 2},
                                progress=False)
    assert result["global_step"] == 2
    # TRL 1.16's calls of transformers' deprecated gradient_checkpointing names are not the user's to fix
    assert not [w for w in caught if "gradient_checkpointing" in str(w.message)], [str(w.message) for w in caught]
    assert (tmp_path / "run" / "config.json").exists()
    lines = [json.loads(line) for line in (tmp_path / "run" / "log_history.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert {"epoch", "reward", "learning_rate", "calibration/accuracy",
                "calibration/estimator/mask_fraction"} <= set(line), sorted(line)
        assert "calibration/auroc" not in line  # one class only: undefined this step
    for line in lines:
        assert all(_defined(v) for v in line.values()), line
    for entry in result["log_history"]:
        assert all(_defined(v) for v in entry.values()), entry


def test_dataset_section_typos_are_errors(tmp_path):
    """A misspelt loader option (`tempalte`) names the key and the file instead of vanishing into the loader's
    **kwargs; hub load_dataset arguments pass only under `load_kwargs:`."""
    from calibrl.models import build_tiny_model

    text = (CONFIGS / "tiny_cpu.yaml").read_text()
    assert "  template: none" in text and "data/deepscaler.jsonl" in text
    fixture = str(FIXTURES / "deepscaler.jsonl")
    cases = {
        "typo": text.replace("  template: none", "  tempalte: none"),
        "typo_in_options": text.replace("  template: none", "  options: {tempalte: none}"),
        "load_kwargs": text.replace("  template: none", "  template: none\n  load_kwargs: {revision: main}"),
    }
    for name, body in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(body.replace("data/deepscaler.jsonl", fixture))
        recipe = training.load_recipe(path)
        model, tokenizer = build_tiny_model()
        build = lambda: training.build_trainer(recipe, model=model, tokenizer=tokenizer,  # noqa: E731
                                               overrides={**CPU, "output_dir": str(tmp_path / "out")})
        if name == "load_kwargs":
            assert recipe.dataset.load_kwargs == {"revision": "main"}
            assert len(build().train_dataset) >= 1
        else:
            with pytest.raises(training.RecipeError, match=rf"{name}\.yaml.*'tempalte'.*'dataset'.*'template'"):
                build()


def test_shipped_trainer_field_types_equal_the_installed_config():
    """The field types shipped for fast recipe checks equal CalibratedGRPOConfig's under the versions they name;
    under other versions the check reads the installed config instead."""
    from importlib.metadata import version

    from calibrl.trl import trainer_fields
    from calibrl.trl.recipes import _trainer_specs, live_trainer_specs

    live = live_trainer_specs()
    if {name: version(name) for name in trainer_fields.VERSIONS} == trainer_fields.VERSIONS:
        assert trainer_fields.FIELDS == live  # else: python -m calibrl.trl.trainer_fields
    assert _trainer_specs() == live
    assert live["learning_rate"] == "float" and live["capo_tau"] == "float"


def test_type_specs_accept_and_name_what_the_annotations_do():
    from typing import Literal, Optional

    from calibrl.trl.recipes import spec_matches, spec_name, type_spec

    spec = type_spec(Optional[list[int]])
    assert spec_name(spec) == "list of int or null"
    assert spec_matches(None, spec) and spec_matches([1, 2], spec)
    assert not spec_matches([1, True], spec) and not spec_matches("1", spec)
    assert spec_matches(3, type_spec(float)) and not spec_matches(True, type_spec(float))
    lit = type_spec(Literal["a", "b"])
    assert spec_matches("a", lit) and not spec_matches("c", lit) and spec_name(lit) == "'a' or 'b'"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["steps", "no"])
def test_the_final_evaluation_runs_once(tmp_path, monkeypatch, strategy):
    """With eval_strategy "steps" transformers already evaluates at the last step; the run's closing evaluation
    is then not repeated (on a GPU recipe that is a whole benchmark sampled twice). Without it, it runs once."""
    import copy

    monkeypatch.chdir(tmp_path)
    recipe = training.load_recipe("tiny_cpu")
    recipe.eval_dataset = copy.deepcopy(recipe.dataset)
    overrides = {"output_dir": str(tmp_path / "run"), "max_steps": 2, "eval_strategy": strategy,
                 "per_device_eval_batch_size": 6}
    if strategy == "steps":
        overrides["eval_steps"] = 2
    result = training.train(recipe, overrides=overrides, progress=False)
    assert result["global_step"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "log_history.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "eval_runtime" in line] == [2]


def test_authors_settings_in_the_clip_cov_and_kl_cov_recipes():
    """recipe/dapo/7b_clip_cov.sh and 7b_kl_cov.sh (PRIME-RL/Entropy-Mechanism-of-RL): 256 prompts x 8 per generation,
    updates of 32 prompts on 8 GPUs, lr 5e-7; Clip-Cov with the PPO clip opened to [0, 2]; KL-Cov's k_percent 0.2 read
    as the percentage it is in their code (int(n * k / 100)), i.e. verl's kl_cov_ratio 2e-3."""
    clip = training.load_recipe(CONFIGS / "clipcov_qwen2.5-7b_deepscaler.yaml").trainer
    kl = training.load_recipe(CONFIGS / "klcov_qwen2.5-7b_deepscaler.yaml").trainer
    for t in (clip, kl):
        assert t["learning_rate"] == 5e-7 and t["num_generations"] == 8 and t["beta"] == 0.0
        assert t["per_device_train_batch_size"] * 8 * t["steps_per_generation"] == 256 * 8
        assert t["per_device_train_batch_size"] * 8 * t["gradient_accumulation_steps"] == 32 * 8
        assert t["max_completion_length"] == 8192 and t["cov_loss_aggregation"] == "token-mean"
    assert (clip["loss_type"], clip["epsilon"], clip["epsilon_high"]) == ("clip_cov", 1.0, 1.0)
    assert (clip["clip_cov_ratio"], clip["clip_cov_lb"], clip["clip_cov_ub"]) == (2e-4, 1.0, 5.0)
    k_percent = 0.2
    assert (kl["loss_type"], kl["kl_cov_ratio"], kl["ppo_kl_coef"]) == ("kl_cov", k_percent / 100, 1.0)
