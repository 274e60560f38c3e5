"""The model's own "I don't know" in calibrl eval: the figures by hand, the comparison with a confidence threshold
that answers as often, reading the field or the completion's final answer, and the report's words."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from calibrl.cli import app
from calibrl.evaluation.samples import SamplesError, load_samples
from calibrl.metrics.registry import MetricInputs, compute_metrics
from calibrl.metrics.stated_abstention import stated_abstention, versus_threshold


def test_figures_by_hand():
    correct = [True, False, False, True, False, True]
    abstained = [False, False, True, False, True, True]  # the last one also marked correct: it counts as abstained
    got = stated_abstention(correct, abstained)
    # answered: 0, 1, 3 -> right 0 and 3, wrong 1
    assert (got.n, got.answered, got.right, got.wrong) == (6, 3, 2, 1)
    assert got.answer_rate == 0.5 and got.accuracy_answered == pytest.approx(2 / 3)
    assert got.hallucination_rate == pytest.approx(1 / 6) and got.accuracy_hallucination_ratio == 2.0
    none = stated_abstention([False, False], [True, True])
    assert none.answer_rate == 0.0 and np.isnan(none.accuracy_answered) and none.hallucination_rate == 0.0
    found = compute_metrics("eval", MetricInputs({"correct": np.array(correct), "abstained": np.array(abstained),
                                                  "prompt_index": np.array([0, 0, 0, 1, 1, 1])}))
    assert found["answer_rate"] == 0.5 and found["hallucination_rate"] == pytest.approx(1 / 6)
    assert "answer_rate" not in compute_metrics("eval", MetricInputs({"correct": np.array(correct),
                                                                      "prompt_index": np.zeros(6, dtype=int)}))


def test_versus_threshold_by_hand():
    correct = np.array([True, False, False, True, False, False])
    abstained = np.array([False, True, False, False, False, True])
    score = np.array([0.9, 0.1, 0.8, 0.7, 0.6, 0.2])
    got = versus_threshold(score, correct, abstained)
    assert got["answered"] == 4
    # the model answers 0, 2, 3, 4: right 0 and 3; the threshold answers the 4 most confident: 0, 2, 3, 4 as well
    assert got["model"] == got["threshold"] == {"accuracy_answered": 0.5, "hallucination_rate": pytest.approx(2 / 6)}
    assert got["declined_by_both"] == 2
    score[1] = 0.95  # now the threshold answers the abstained sample 1 (no answer: not right) and drops 4
    got = versus_threshold(score, correct, abstained)
    assert got["threshold"]["accuracy_answered"] == 0.5 and got["declined_by_both"] == 1


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"prompt_id": "p1", "correct": True, "logprob_mean": -0.1, "completion": "so \\boxed{4}"},
    {"prompt_id": "p1", "correct": False, "logprob_mean": -0.9, "completion": "I think... \\boxed{IDK}"},
    {"prompt_id": "p1", "correct": False, "logprob_mean": -0.5, "completion": "\\boxed{5}"},
    {"prompt_id": "p2", "correct": True, "logprob_mean": -0.2, "completion": "Answer: 7"},
    {"prompt_id": "p2", "correct": False, "logprob_mean": -0.3, "completion": "Answer: I don't know."},
    {"prompt_id": "p2", "correct": False, "logprob_mean": -0.4, "abstained": True},
]


def test_abstentions_are_read_from_the_field_or_the_final_answer(tmp_path):
    samples = load_samples(_write(tmp_path / "s.jsonl", ROWS))
    assert samples.abstained.tolist() == [False, True, False, False, True, True]
    plain = load_samples(_write(tmp_path / "plain.jsonl", [ROWS[0], ROWS[2], ROWS[3]]))
    assert plain.abstained is None  # nobody abstains and no row says: no abstention figures
    with pytest.raises(SamplesError, match=r"bad\.jsonl:2: field 'abstained': expected a bool"):
        load_samples(_write(tmp_path / "bad.jsonl", [ROWS[0], {**ROWS[2], "abstained": "yes"}]))


def test_eval_reports_the_abstentions_in_words_and_rows(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["eval", str(_write(tmp_path / "s.jsonl", ROWS)), "--out", str(out),
                                      "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    m = next(iter(json.loads((out / "metrics.json").read_text())["results"]["overall"].values()))
    assert (m["n_abstained"], m["answer_rate"], m["hallucination_rate"]) == (3, 0.5, pytest.approx(1 / 6))
    report = (out / "report.md").read_text()
    assert "It answers 50% of the time (3 of 6 samples say they do not know); of its answers, 67% are right" in report
    assert "| answer rate (not \"I don't know\") | 0.5000 |" in report
    plain_out = tmp_path / "plain"
    result = CliRunner().invoke(app, ["eval", str(_write(tmp_path / "p.jsonl", [ROWS[0], ROWS[2], ROWS[3]])),
                                      "--out", str(plain_out), "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    assert "answer rate" not in (plain_out / "report.md").read_text()  # no rows of dashes for other inputs
