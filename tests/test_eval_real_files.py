"""``calibrl eval`` on files as real runs write them: failed rows, repeated samples, folders of several steps.

The small files are built here in each tool's format, as tests/fixtures/formats holds them (see test_formats.py).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from test_formats import _lines, _write_lines

from calibrl.cli import app
from calibrl.evaluation.samples import SamplesError, load_samples

F = Path(__file__).parent / "fixtures" / "formats"


def _load(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_samples(path, **kwargs)


def _calibrl_rows() -> list[dict]:
    """Two prompts, three samples each, as ``calibrl generate`` writes them."""
    return [{"prompt_id": f"p{p}", "sample_index": i, "completion": f"p{p} try {i} \\boxed{{{i}}}",
             "answer": str(i), "correct": i == p, "logprob_mean": -0.1 * (i + 1)}
            for p in range(2) for i in range(3)]


# ------------------------------------------------------------------------------------ 5. repeated samples


def test_a_file_concatenated_twice_is_read_once_with_a_count(tmp_path):
    rows = _calibrl_rows()
    once = _load(_write_lines(tmp_path / "once.jsonl", rows))
    twice = _load(_write_lines(tmp_path / "twice.jsonl", rows + rows))
    assert len(twice) == len(once) == 6
    assert twice.correct.tolist() == once.correct.tolist()
    np.testing.assert_array_equal(twice.logprob_mean, once.logprob_mean)
    assert twice.skipped == {"repeated sample": 6}
    assert any("6 repeated rows dropped" in n for n in twice.notes)
    # the texts are read back from the file's first copies
    assert twice.completions.tolist() == [r["completion"] for r in rows]


def test_a_repeated_sample_with_another_completion_is_refused_at_its_line(tmp_path):
    rows = _calibrl_rows()
    other = dict(rows[4], completion="something else")
    with pytest.raises(SamplesError, match=r"^d\.jsonl:7: field 'sample_index': prompt_id 'p1' sample_index 1 "
                                           r"repeats d\.jsonl:5 with a different completion"):
        load_samples(_write_lines(tmp_path / "d.jsonl", rows + [other]))


@pytest.mark.parametrize("change, said", [
    ({"correct": False, "logprob_mean": -2.0}, r"a different correct \(True, then False\) and logprob_mean "
                                                r"\(-0\.1, then -2\.0\)"),
    ({"answer": "1"}, r"a different answer \('0', then '1'\)"),
    ({"logprob_mean": -0.7}, r"a different logprob_mean \(-0\.1, then -0\.7\)"),
])
def test_a_repeated_sample_with_the_same_completion_but_other_scores_is_refused(tmp_path, change, said):
    rows = _calibrl_rows()  # rows[0]: p0 sample 0, correct True, answer '0', logprob_mean -0.1
    conflicting = dict(rows[0], **change)  # the same completion
    # line 7, an identical copy of line 1, is dropped; line 8 contradicts it
    with pytest.raises(SamplesError, match=r"^c\.jsonl:8: field 'sample_index': prompt_id 'p0' sample_index 0 "
                                           r"repeats c\.jsonl:1 with " + said):
        load_samples(_write_lines(tmp_path / "c.jsonl", rows + [rows[0], conflicting]))


def test_a_row_without_benchmark_among_named_ones_is_refused_at_its_line(tmp_path):
    rows = [dict(r, benchmark="b") for r in _calibrl_rows()]
    for missing in (dict(rows[3], benchmark=None), {k: v for k, v in rows[3].items() if k != "benchmark"}):
        mixed = rows[:3] + [missing] + rows[4:]
        with pytest.raises(SamplesError, match=r"^m\.jsonl:4: field 'benchmark': missing, while other rows name "
                                               r"one \(m\.jsonl:1: 'b'\)"):
            load_samples(_write_lines(tmp_path / "m.jsonl", mixed))
    # no row naming one is one scope, as before
    plain = [{k: v for k, v in r.items() if k != "benchmark"} for r in rows]
    assert load_samples(_write_lines(tmp_path / "p.jsonl", plain)).benchmarks is None


def test_a_fifo_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "s.jsonl"
    os.mkfifo(fifo)  # opening it would wait for a writer
    with pytest.raises(SamplesError, match=r"s\.jsonl: not a regular file \(a FIFO\)"):
        load_samples(fifo)


def test_rows_without_completion_are_compared_whole(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "completion"} for r in _calibrl_rows()]
    assert len(_load(_write_lines(tmp_path / "a.jsonl", rows + rows[:2]))) == 6
    flipped = dict(rows[0], correct=not rows[0]["correct"])
    with pytest.raises(SamplesError, match=r"^b\.jsonl:7: field 'sample_index': prompt_id 'p0' sample_index 0 "
                                           r"repeats b\.jsonl:1"):
        load_samples(_write_lines(tmp_path / "b.jsonl", rows + [flipped]))


def test_cli_drops_repeated_batch_lines(tmp_path):
    rows = _lines(F / "openai_batch_output.jsonl")
    path = _write_lines(tmp_path / "b.jsonl", rows + rows[:1])
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(path), "--out", str(tmp_path / "out"), "--bootstrap", "0",
                                      "--methods", ""])
    assert result.exit_code == 0, result.output
    inputs = json.loads((tmp_path / "out" / "metrics.json").read_text())["inputs"][0]
    assert inputs["rows"] == 3 and inputs["skipped"] == {"repeated sample": 2}


# ------------------------------------------------------------------------------------------ 2. failed rows


def test_trl_null_reward_rows_are_left_out_and_counted(tmp_path):
    import pandas as pd

    table = {"step": [1, 1, 1], "prompt": ["p", "p", "p"], "completion": ["\\boxed{1}", "x", "\\boxed{2}"],
             "correctness": [1.0, float("nan"), 0.0], "advantage": [0.0, 0.0, 0.0]}
    pd.DataFrame(table).to_parquet(tmp_path / "completions_00001.parquet")
    s = _load(tmp_path, strict=False)
    assert s.correct.tolist() == [True, False]
    assert s.skipped == {"null reward 'correctness'": 1}
    assert any("1 failed rows left out (1 null reward 'correctness')" in n for n in s.notes)
    assert s.completions.tolist() == ["\\boxed{1}", "\\boxed{2}"]
    with pytest.raises(SamplesError, match=r"completions_00001\.parquet:2: field 'correctness': missing"):
        load_samples(tmp_path, strict=True)


def _batch_with_failures() -> list[dict]:
    rows = _lines(F / "openai_batch_output.jsonl")
    failed = {"id": "batch_req_3", "custom_id": "q-003", "response": None,
              "error": {"code": "server_error", "message": "The server had an error"}, "gold": "1"}
    status = json.loads(json.dumps(rows[1]))
    status.update(custom_id="q-004", response={"status_code": 500, "request_id": "r", "body": {"error": {}}})
    empty = json.loads(json.dumps(rows[1]))
    empty["custom_id"] = "q-005"
    empty["response"]["body"]["choices"] = []
    return rows + [failed, status, empty]


def test_openai_batch_failed_requests_are_left_out_and_counted(tmp_path):
    path = _write_lines(tmp_path / "b.jsonl", _batch_with_failures())
    s = _load(path, strict=False)
    assert s.prompt_ids.tolist() == ["q-001", "q-001", "q-002"] and s.correct.tolist() == [True, False, True]
    assert s.skipped == {"failed request": 2, "response without choices": 1}
    with pytest.raises(SamplesError, match=r"^b\.jsonl:3: field 'error': the request failed"):
        load_samples(path, strict=True)


def test_chat_choice_without_text_is_left_out_but_a_malformed_one_is_refused(tmp_path):
    rows = _lines(F / "openai_chat.jsonl")
    rows[0]["choices"][1]["message"]["content"] = None  # e.g. finish_reason content_filter
    rows[0]["choices"][1]["finish_reason"] = "content_filter"
    s = _load(_write_lines(tmp_path / "c.jsonl", rows), strict=False)
    assert s.prompt_ids.tolist() == ["add", "mc1"] and s.skipped == {"empty choice": 1}
    rows[0]["choices"][1]["message"]["content"] = 7  # malformed, not failed
    with pytest.raises(SamplesError, match=r"^c\.jsonl:1: field 'choices\[1\]\.message\.content': expected a str"):
        load_samples(_write_lines(tmp_path / "c.jsonl", rows), strict=False)


def test_a_file_whose_every_row_failed_says_so_with_the_first_error(tmp_path):
    failed = [row for row in _batch_with_failures() if row["custom_id"] in ("q-003", "q-004")]
    with pytest.raises(SamplesError, match=r"^f\.jsonl: every row failed \(2 failed request\), so nothing is "
                                           r"left to score; the first: f\.jsonl:1: field 'error': the request failed"):
        load_samples(_write_lines(tmp_path / "f.jsonl", failed), strict=False)


def test_cli_reports_failed_rows_and_strict_refuses_them(tmp_path):
    path = _write_lines(tmp_path / "b.jsonl", _batch_with_failures())
    base = ["eval", "--no-figures", str(path), "--bootstrap", "0", "--methods", ""]
    result = CliRunner().invoke(app, base + ["--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert payload["inputs"][0]["skipped"] == {"failed request": 2, "response without choices": 1}
    assert "3 failed rows left out" in (tmp_path / "out" / "report.md").read_text()
    strict = CliRunner().invoke(app, base + ["--out", str(tmp_path / "strict"), "--strict"])
    assert strict.exit_code == 2 and "b.jsonl:3: field 'error'" in strict.output


# ------------------------------------------------------------------------------------- 4. folders of steps


def _trl_step(folder: Path, name: str, step: int, *, logprobs: bool) -> None:
    import pandas as pd

    table = {"step": [step] * 4, "prompt": ["a", "a", "b", "b"],
             "completion": ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "\\boxed{3}"],
             "accuracy_reward": [1.0, 0.0, float(step > 5), 1.0], "advantage": [0.0] * 4}
    if logprobs:
        table.update(logprob_mean=[-0.1, -0.9, -0.5, -0.2], correct=[True, False, step > 5, True])
    pd.DataFrame(table).to_parquet(folder / name)


def test_a_trl_folder_of_steps_is_reported_per_step_in_step_order(tmp_path):
    folder = tmp_path / "completions"
    folder.mkdir()
    # name order (completions_10 before completions_5) is not step order; only the later step has log-probs
    _trl_step(folder, "completions_10.parquet", 10, logprobs=True)
    _trl_step(folder, "completions_5.parquet", 5, logprobs=False)
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(folder), "--out", str(tmp_path / "out"), "--bootstrap", "0",
                                      "--methods", ""])
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "out" / "metrics.json").read_text())
    inputs = payload["inputs"]
    assert [i["label"] for i in inputs] == ["completions step 5", "completions"]  # the last step: the headline
    assert [Path(i["file"]).name for i in inputs] == ["completions_5.parquet", "completions_10.parquet"]
    assert [i["confidence"] for i in inputs] == [None, "logprob_mean"]
    assert [i["rows"] for i in inputs] == [4, 4]
    assert any("the last (step 10) is the headline" in n for n in inputs[1]["notes"])
    overall = payload["results"]["overall"]
    # step 5: 2 of 4 correct; step 10: 3 of 4
    accuracy = [overall[i["label"]]["accuracy"] for i in inputs]
    assert accuracy == [0.5, 0.75]


def test_a_verl_folder_of_steps_is_reported_per_step(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--no-figures", str(F / "verl_val"), "--out", str(tmp_path / "out"),
                                      "--bootstrap", "0", "--methods", ""])
    assert result.exit_code == 0, result.output
    inputs = json.loads((tmp_path / "out" / "metrics.json").read_text())["inputs"]
    assert [i["label"] for i in inputs] == ["verl_val step 10", "verl_val"]
    assert sum(i["rows"] for i in inputs) == len(_load(F / "verl_val"))


# ------------------------------------------------------------------------- 3. API outputs graded as they come


def _chat(custom_id: str, texts: list[str]) -> dict:
    """A Batch API output line of a chat completion with log-probs and no gold, as the API delivers it."""
    choices = [{"index": i, "message": {"role": "assistant", "content": text},
                "logprobs": {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]},
                "finish_reason": "stop"} for i, text in enumerate(texts)]
    return {"id": f"batch_req_{custom_id}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": "r", "body": {"id": "chatcmpl", "object":
                         "chat.completion", "model": "gpt-4o-mini", "choices": choices}}, "error": None}


def test_answers_file_grades_a_batch_without_gold_and_the_grader_is_chosen(tmp_path):
    path = _write_lines(tmp_path / "out.jsonl", [
        _chat("q1", ["The answer is 5", "so \\boxed{5}"]), _chat("q2", ["I think it is 7.", "no idea"])])
    with pytest.raises(SamplesError, match=r"^out\.jsonl:1: field 'gold': missing"):
        load_samples(path)
    answers = _write_lines(tmp_path / "answers.jsonl", [{"prompt_id": "q1", "answer": "5"},
                                                        {"custom_id": "q2", "answer": "7"}])
    from calibrl.evaluation.samples import load_answers

    table = load_answers(str(answers))
    boxed = _load(path, answers=table, answers_source="answers.jsonl")
    assert boxed.answers.tolist() == [None, "5", None, None] and boxed.correct.tolist() == [False, True, False, False]
    assert any("boxed grader" in n and "3 of 4 completions had no parsable answer" in n for n in boxed.notes)
    verify = _load(path, answers=table, answers_source="answers.jsonl", grader="math-verify")
    assert verify.correct.tolist() == [True, True, True, False]
    assert any("math-verify grader" in n and "1 of 4 completions had no parsable answer" in n for n in verify.notes)
    assert verify.completions.tolist() == ["The answer is 5", "so \\boxed{5}", "I think it is 7.", "no idea"]


def test_cli_answers_and_grader(tmp_path):
    path = _write_lines(tmp_path / "out.jsonl", [_chat("test/prealgebra/1.json", ["The answer is 5", "6"])])
    answers = Path(__file__).parent / "fixtures" / "math500.jsonl"  # a dataset file in its own format
    base = ["eval", "--no-figures", str(path), "--bootstrap", "0", "--methods", "", "--answers", str(answers)]
    result = CliRunner().invoke(app, base + ["--out", str(tmp_path / "out"), "--grader", "math-verify"])
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert payload["results"]["overall"]["out"]["accuracy"] == 0.5
    assert "math-verify grader" in (tmp_path / "out" / "report.md").read_text()
    missing = CliRunner().invoke(app, ["eval", "--no-figures", str(path), "--out", str(tmp_path / "o2"), "--answers", "nope.jsonl"])
    assert missing.exit_code == 2 and "--answers nope.jsonl: no such file" in missing.output


def test_api_and_vllm_outputs_stopped_at_the_token_limit_are_truncated(tmp_path):
    chat = _lines(F / "openai_chat.jsonl")
    chat[0]["choices"][1]["finish_reason"] = "length"
    del chat[1]["choices"][0]["finish_reason"]  # not said: not counted as truncated
    assert _load(_write_lines(tmp_path / "c.jsonl", chat)).truncated.tolist() == [False, True, False]
    outputs = _lines(F / "vllm_outputs.jsonl")
    outputs[0]["outputs"][0]["finish_reason"] = "length"
    s = _load(_write_lines(tmp_path / "v.jsonl", outputs))
    assert s.truncated.tolist()[:2] == [True, False] and int(s.truncated.sum()) == 1
