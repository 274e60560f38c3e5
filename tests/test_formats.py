"""Reading other tools' output files (TRL, verl, OpenAI-style APIs, vLLM, lm-evaluation-harness) as samples.

The fixtures under tests/fixtures/formats/ are in each tool's own format: the TRL Parquet files were written with
``pd.DataFrame(table).to_parquet`` exactly as ``GRPOTrainer.log`` (TRL 1.16) builds its table; the JSONL files
follow verl 0.9.1's ``_write_generations``, the OpenAI response / Batch API output objects, vLLM's
``RequestOutput`` fields and lm-eval 0.4's ``save_results_samples``.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from calibrl.evaluation.readers import FORMATS, detect_format
from calibrl.evaluation.samples import SamplesError, load_samples

F = Path(__file__).parent / "fixtures" / "formats"
ARC = F / "samples_arc_easy_2024-05-01T12-00-00.123456.jsonl"
GSM8K = F / "samples_gsm8k_2024-05-01T12-00-00.123456.jsonl"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _load(path, **kwargs):
    """load_samples with its notes' warnings recorded."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = load_samples(path, **kwargs)
    return samples, [str(w.message) for w in caught]


@pytest.mark.parametrize("name,fmt", [
    ("trl_completions", "trl"), ("trl_plain/completions_00005.parquet", "trl"), ("verl_val", "verl"),
    ("verl_val/10.jsonl", "verl"), ("openai_chat.jsonl", "openai"), ("openai_batch_output.jsonl", "openai"),
    ("vllm_outputs.jsonl", "vllm"), (ARC.name, "lm-eval"), (GSM8K.name, "lm-eval"),
])
def test_format_is_detected_from_the_fields(name, fmt):
    assert detect_format(F / name) == fmt


def test_undetectable_file_lists_formats_and_their_fields(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [{"question": "q", "response": "r"}])
    with pytest.raises(SamplesError) as err:
        load_samples(path)
    message = str(err.value)
    assert message.startswith("x.jsonl:1: cannot tell the file's format from its fields (question, response)")
    for fmt in FORMATS:
        assert f"{fmt}: " in message
    assert "verl: input, output, score" in message and "lm-eval: doc_id, target, resps" in message


def test_an_explicit_format_is_read_as_such(tmp_path):
    with pytest.raises(SamplesError, match=r"^openai_chat\.jsonl:1: field 'input': missing"):
        load_samples(F / "openai_chat.jsonl", format="verl")
    with pytest.raises(SamplesError, match=r"is a folder; only the trl and verl formats read folders"):
        load_samples(F / "verl_val", format="openai")
    with pytest.raises(SamplesError, match=r"is a folder; a calibrl samples file is expected"):
        load_samples(F / "verl_val", format="calibrl")
    with pytest.raises(SamplesError, match=r"holds no \.parquet or \.jsonl file"):
        load_samples(tmp_path)


# ------------------------------------------------------------------------------------------------------ TRL


def test_trl_folder_with_calibrl_columns():
    s, warned = _load(F / "trl_completions")
    assert s.format == "trl" and s.source == "trl_completions" and warned == []
    assert len(s) == 6 and s.confidence_kind == "logprob_mean"
    np.testing.assert_allclose(s.logprob_mean, [-0.1, -0.9, -0.2, -0.3, -0.05, -0.07])
    assert s.correct.tolist() == [True, False, True, True, True, True]  # the 'correct' column
    assert s.answers.tolist() == ["5", "6", "42", "42", "5", "5"]
    assert s.completions[0] == "2+3 = \\boxed{5}"  # the assistant message's text
    # one group per (step, prompt): the same conversation at steps 10 and 20 is two prompts
    assert s.group_sizes().tolist() == [2, 2, 2] and s.n_prompts == 3
    assert s.prompt_ids[0].startswith("10:") and s.prompt_ids[4].startswith("20:")
    assert s.prompt_ids[0] == s.prompt_ids[1] != s.prompt_ids[2]
    assert len(load_samples(F / "trl_completions" / "completions_00010.parquet")) == 4


def test_trl_plain_log_reads_correct_from_the_first_reward_column():
    s, warned = _load(F / "trl_plain")
    assert s.correct.tolist() == [True, False, True]
    assert s.confidence_kind is None and s.logprob_mean is None  # no calibrl columns: accuracy and selection only
    assert any("correct = reward 'accuracy_reward' > 0.5" in n for n in s.notes)
    assert any("no confidence input" in n for n in s.notes) and warned == s.notes
    with pytest.raises(SamplesError, match="no confidence input"):
        s.confidence()


