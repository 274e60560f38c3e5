"""The command line itself: help and argument errors come without importing torch, read well at 80 columns, and
every option says what it does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from calibrl.cli import app

HEAVY_MODULES = ("torch", "transformers", "trl", "datasets")
FIXTURES = Path(__file__).parent / "fixtures"


def _modules_loaded_after(code: str) -> dict:
    """Runs ``code`` in a fresh interpreter; returns which of HEAVY_MODULES it loaded."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY_MODULES!r}}}))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_no_torch():
    assert _modules_loaded_after("import calibrl.cli") == dict.fromkeys(HEAVY_MODULES, False)


def test_help_and_argument_errors_load_no_torch():
    for argv in (["--help"], ["train", "--help"], ["eval", "--help"], ["generate", "--help"], ["demo", "--help"],
                 ["demo", "--seeds", "0"], ["generate", "--n", "many"]):
        code = ("from calibrl.cli import app\n"
                f"try:\n    app({argv!r}, standalone_mode=False)\nexcept Exception:\n    pass")
        assert _modules_loaded_after(code) == dict.fromkeys(HEAVY_MODULES, False), argv


def test_the_package_api_still_loads_on_first_use():
    import calibrl

    assert callable(calibrl.compute_advantages) and calibrl.RolloutBatch.__name__ == "RolloutBatch"
    assert {"compute_advantages", "register_estimator", "RolloutBatch"} <= set(dir(calibrl))
    try:
        calibrl.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown attribute must raise AttributeError")


def test_help_fits_80_columns_and_shows_no_type_for_flags():
    runner = CliRunner()
    for argv in (["--help"], ["train", "--help"], ["eval", "--help"], ["generate", "--help"], ["demo", "--help"]):
        result = runner.invoke(app, argv, env={"COLUMNS": "80"}, terminal_width=80)
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
        assert "<bool>" not in result.output, argv
        assert "..." not in "".join(line for line in lines if "default" in line), argv  # no cut default
    eval_help = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "80"}, terminal_width=80).output
    assert "majority,weighted,pc,rpc,best_of_n" in "".join(eval_help.split())


def test_every_option_has_help():
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        for param in command.params:
            assert getattr(param, "help", None), f"calibrl {name} {param.opts[0]} has no help"


def test_demo_checks_its_methods_before_printing_or_writing(tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--out", str(out), "--methods", "decision/sft,nope/grpo"])
    assert result.exit_code == 2
    assert "nope/grpo" in result.output and "decision/sft," not in result.output.split("nope/grpo")[0]
    assert "calibrl demo:" not in result.output
    assert not out.exists()


def test_train_list_and_recipe_errors_load_no_torch():
    """``calibrl train --list``, a missing recipe and a mistyped ``--set`` value answer without TRL or torch."""
    for argv in (["train", "--list"], ["train", "no_such_recipe"], ["train", "tiny_cpu", "--set", "learning_rate=abc"],
                 ["train", "tiny_cpu", "--set", "no_such_field=1"]):
        code = ("from calibrl.cli import app\n"
                f"try:\n    app({argv!r}, standalone_mode=False)\nexcept BaseException:\n    pass")
        assert _modules_loaded_after(code) == dict.fromkeys(HEAVY_MODULES, False), argv


def test_train_list_shows_each_recipes_first_sentence_whole():
    from calibrl.trl.recipes import shipped_recipes

    result = CliRunner().invoke(app, ["train", "--list"])
    assert result.exit_code == 0
    listed = " ".join(result.output.split())
    assert set(shipped_recipes()) <= set(result.output.split())
    # the GRPO twin's first sentence runs over two comment lines and ends at "advantage's."
    assert ("GRPO baseline twin of capo_qwen2.5-math-1.5b_deepscaler.yaml: identical except the advantage "
            "(group-normalised reward, no confidence term, no mask), so any calibration difference is the "
            "advantage's.") in listed
    assert "calibrl train grpo" not in listed  # the usage lines after the first paragraph are not shown


def test_bad_set_value_is_one_line_exit_2():
    result = CliRunner().invoke(app, ["train", "tiny_cpu", "--set", "learning_rate=abc"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {__import__('calibrl.trl.recipes', fromlist=['x']).resolve_recipe_path('tiny_cpu')}: "
        "overrides.learning_rate: expected float, got 'abc' (str)"]


# transformers' own tqdm bars ("Loading weights: 100%|...| 29/29 [00:00<00:00, 27407.57it/s]", "Writing model
# shards"): the commands draw their own progress, and these cut through it
TRANSFORMERS_BAR = re.compile(r"Loading weights|Writing model shards|it/s\]")


def _train_args(model: str, tmp_path) -> list[str]:
    """A one-step recipe on the model folder that saves a checkpoint (where "Writing model shards" appeared)."""
    recipe = {
        "model": {"name_or_path": model},
        "dataset": {"name": "deepscaler", "path": str(FIXTURES / "deepscaler.jsonl"), "template": "none"},
        "rewards": ["math"],
        "trainer": {"output_dir": str(tmp_path / "run"), "advantage_estimator": "grpo", "learning_rate": 1e-4,
                    "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 4,
                    "max_steps": 1, "save_strategy": "steps", "save_steps": 1, "use_cpu": True,
                    "report_to": "none"},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return ["train", str(tmp_path / "recipe.yaml")]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "demo", "generate"])
def test_no_transformers_progress_bar_among_a_commands_own_output(command, tiny_chat_model, tmp_path):
    """Each command that draws its own progress loads the model from a folder and saves without one of
    transformers' bars in its output."""
    args = {
        "train": _train_args(tiny_chat_model, tmp_path),
        "demo": ["demo", "--model", tiny_chat_model, "--quick", "--steps", "1", "--out", str(tmp_path / "demo")],
        "generate": ["generate", "-m", tiny_chat_model, "-d", "arithmetic", "--limit", "1", "--n", "1",
                     "--max-new-tokens", "4", "--out", str(tmp_path / "s.jsonl")],
    }[command]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert not TRANSFORMERS_BAR.search(result.stderr), result.stderr


def test_every_choice_of_calibrl_eval_is_its_registrys():
    """The option Enums of ``calibrl eval`` hold exactly what the registries they name declare. They are spelled out
    in calibrl.cli.eval because building them from the registries would import numpy and scipy on every
    ``calibrl --help`` (bench/cli_startup.py); this test is what keeps them one list."""
    from calibrl.cli import eval as cli_eval
    from calibrl.evaluation.readers import FORMATS, GRADERS
    from calibrl.evaluation.samples import CONFIDENCE_KINDS
    from calibrl.metrics.abstention import ABSTENTION_METHODS
    from calibrl.posthoc import available_posthoc

    def values(enum):
        return sorted(e.value for e in enum)

    assert values(cli_eval.Posthoc) == sorted(available_posthoc())
    assert values(cli_eval.Grader) == sorted(GRADERS)
    assert values(cli_eval.SampleFormat) == sorted(FORMATS)
    assert values(cli_eval.AbstainMethod) == sorted(ABSTENTION_METHODS)
    assert values(cli_eval.Confidence) == sorted(CONFIDENCE_KINDS)
