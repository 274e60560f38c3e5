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
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(_write(tmp_path / "s.jsonl", ROWS)), "--out", str(out),
                                      "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    m = next(iter(json.loads((out / "metrics.json").read_text())["results"]["overall"].values()))
    assert (m["n_abstained"], m["answer_rate"], m["hallucination_rate"]) == (3, 0.5, pytest.approx(1 / 6))
    report = (out / "report.md").read_text()
    assert "It answers 50% of the time (3 of 6 samples say they do not know); of its answers, 67% are right" in report
    assert "| answer rate (not \"I don't know\") | 0.5000 |" in report
    plain_out = tmp_path / "plain"
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(_write(tmp_path / "p.jsonl", [ROWS[0], ROWS[2], ROWS[3]])),
                                      "--out", str(plain_out), "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    assert "answer rate" not in (plain_out / "report.md").read_text()  # no rows of dashes for other inputs


# items with no right answer: p0's two samples (one declines), p1's two (both decline); p2 answerable, one declines
UNANSWERABLE_ROWS = [
    {"prompt_id": "p0", "correct": True, "logprob_mean": -0.1, "completion": "I don't know", "answerable": False},
    {"prompt_id": "p0", "correct": False, "logprob_mean": -0.2, "completion": "42", "answerable": False},
    {"prompt_id": "p1", "correct": True, "logprob_mean": -0.3, "completion": r"\boxed{IDK}", "answerable": False},
    {"prompt_id": "p1", "correct": True, "logprob_mean": -0.4, "completion": "I do not know.", "answerable": False},
    {"prompt_id": "p2", "correct": True, "logprob_mean": -0.5, "completion": "7", "answerable": True},
    {"prompt_id": "p2", "correct": False, "logprob_mean": -0.6, "completion": "I don't know", "answerable": True},
    {"prompt_id": "p2", "correct": False, "logprob_mean": -0.7, "completion": "8"},  # answerable by default
]


def test_declining_by_kind_of_item_by_hand(tmp_path):
    samples = load_samples(_write(tmp_path / "u.jsonl", UNANSWERABLE_ROWS))
    assert samples.answerable.tolist() == [False, False, False, False, True, True, True]
    assert samples.abstained.tolist() == [True, False, True, True, False, True, False]
    found = compute_metrics("eval", MetricInputs({"correct": samples.correct, "abstained": samples.abstained,
                                                  "answerable": samples.answerable}),
                            where=lambda m: m.name.startswith("declined"))
    assert found == {"declined_unanswerable": 3 / 4, "declined_answerable": 1 / 3}
    # an abstention is never right, whatever the row says: answered 3 (42, 7, 8), right 1 (7), wrong 2
    figures = stated_abstention(samples.correct, samples.abstained)
    assert (figures.answered, figures.right, figures.wrong) == (3, 1, 2)
    # no unanswerable item: no such figures, and nothing declined is still no abstention figure
    plain = load_samples(_write(tmp_path / "p.jsonl", [UNANSWERABLE_ROWS[4], UNANSWERABLE_ROWS[6]]))
    assert plain.answerable is None and plain.abstained is None
    # with unanswerable items, declining none of them is a figure (0), so the abstentions are kept
    none_declined = load_samples(_write(tmp_path / "n.jsonl", [UNANSWERABLE_ROWS[1], UNANSWERABLE_ROWS[4]]))
    assert none_declined.abstained.tolist() == [False, False]
    with pytest.raises(SamplesError, match=r"bad\.jsonl:2: field 'answerable': expected a bool"):
        load_samples(_write(tmp_path / "bad.jsonl", [ROWS[0], {**ROWS[2], "answerable": "no"}]))


def test_eval_says_how_often_the_unanswerable_are_declined(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(_write(tmp_path / "u.jsonl", UNANSWERABLE_ROWS)), "--out",
                                      str(out), "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    m = next(iter(json.loads((out / "metrics.json").read_text())["results"]["overall"].values()))
    assert (m["n_unanswerable"], m["declined_unanswerable"], m["declined_answerable"]) == (4, 0.75, pytest.approx(1 / 3))
    report = (out / "report.md").read_text()
    assert "Of the 4 samples of items with no right answer it declines 75%, and 33% of the others'." in report
    assert "| declines unanswerable items | 0.7500 |" in report
