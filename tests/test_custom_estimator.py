"""docs/custom-estimator.md's example, as written on the page: its math, `calibrl train` with a recipe naming it as a
plugin, and the one-line errors of its parameters; docs/advantages.md's table equal to the registrations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from calibrl.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "custom-estimator.md"


def page_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)


@pytest.fixture
def plugin_folder(tmp_path, monkeypatch):
    """The page's plugin file and recipe written to ``tmp_path`` (on sys.path, the working directory)."""
    (tmp_path / "my_estimators.py").write_text(page_blocks("python")[0])
    (tmp_path / "recipe.yaml").write_text(page_blocks("yaml")[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_example_is_short_and_declares_what_it_reads(plugin_folder):
    from calibrl.advantages import estimator_spec

    code = page_blocks("python")[0].strip().splitlines()
    recipe = page_blocks("yaml")[0].strip().splitlines()
    assert len(code) + len(recipe) <= 45
    import my_estimators  # noqa: F401

    spec = estimator_spec("overconfidence_grpo")
    assert spec.inputs == {"logprob_mean"} and spec.ranks_by == "correctness" and spec.noise_mask == "no"
    assert list(spec.params) == ["beta"] and spec.params["beta"].annotation is float
    assert spec.params["beta"].default == 0.5


def test_the_example_gives_the_advantages_worked_out_by_hand(plugin_folder):
    import my_estimators  # noqa: F401

    from calibrl import RolloutBatch, compute_advantages

    # one group: right, wrong and confident (-0.2), wrong at the group's mean confidence (-0.6)
    batch = RolloutBatch(rewards=torch.tensor([1.0, 0.0, 0.0]), group_ids=torch.tensor([7, 7, 7]),
                         logprob_mean=torch.tensor([-1.0, -0.2, -0.6]))
    adv, info = compute_advantages(batch, "overconfidence_grpo", beta=0.5, return_info=True)
    std = (1 / 3) ** 0.5  # Bessel std of (1, 0, 0)
    grpo = torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (std + 1e-4)
    # penalty = 0.5 * 1[wrong] * (c - mean c): mean c = -0.6, so only the confident wrong answer loses 0.2
    torch.testing.assert_close(adv, grpo - torch.tensor([0.0, 0.2, 0.0]))
    assert info["penalty_abs_mean"] == pytest.approx(0.2 / 3)
    # beta = 0 is GRPO; a second group does not mix with the first
    torch.testing.assert_close(compute_advantages(batch, "overconfidence_grpo", beta=0.0), grpo)
    two = RolloutBatch(rewards=torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0]), group_ids=torch.tensor([7, 7, 7, 2, 2]),
                       logprob_mean=torch.tensor([-1.0, -0.2, -0.6, -3.0, -0.1]))
    torch.testing.assert_close(compute_advantages(two, "overconfidence_grpo", beta=0.5)[:3], adv)


@pytest.mark.parametrize("params, message", [
    ("{betta: 0.5}", "trainer.advantage_params.betta: not a parameter of estimator 'overconfidence_grpo' "
                     "(did you mean 'beta'?); its parameters: beta"),
    ("{beta: fast}", "trainer.advantage_params.beta: expected float, got 'fast' (str)"),
])
def test_a_bad_advantage_parameter_is_one_line_exit_2(plugin_folder, params, message):
    recipe = plugin_folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("{beta: 0.5}", params))
    result = CliRunner().invoke(app, ["train", str(recipe)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {recipe}: {message}"]


def test_a_missing_plugin_is_one_line_exit_2(plugin_folder):
    recipe = plugin_folder / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("[my_estimators]", "[my_estimator]"))
    result = CliRunner().invoke(app, ["train", str(recipe)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {recipe}: plugins: no module named 'my_estimator' (is its folder on PYTHONPATH?)"]


def test_a_bad_override_of_advantage_params_is_one_line_exit_2(plugin_folder):
    result = CliRunner().invoke(app, ["train", "recipe.yaml", "--set", "advantage_params={beta: [1]}"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: recipe.yaml: overrides.advantage_params.beta: expected float, got [1] (list)"]


@pytest.mark.slow
def test_calibrl_train_trains_with_the_plugin_estimator(plugin_folder):
    """The page's recipe through ``calibrl train``: two steps with the user's estimator, its diagnostics logged."""
    result = CliRunner().invoke(app, ["train", "recipe.yaml", "--max-steps", "2"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in
             (plugin_folder / "runs" / "overconfidence_grpo" / "log_history.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert "calibration/estimator/penalty_abs_mean" in line, sorted(line)


def test_the_advantages_page_table_equals_the_registrations():
    from calibrl.advantages import estimators_table

    text = (ROOT / "docs" / "advantages.md").read_text()
    start = "<!-- estimators table: generated by calibrl.advantages.estimators_table() -->\n"
    table = text[text.index(start) + len(start):text.index("\n<!-- end of the estimators table -->")]
    assert table == estimators_table()
