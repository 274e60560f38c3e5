"""``calibrl train`` checks the whole recipe before it builds a model: every bad value is one line naming the file
and the key, exit status 2, no traceback, and no output folder left behind."""

from __future__ import annotations

import json
import time
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
]


@pytest.mark.parametrize("case,edit,args,key", CASES, ids=[c[0] for c in CASES])
def test_bad_recipe_values_exit_2_naming_the_key(case, edit, args, key, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    recipe = _base(out)
    edit(recipe, tmp_path)
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    import calibrl.trl.train as training

    def no_model(*a, **k):
        raise AssertionError("a model was built before the recipe was validated")

    monkeypatch.setattr(training, "_load_model", no_model)
    start = time.perf_counter()
    result = CliRunner().invoke(app, ["train", str(path), *args])
    elapsed = time.perf_counter() - start
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text, text
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert f"{case}.yaml" in lines[0] and key in lines[0], text
    assert not out.exists(), "an output folder was left behind"
    assert elapsed < 20, elapsed


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
