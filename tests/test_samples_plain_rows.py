"""The reading loop's short path for rows of only prompt_id, correct, answer, logprob_mean and decision_prob:
the same samples and the same errors as the full loop, which a row with one more field (a null one, changing
nothing) takes."""

import dataclasses
import json

import numpy as np
import pytest

from calibrl.evaluation.samples import SamplesError, load_samples


def _write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def _full(rows):
    """The same rows, each with a null field the short path does not handle (so the full loop reads them)."""
    return [{**r, "n_tokens": None} for r in rows]


def _plain_rows(main: str, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(60):
        row = {"prompt_id": f"q{i // 6}" if i % 4 else i // 6,  # strings and integers
               "correct": bool(rng.random() < 0.6) if i % 5 else int(rng.random() < 0.5),  # bools and 0 / 1
               main: float(-rng.exponential(0.5)) if main == "logprob_mean" else float(rng.random())}
        if i % 3 == 0:
            row["answer"] = str(int(rng.integers(0, 4)))
        elif i % 3 == 1:
            row["answer"] = int(rng.integers(0, 4))  # a number given as the answer: its text
        else:
            row["answer"] = None
        if main == "logprob_mean" and i % 7 == 0:
            row["logprob_mean"] = 5e-7  # float noise above 0: clipped to 0
        if i % 11 == 5:  # the other number on a few rows (not the first, which names the main confidence)
            row["decision_prob" if main == "logprob_mean" else "logprob_mean"] = -0.25 if main == "decision_prob" else 0.4
        rows.append(row)
    return rows


def _same_samples(a, b) -> None:
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if field.name in ("source", "path", "notes", "grading"):  # where the file is, and its grader object
            continue
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x is not None and y is not None, field.name
            assert x.dtype == y.dtype, field.name
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), field.name
        else:
            assert x == y, field.name


@pytest.mark.parametrize("main", ["logprob_mean", "decision_prob"])
def test_plain_rows_read_as_the_full_loop_reads_them(tmp_path, main):
    rows = _plain_rows(main)
    short = load_samples(_write(tmp_path / "plain.jsonl", rows))
    full = load_samples(_write(tmp_path / "full.jsonl", _full(rows)))
    assert short.confidence_kind == main
    _same_samples(short, full)
    assert np.isnan(short.reward).all() if short.reward is not None else True
    lpm = short.logprob_mean
    if main == "logprob_mean":
        assert lpm[0] == 0.0 and (lpm <= 0).all()  # the clipped row
    # mixing the two paths row by row changes nothing either
    mixed = [r if i % 2 else _full([r])[0] for i, r in enumerate(rows)]
    _same_samples(load_samples(_write(tmp_path / "mixed.jsonl", mixed)), full)


BAD = [
    ({"correct": True, "logprob_mean": -0.1}, "field 'prompt_id': missing"),
    ({"prompt_id": None, "correct": True, "logprob_mean": -0.1}, "field 'prompt_id': missing"),
    ({"prompt_id": 1.5, "correct": True, "logprob_mean": -0.1}, "field 'prompt_id': expected str or int"),
    ({"prompt_id": 1, "logprob_mean": -0.1}, "field 'correct': missing"),
    ({"prompt_id": 1, "correct": 2, "logprob_mean": -0.1}, "field 'correct': expected a bool"),
    ({"prompt_id": 1, "correct": True}, "field 'logprob_mean': missing"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": None}, "field 'logprob_mean': missing"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": 0.5}, "field 'logprob_mean': out of range"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": "x"}, "field 'logprob_mean': expected a number"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "decision_prob": 1.5}, "field 'decision_prob': out of range"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "answer": ["x"]}, "field 'answer': expected a string"),
    # two bad fields: the first checked is named, as in the full loop
    ({"prompt_id": 1.5, "correct": "no", "logprob_mean": 0.5}, "field 'prompt_id'"),
    ({"prompt_id": 1, "correct": "no", "logprob_mean": 0.5}, "field 'logprob_mean'"),
    ({"prompt_id": 1, "correct": "no", "logprob_mean": -0.1, "answer": ["x"]}, "field 'correct'"),
]


@pytest.mark.parametrize("row,message", BAD)
def test_bad_plain_rows_fail_as_in_the_full_loop(tmp_path, row, message):
    good = {"prompt_id": "q0", "correct": True, "logprob_mean": -0.2, "answer": "1"}
    errors = []
    for name, rows in (("plain.jsonl", [good, row]), ("full.jsonl", _full([good, row]))):
        with pytest.raises(SamplesError) as err:
            load_samples(_write(tmp_path / name, rows))
        errors.append(str(err.value).split(":", 2)[2])  # without "file:line:"
        assert str(err.value).startswith(f"{name}:2: ")
    assert errors[0] == errors[1]
    assert message in errors[0]
