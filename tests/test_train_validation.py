"""``calibrl train`` checks the whole recipe before it builds a model: every bad value is one line naming the file
and the key, exit status 2, no traceback, and no output folder left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from calibrl.cli import app

FIXTURES = Path(__file__).parent / "fixtures"


def _base(out: Path) -> dict:
    """A valid tiny recipe (the shipped tiny_cpu recipe's shape) writing to ``out``."""
    return {
        "model": {"name_or_path": "builtin:tiny"},
        "dataset": {"name": "deepscaler", "path": str(FIXTURES / "deepscaler.jsonl"), "template": "none"},
        "rewards": ["math", "format"],
        "trainer": {
            "output_dir": str(out), "advantage_estimator": "capo", "capo_tau": 0.6, "learning_rate": 1.0e-4,
            "per_device_train_batch_size": 6, "num_generations": 3, "max_completion_length": 8,
            "max_steps": 1, "use_cpu": True, "report_to": "none", "save_strategy": "no",
        },
    }


def _trainer(**values):
    return lambda r, tmp: r["trainer"].update(values)


def _empty_dataset(recipe, tmp):
    path = tmp / "empty.jsonl"
    path.write_text(json.dumps({"problem": "no answer here", "answer": ""}) + "\n")
    recipe["dataset"]["path"] = str(path)


def _model_folder(config_text: str | None, weights: bool):
    """A local model folder holding ``config.json`` with ``config_text`` and (with ``weights``) a weights file."""
    def edit(recipe, tmp):
        folder = tmp / "model"
        folder.mkdir()
        if config_text is not None:
            (folder / "config.json").write_text(config_text)
        if weights:
            (folder / "model.safetensors").write_bytes(b"\0" * 16)
        recipe["model"].update(name_or_path=str(folder))
    return edit


def _hub_unreachable(recipe, tmp):
    """A hub id that is not cached while the hub's host refuses connections (a closed local port)."""
    from huggingface_hub import constants

    recipe["model"].update(name_or_path="calibrl-test/not-cached-model")
    _PATCHES.append((constants, "ENDPOINT", "http://127.0.0.1:9"))
    _PATCHES.append((constants, "HF_HUB_OFFLINE", False))


def _hub_offline(recipe, tmp):
    from huggingface_hub import constants

    recipe["model"].update(name_or_path="calibrl-test/not-cached-model")
    _PATCHES.append((constants, "HF_HUB_OFFLINE", True))


_PATCHES: list = []  # (object, attribute, value) a case edit asks the test to monkeypatch


# (case id, recipe edit, extra CLI arguments, text the error must name)
CASES = [
    ("tau_zero", _trainer(capo_tau=0), [], "capo_tau"),
    ("tau_negative", _trainer(capo_tau=-1), [], "capo_tau"),
    ("tau_nan", _trainer(capo_tau=float("nan")), [], "capo_tau"),
    ("tau_string", _trainer(capo_tau="0.6"), [], "capo_tau"),
    ("estimator_typo", _trainer(advantage_estimator="capoo"), [], "advantage_estimator"),
    ("lr_word", _trainer(learning_rate="fast"), [], "learning_rate"),
    ("lr_list", _trainer(learning_rate=[1e-4, 1e-5]), [], "learning_rate"),
    ("max_steps_word", _trainer(max_steps="three"), [], "max_steps"),
    ("set_lr_word", lambda r, tmp: None, ["--set", "learning_rate=fast"], "learning_rate"),
    ("missing_dataset", lambda r, tmp: r["dataset"].update(path=str(tmp / "nope.jsonl")), [], "dataset.path"),
    ("empty_dataset", _empty_dataset, [], "dataset"),
    ("correctness_reward_typo", _trainer(correctness_reward="maths"), [], "correctness_reward"),
    ("unknown_reward", lambda r, tmp: r.update(rewards=["math", "formatt"]), [], "rewards"),
    ("negative_temperature", _trainer(temperature=-1), [], "temperature"),
    ("missing_model_dir", lambda r, tmp: r["model"].update(name_or_path="./no/such/model"), [], "name_or_path"),
    ("set_lr_negative", lambda r, tmp: None, ["--set", "learning_rate=-1e-4"], "learning_rate"),
    ("set_lr_nan", lambda r, tmp: None, ["--set", "learning_rate=.nan"], "learning_rate"),
    ("set_no_completion_tokens", lambda r, tmp: None, ["--set", "max_completion_length=0"], "max_completion_length"),
    ("beta_negative", _trainer(beta=-0.04), [], "beta"),
    ("max_steps_zero", lambda r, tmp: None, ["--max-steps", "0"], "max_steps"),
    ("model_dir_without_config", lambda r, tmp: (tmp / "model").mkdir() or r["model"].update(
        name_or_path=str(tmp / "model")), [], "config.json"),
    ("output_dir_is_a_file", lambda r, tmp: (tmp / "taken").write_text("x"),
     ["--output-dir", "taken"], "output_dir"),
    ("output_dir_under_a_file", lambda r, tmp: r["trainer"].update(output_dir=str(tmp / "run.yaml" / "out")) or (
        tmp / "run.yaml").write_text("x"), [], "output_dir"),
    # a field the chosen estimator does not read: refused, not trained without it
    ("set_mask_with_grpo", lambda r, tmp: None,
     ["--set", "advantage_estimator=grpo", "--set", "capo_mask=fixed"], "overrides.capo_mask"),
    ("gcpo_measure_with_capo", _trainer(gcpo_measure="barycentric"), [], "trainer.gcpo_measure"),
    ("tau_with_grpo_mask", _trainer(advantage_estimator="grpo_mask", capo_mask="fixed", capo_tau=0.5), [],
     "trainer.capo_tau"),
    ("ref_high_with_quantile_mask", _trainer(capo_mask="quantile", capo_ref_high=3.0), [], "capo_ref_high"),
    # counts TRL's config and transformers take unchecked (ZeroDivisionError, torch's sampler after the model loaded)
    ("num_generations_zero", _trainer(num_generations=0), [], "trainer.num_generations"),
    ("batch_size_zero", _trainer(per_device_train_batch_size=0), [], "trainer.per_device_train_batch_size"),
    ("set_batch_size_zero", lambda r, tmp: None, ["--set", "per_device_train_batch_size=0"],
     "overrides.per_device_train_batch_size"),
    ("gradient_accumulation_zero", _trainer(gradient_accumulation_steps=0), [], "gradient_accumulation_steps"),
    ("logging_steps_negative", _trainer(logging_steps=-1), [], "trainer.logging_steps"),
    ("save_steps_zero", _trainer(save_steps=0), [], "trainer.save_steps"),
    ("model_config_not_json", _model_folder("{not json", weights=True), [], "config.json"),
    ("model_config_a_list", _model_folder("[1, 2]", weights=True), [], "config.json"),
    ("model_without_weights", _model_folder("{}", weights=False), [], "no weights"),
    ("peft_unknown_key", lambda r, tmp: r["model"].update(peft={"rr": 8}), [], "model.peft"),
    ("decision_class_not_one_token", _trainer(decision_classes=["hello world", "1"]), [],
     "trainer.decision_classes"),
    ("decision_classes_repeated", _trainer(decision_classes=["1", "1"]), [], "trainer.decision_classes"),
    ("output_dir_under_read_only", _trainer(output_dir="/proc/calibrl-test-run/out"), [], "output_dir"),
    ("hub_id_unreachable", _hub_unreachable, [], "model.name_or_path"),
    ("hub_id_offline", _hub_offline, [], "HF_HUB_OFFLINE"),
]


@pytest.mark.parametrize("case,edit,args,key", CASES, ids=[c[0] for c in CASES])
def test_bad_recipe_values_exit_2_naming_the_key(case, edit, args, key, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    recipe = _base(out)
    _PATCHES.clear()
    edit(recipe, tmp_path)
    for target, attribute, value in _PATCHES:
        monkeypatch.setattr(target, attribute, value)
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    import calibrl.trl.train as training

    def no_model(*a, **k):
        raise AssertionError("a model was built before the recipe was validated")

    monkeypatch.setattr(training, "_load_model", no_model)
    result = CliRunner().invoke(app, ["train", str(path), *args])
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text, text
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert f"{case}.yaml" in lines[0] and key in lines[0], text
    assert not out.exists(), "an output folder was left behind"  # (no_model above: refused before any model)


def test_valid_recipe_passes_validation(tmp_path):
    """The base recipe of the table is valid: every failure above is the edit's."""
    from calibrl.trl.recipes import parse_recipe
    from calibrl.trl.train import validate_recipe

    recipe = parse_recipe(_base(tmp_path / "run"), "base.yaml")
    args = validate_recipe(recipe)
    assert args.capo_tau == 0.6 and args.output_dir == str(tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_yaml_exponent_without_dot_is_a_float(tmp_path):
    """``1e-5`` (no dot) is a float, as in YAML 1.2 and Python, in recipes and in --set values."""
    from calibrl.cli.train import _parse_sets
    from calibrl.trl.recipes import load_recipe

    recipe = _base(tmp_path / "run")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe).replace("learning_rate: 0.0001", "learning_rate: 1e-5"))
    assert load_recipe(path).trainer["learning_rate"] == 1e-5
    assert _parse_sets(["learning_rate=3e-6", "temperature=1", "run_name='1e-5'"]) == {
        "learning_rate": 3e-6, "temperature": 1, "run_name": "1e-5"}


def test_config_ranges_name_the_field():
    from calibrl.trl import CalibratedGRPOConfig

    cases = {"capo_tau": 0.0, "capo_ref_high_quantile": 1.5, "decision_loss_coef": -1.0,
             "gcpo_measure": "euclid", "temperature": 0.0}
    for key, value in cases.items():
        with pytest.raises(ValueError, match=key):
            CalibratedGRPOConfig(output_dir="unused", use_cpu=True, report_to="none", **{key: value})


def test_config_prints_no_deprecation_warning_for_unset_fields():
    """TRL's default gradient_checkpointing=True is carried under transformers 5's name (activation_checkpointing),
    so building a config (and so every ``calibrl train`` error) prints nothing but its own line."""
    import warnings

    from calibrl.trl import CalibratedGRPOConfig

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = CalibratedGRPOConfig(output_dir="unused", use_cpu=True, report_to="none")
        off = CalibratedGRPOConfig(output_dir="unused", use_cpu=True, report_to="none", activation_checkpointing=False)
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True
    assert off.activation_checkpointing is False and off.gradient_checkpointing is False


def _one_error_line(result, name: str, key: str) -> str:
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text and (result.exception is None or isinstance(result.exception, SystemExit)), text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and name in lines[0] and key in lines[0], text
    return lines[0]


def test_duplicate_recipe_key_names_both_lines(tmp_path):
    """PyYAML alone keeps the last of two equal keys: the first value would look set and be ignored."""
    path = tmp_path / "dup.yaml"
    text = yaml.safe_dump(_base(tmp_path / "run"), sort_keys=False)
    path.write_text(text.replace("  learning_rate: 0.0001\n", "  learning_rate: 0.0001\n  learning_rate: 0.01\n"))
    first = text.splitlines().index("  learning_rate: 0.0001") + 1
    line = _one_error_line(CliRunner().invoke(app, ["train", str(path)]), f"dup.yaml:{first + 1}", "learning_rate")
    assert f"first given at line {first}" in line, line
    assert not (tmp_path / "run").exists()


def test_binary_recipe_file_is_refused(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    _one_error_line(CliRunner().invoke(app, ["train", str(path)]), "model.yaml", "not a YAML text file")


def test_bad_set_value_is_one_line():
    result = CliRunner().invoke(app, ["train", "tiny_cpu", "--set", "learning_rate=[1e-4"])
    _one_error_line(result, "--set learning_rate", "not a YAML value")


def test_estimator_registrations_drive_the_estimator_parameters():
    """estimator_params passes exactly the fields each registration declares (by parameter name) and the check
    refuses the others; the documented GRPO baseline of a CAPO recipe (--set advantage_estimator=grpo --set
    capo_mask=none) passes."""
    from calibrl.advantages import available_estimators
    from calibrl.trl import CalibratedGRPOConfig
    from calibrl.trl.config import estimator_fields_read, ignored_field_error

    for estimator in available_estimators():
        for mask in ("fixed", "quantile"):
            args = CalibratedGRPOConfig(output_dir="unused", use_cpu=True, report_to="none",
                                        advantage_estimator=estimator, capo_mask=mask)
            read = [f for f in estimator_fields_read(estimator, mask) if f != "cde_omega_schedule"]
            assert sorted(args.estimator_params().values(), key=repr) == sorted(
                (getattr(args, f) for f in read), key=repr), (estimator, mask)
    assert ignored_field_error({"capo_mask": "none", "capo_tau": 0.6}, estimator="capo", capo_mask="none") is None
    assert ignored_field_error({"capo_mask": "none"}, estimator="grpo", capo_mask="none") is None
    assert ignored_field_error({"capo_mask": "fixed"}, estimator="grpo", capo_mask="fixed").startswith("capo_mask")
    assert ignored_field_error({"learning_rate": 1.0}, estimator="grpo", capo_mask="none") is None
    assert ignored_field_error({"cde_omega_schedule": "linear"}, estimator="cde", capo_mask="none") is None
    assert "capo_ref_quantile_batches" in ignored_field_error(
        {"capo_ref_quantile_batches": 2}, estimator="capo", capo_mask="fixed")


def test_switching_the_estimator_by_set_keeps_the_recipe_fields(tmp_path):
    """A CAPO recipe's own fields stay valid when --set picks another estimator (its baseline run)."""
    from calibrl.trl.recipes import parse_recipe
    from calibrl.trl.train import validate_recipe

    recipe = parse_recipe(dict(_base(tmp_path / "run"), trainer={**_base(tmp_path / "run")["trainer"],
                                                                  "capo_mask": "quantile"}), "capo.yaml")
    args = validate_recipe(recipe, overrides={"advantage_estimator": "grpo", "capo_mask": "none"})
    assert args.advantage_estimator == "grpo" and args.estimator_params() == {}


def test_recipe_path_that_is_a_folder_is_named_as_a_folder(tmp_path):
    (tmp_path / "recipes").mkdir()
    line = _one_error_line(CliRunner().invoke(app, ["train", str(tmp_path / "recipes")]), "recipes", "is a folder")
    assert "no such" not in line, line


@pytest.mark.parametrize("edit,key", [(dict(per_device_train_batch_size=15), "per_device_train_batch_size 15"),
                                      (dict(steps_per_generation=3), "steps_per_generation 3")])
def test_fewer_prompts_than_a_generation_batch_is_refused_not_trained_for_0_steps(edit, key, tmp_path):
    """The fixture's 3 usable prompts cannot fill a generation batch of 5 or 6 distinct prompts: TRL's sampler would
    yield nothing and the run would "finish" after 0 steps; refused in one line, exit 2, no output folder."""
    out = tmp_path / "run"
    recipe = _base(out)
    recipe["trainer"].update(edit)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["train", str(path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "small.yaml: dataset: 3 prompts" in lines[0] and key in lines[0] and "0 steps" in lines[0], lines[0]
    assert not out.exists()


def test_generation_batch_check_matches_trls_sampler():
    """The refusal sits exactly where TRL's RepeatSampler starts yielding nothing: it drops an incomplete chunk of
    ``generation_batch_size / num_generations`` distinct prompts, so 4 prompts fill a batch of 12 / 3 and 3 do not."""
    from types import SimpleNamespace

    from trl.trainer.utils import RepeatSampler

    from calibrl.trl.recipes import RecipeError
    from calibrl.trl.train import _check_fills_a_generation_batch

    args = SimpleNamespace(generation_batch_size=12, num_generations=3, per_device_train_batch_size=6, world_size=2,
                           steps_per_generation=1)
    for n_prompts in (3, 4, 5, 9):
        data = list(range(n_prompts))
        drawn = list(RepeatSampler(data, mini_repeat_count=3, batch_size=4, seed=0))
        if drawn:
            _check_fills_a_generation_batch(data, args, "r.yaml")
        else:
            with pytest.raises(RecipeError, match=r"r.yaml: dataset: 3 prompts, fewer than the 4 .* 2 process"):
                _check_fills_a_generation_batch(data, args, "r.yaml")
        assert bool(drawn) == (n_prompts >= 4)
    _check_fills_a_generation_batch(iter(()), args, "r.yaml")  # a stream: its length is unknown, nothing refused


def test_a_gpu_recipe_on_a_machine_without_one_says_to_rehearse(monkeypatch):
    """bf16 on a machine with no GPU: one line naming the setting and the two ways on, not TRL's message."""
    import torch
    from typer.testing import CliRunner

    from calibrl.cli import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["train", "capo_qwen2.5-math-1.5b_deepscaler"])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "trainer.bf16: true needs a GPU" in line and "calibrl train capo_qwen2.5-math-1.5b_deepscaler --rehearse" \
        in line and "--set bf16=false" in line, line