def test_trl_errors_name_file_row_and_column(tmp_path):
    import pandas as pd

    table = {"step": [1, 1], "prompt": ["p", "p"], "completion": ["\\boxed{1}", "x"],
             "accuracy_reward": [1.0, float("nan")], "advantage": [0.0, 0.0]}
    pd.DataFrame(table).to_parquet(tmp_path / "completions_00001.parquet")
    # a reward function's None (NaN) is written as null: no correctness for that row
    with pytest.raises(SamplesError, match=r"^completions_00001\.parquet:2: field 'accuracy_reward': missing"):
        load_samples(tmp_path)
    table["logprob_mean"] = [-0.1, float("nan")]  # a row without tokens has no confidence
    table["correct"] = [True, False]
    pd.DataFrame(table).to_parquet(tmp_path / "completions_00001.parquet")
    with pytest.raises(SamplesError, match=r"^completions_00001\.parquet:2: field 'logprob_mean': missing"):
        load_samples(tmp_path / "completions_00001.parquet")


# ----------------------------------------------------------------------------------------------------- verl


def test_verl_validation_dumps():
    s, _ = _load(F / "verl_val")
    assert s.format == "verl" and len(s) == 6 and s.n_prompts == 3
    np.testing.assert_allclose(s.logprob_mean, [-0.12, -0.85, -0.2, -0.31, -0.04, -1.5])
    # 10.jsonl has acc; 20.jsonl has none, so score > 0.5
    assert s.correct.tolist() == [True, False, True, True, True, False]
    np.testing.assert_allclose(s.reward, [1, -1, 1, 1, 1, 0])
    assert s.answers.tolist() == ["5", "6", "42", "42", "5", None]  # pred, else the last \boxed{}
    assert s.prompt_ids[0] == s.prompt_ids[1] and s.prompt_ids[4] != s.prompt_ids[0]  # grouped by (step, input)


def test_verl_steps_are_read_in_numeric_order(tmp_path):
    rows = _lines(F / "verl_val" / "10.jsonl")
    _write_lines(tmp_path / "2.jsonl", [dict(r, step=2) for r in rows[:2]])
    _write_lines(tmp_path / "10.jsonl", rows)
    assert [p.split(":")[0] for p in load_samples(tmp_path).prompt_ids] == ["2"] * 2 + ["10"] * 4


def test_verl_error_names_file_line_and_field(tmp_path):
    rows = _lines(F / "verl_val" / "10.jsonl")
    rows[2]["score"] = "high"
    with pytest.raises(SamplesError, match=r"^10\.jsonl:3: field 'score': expected a number"):
        load_samples(_write_lines(tmp_path / "10.jsonl", rows))
    del rows[2]["output"]
    rows[2]["score"] = 1.0
    with pytest.raises(SamplesError, match=r"^10\.jsonl:3: field 'output': missing"):
        load_samples(_write_lines(tmp_path / "10.jsonl", rows), format="verl")


# ------------------------------------------------------------------------------------------- OpenAI, vLLM


def test_openai_chat_responses_graded_against_metadata():
    s, _ = _load(F / "openai_chat.jsonl")
    assert s.prompt_ids.tolist() == ["add", "add", "mc1"]  # the choices of one response form a group
    np.testing.assert_allclose(s.logprob_mean, [(-0.1 - 0.3) / 2, (-0.2 - 2.0) / 2, (-0.05 - 0.01 - 0.6) / 3])
    assert s.n_tokens.tolist() == [2, 2, 3]
    assert s.answers.tolist() == ["5", "6", "B"]  # math: last \boxed{}; decision: last standalone class
    assert s.correct.tolist() == [True, False, True]


def test_openai_batch_output_with_legacy_completions():
    s, _ = _load(F / "openai_batch_output.jsonl")
    assert s.prompt_ids.tolist() == ["q-001", "q-001", "q-002"]  # custom_id
    np.testing.assert_allclose(s.logprob_mean, [-0.3, -1.0, -0.3])
    assert s.correct.tolist() == [True, False, True]  # \frac{1}{2} equals the gold 0.5 (math-verify)


@pytest.mark.parametrize("edit,message", [
    (lambda r: r["choices"][0].pop("logprobs"), r"^c\.jsonl:1: field 'choices\[0\]\.logprobs': missing"),
    (lambda r: r.pop("metadata"), r"^c\.jsonl:1: field 'gold': missing \(the file has no gold answer"),
    (lambda r: r["choices"][1]["logprobs"]["content"][1].update(logprob="x"),
     r"^c\.jsonl:1: field 'choices\[1\]\.logprobs\.content\[1\]\.logprob': expected a number"),
])
def test_openai_errors_name_file_line_and_field(tmp_path, edit, message):
    rows = _lines(F / "openai_chat.jsonl")
    edit(rows[0])
    with pytest.raises(SamplesError, match=message):
        load_samples(_write_lines(tmp_path / "c.jsonl", rows))


