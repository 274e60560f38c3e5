"""docs/custom-metric.md's example, as written on the page: its value by hand, ``calibrl eval --plugins`` writing it
into metrics.json and the report's tables, the callback and the telemetry logging it in its declared direction,
and the one-line errors of a bad plugin or a bad metric."""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from calibrl.cli import app
from calibrl.metrics import registry

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "custom-metric.md"
NAME = "confident_error_rate"


def page_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The page's plugin file in ``tmp_path`` (on sys.path, the working directory); the metric is forgotten after."""
    (tmp_path / "my_metrics.py").write_text(page_blocks("python")[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    registry.METRICS.pop(NAME, None)
    sys.modules.pop("my_metrics", None)


def _rows(tmp_path: Path) -> Path:
    """12 samples of 3 prompts: confidences 0.95 (3 right, 2 wrong), 0.9 (1 right, 1 wrong) and lower ones."""
    conf = [0.95, 0.95, 0.95, 0.95, 0.95, 0.9, 0.9, 0.5, 0.4, 0.3, 0.2, 0.6]
    right = [1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"prompt_id": f"p{i % 3}", "correct": bool(r), "decision_prob": c}) + "\n"
                            for i, (c, r) in enumerate(zip(conf, right))))
    return path


def test_the_example_is_short_and_worked_out_by_hand(plugin):
    code = page_blocks("python")[0].strip().splitlines()
    assert len(code) <= 20
    import my_metrics  # noqa: F401

    declared = registry.metric(NAME)
    assert declared.higher is False and declared.needs == {"confidence", "correct"}
    # confidence >= 0.9: 7 samples, 3 of them wrong
    conf = np.array([0.95, 0.95, 0.95, 0.95, 0.95, 0.9, 0.9, 0.5])
    right = np.array([1, 1, 1, 0, 0, 1, 0, 0], dtype=bool)
    assert declared.compute({"confidence": conf, "correct": right}) == pytest.approx(3 / 7)
    assert np.isnan(declared.compute({"confidence": np.array([0.2]), "correct": np.array([True])}))
    assert not registry.higher_is_better(f"eval_calibration/{NAME}")


def test_calibrl_eval_writes_the_plugin_metric_everywhere_it_applies(plugin):
    samples = _rows(plugin)
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(samples), "--out", "report", "--plugins", "my_metrics",
                                      "--bootstrap", "0", "--methods", ""])
    assert result.exit_code == 0, result.output
    payload = json.loads((plugin / "report" / "metrics.json").read_text())
    assert payload["settings"]["plugins"] == ["my_metrics"]
    overall = payload["results"]["overall"]["samples"]
    assert overall[NAME] == pytest.approx(3 / 7)
    assert overall["confidence_sources"]["decision_prob"][NAME] == pytest.approx(3 / 7)
    report = (plugin / "report" / "report.md").read_text()
    assert "| wrong among confidence >= 0.9 | 0.4286 |" in report
    header = next(line for line in report.splitlines() if line.startswith("| confidence source"))
    assert "wrong at >= 0.9" in header


def test_a_plugin_given_as_a_file_path_works_and_a_missing_one_is_one_line(plugin):
    samples = _rows(plugin)
    ok = CliRunner().invoke(app, ["eval", "--no-figures", str(samples), "--out", "by_path", "--plugins", "my_metrics.py",
                                  "--bootstrap", "0", "--methods", ""])
    assert ok.exit_code == 0, ok.output
    assert NAME in json.loads((plugin / "by_path" / "metrics.json").read_text())["results"]["overall"]["samples"]
    missing = CliRunner().invoke(app, ["eval", "--no-figures", str(samples), "--out", "nothing", "--plugins", "not_a_module"])
    assert missing.exit_code == 2
    assert "--plugins: no module named 'not_a_module'" in missing.output
    assert not (plugin / "nothing").exists()


def test_the_callback_and_the_telemetry_log_it_in_its_direction(plugin):
    import torch

    from calibrl.batch import RolloutBatch
    from calibrl.trl.calibration_config import CalibrationEvalConfig
    from calibrl.trl.callbacks import calibration_record, check_best_metric_settings, pareto_best
    from calibrl.trl.telemetry import calibration_metrics

    rows = [{"prompt_id": f"p{i % 2}", "correct": r, "logprob_mean": float(np.log(c))}
            for i, (c, r) in enumerate([(0.95, True), (0.95, False), (0.92, False), (0.5, True)])]
    with pytest.raises(ValueError, match="calibration metric"):
        CalibrationEvalConfig(metric=NAME)
    import my_metrics  # noqa: F401

    assert calibration_record(rows)[NAME] == pytest.approx(2 / 3)
    CalibrationEvalConfig(metric=NAME)  # now watchable
    batch = RolloutBatch(rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]), group_ids=torch.tensor([0, 0, 1, 1]),
                         logprob_mean=torch.log(torch.tensor([0.95, 0.95, 0.92, 0.5])))
    assert calibration_metrics(batch)[NAME] == pytest.approx(2 / 3)
    # lower is better: the Pareto rule keeps the record with the lowest value at equal accuracy
    records = [{"step": 1, "accuracy": 0.5, NAME: 0.4}, {"step": 2, "accuracy": 0.5, NAME: 0.1}]
    assert pareto_best(records, metric=NAME, rule="calibration")["step"] == 2

    class Args:
        metric_for_best_model = f"eval_calibration/{NAME}"
        eval_strategy = "no"
        greater_is_better = True

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_best_metric_settings(Args(), every=1)
    assert any("lower is better" in str(w.message) for w in caught)


def test_a_bad_metric_says_whose_it_is():
    @registry.register_metric("returns_text", higher=True, needs={"correct"})
    def returns_text(correct):
        return "high"

    @registry.register_metric("raises", higher=True, needs={"correct"})
    def raises(correct):
        raise ZeroDivisionError("no samples")

    try:
        with pytest.raises(registry.MetricError, match=r"'returns_text' .*returned str 'high'"):
            registry.metric("returns_text").compute({"correct": np.array([True])})
        with pytest.raises(registry.MetricError, match=r"'raises' \(.*test_custom_metric.py:\d+\) failed: "
                                                       r"ZeroDivisionError: no samples"):
            registry.metric("raises").compute({"correct": np.array([True])})
        with pytest.raises(registry.MetricError, match="unknown input"):
            registry.register_metric("typo", lambda corect: 0.0, higher=True, needs={"corect"})
        with pytest.raises(registry.MetricError, match="takes no such argument"):
            registry.register_metric("mismatch", lambda other: 0.0, higher=True, needs={"correct"})
        with pytest.raises(ValueError, match="already registered"):
            registry.register_metric("auroc", lambda correct: 0.0, higher=True, needs={"correct"})
    finally:
        for name in ("returns_text", "raises"):
            registry.METRICS.pop(name, None)