def test_openai_batch_failure_is_named(tmp_path):
    rows = _lines(F / "openai_batch_output.jsonl")
    rows[1]["response"]["status_code"] = 500
    with pytest.raises(SamplesError, match=r"^b\.jsonl:2: field 'response\.status_code': the request failed"):
        load_samples(_write_lines(tmp_path / "b.jsonl", rows))


def test_vllm_request_outputs():
    s, _ = _load(F / "vllm_outputs.jsonl")
    assert s.format == "vllm" and s.group_sizes().tolist() in ([2, 1], [1, 2])
    # cumulative_logprob / len(token_ids); else the sampled tokens' entries of logprobs
    np.testing.assert_allclose(s.logprob_mean, [-1.0 / 5, -5.0 / 5, (-0.2 - 0.4) / 2])
    assert s.answers.tolist() == ["5", "6", "no"] and s.correct.tolist() == [True, False, True]


def test_vllm_error_names_file_line_and_field(tmp_path):
    rows = _lines(F / "vllm_outputs.jsonl")
    rows[0]["outputs"][1]["cumulative_logprob"] = None
    with pytest.raises(SamplesError, match=r"^v\.jsonl:1: field 'outputs\[1\]\.cumulative_logprob': missing"):
        load_samples(_write_lines(tmp_path / "v.jsonl", rows))


# --------------------------------------------------------------------------------------------------- lm-eval


def test_lm_eval_multiple_choice():
    s, _ = _load(ARC)
    assert s.format == "lm-eval" and s.prompt_ids.tolist() == ["0", "1"]
    lls = [[-12.5, -11.0, -9.0, -13.0], [-6.2, -5.1, -7.9]]
    for row, ll in zip(s.class_probs, lls):
        expected = np.exp(ll) / np.exp(ll).sum()
        np.testing.assert_allclose(row[: len(ll)], expected)
        assert (row[len(ll):] == 0).all()  # padded to the file's 4 choices
    assert s.labels.tolist() == [2, 0] and s.correct.tolist() == [True, False]  # lm-eval's acc: 1.0, 0.0
    np.testing.assert_allclose(s.confidence(), s.class_probs.max(axis=1))
    c = load_samples(ARC, confidence="class_probs")
    assert c.confidence_target().tolist() == [True, False]
    assert s.answers.tolist() == ["Planetary days will become shorter.", "liters"]


def test_lm_eval_string_target_and_errors(tmp_path):
    rows = _lines(ARC)
    rows[1]["target"] = "grams"  # a choice's text
    assert load_samples(_write_lines(tmp_path / "a.jsonl", rows)).labels.tolist() == [2, 0]
    rows[1]["target"] = "7"
    with pytest.raises(SamplesError, match=r"^a\.jsonl:2: field 'target': out of range: 7 not in \[0, 3\)"):
        load_samples(_write_lines(tmp_path / "a.jsonl", rows))
    rows[1]["target"] = "0"
    rows[1]["resps"][1] = [["oops", "False"]]
    with pytest.raises(SamplesError, match=r"^a\.jsonl:2: field 'resps\[1\]\[0\]\[0\]': expected a number"):
        load_samples(_write_lines(tmp_path / "a.jsonl", rows))


def test_lm_eval_generation_task_reads_its_first_filter():
    s, warned = _load(GSM8K)
    assert len(s) == 2 and s.confidence_kind is None and s.logprob_mean is None
    assert s.correct.tolist() == [True, False]  # exact_match of the strict-match rows
    assert s.answers.tolist() == ["72", None]  # "[invalid]": nothing extracted
    assert any("read filter 'strict-match'; skipped filter(s) flexible-extract" in n for n in s.notes)
    assert warned == s.notes


def test_lm_eval_repeated_sampling_grades_each_answer(tmp_path):
    row = _lines(GSM8K)[0]
    row["resps"] = [["... #### 72", "... #### 70", "... nothing"]]
    row["filtered_resps"] = [["72", "70", "[invalid]"]]
    s = load_samples(_write_lines(tmp_path / "r.jsonl", [row]))
    assert s.prompt_ids.tolist() == ["0"] * 3 and s.correct.tolist() == [True, False, False]
    assert s.answers.tolist() == ["72", "70", None]
    assert math.isclose(s.correct.mean(), 1 / 3)


def test_jsonl_errors_apply_to_every_format(tmp_path):
    path = tmp_path / "samples_x_2024.jsonl"
    path.write_text(json.dumps(_lines(ARC)[0]) + "\n{oops\n")
    with pytest.raises(SamplesError, match=r"^samples_x_2024\.jsonl:2: invalid JSON"):
        load_samples(path)
    shutil.copy(F / "vllm_outputs.jsonl", tmp_path / "v.jsonl")
    with open(tmp_path / "v.jsonl", "a") as f:
        f.write("[1, 2]\n")
    with pytest.raises(SamplesError, match=r"^v\.jsonl:3: expected a JSON object per line"):
        load_samples(tmp_path / "v.jsonl")
