"""Loading and validating samples files (JSONL, Parquet)."""

import json

import numpy as np
import pytest

from calibrl.evaluation.samples import SamplesError, load_samples


def _write(path, rows, raw_lines=()):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for line in raw_lines:
            f.write(line + "\n")
    return path


ROWS = [
    {"prompt_id": "q1", "correct": True, "logprob_mean": -0.1, "answer": "3", "benchmark": "aime", "n_tokens": 5},
    {"prompt_id": "q1", "reward": 0.0, "logprob_mean": -1.2, "answer": 4, "benchmark": "aime"},
    {"prompt_id": 2, "reward": 1.0, "logprob_mean": -0.3, "answer": None, "benchmark": "math"},
]


def test_jsonl_round_trip(tmp_path):
    s = load_samples(_write(tmp_path / "s.jsonl", ROWS))
    assert s.source == "s.jsonl" and s.name == "s" and len(s) == 3 and s.n_prompts == 2
    assert s.correct.tolist() == [True, False, True]  # reward > 0.5
    assert s.confidence_kind == "logprob_mean"
    np.testing.assert_allclose(s.confidence(), np.exp([-0.1, -1.2, -0.3]))
    np.testing.assert_allclose(s.score(), [-0.1, -1.2, -0.3])
    assert s.answers.tolist() == ["3", "4", None]
    assert s.prompt_ids.tolist() == ["q1", "q1", "2"]
    assert s.group_sizes().tolist() == [2, 1]  # dense index over (benchmark, prompt_id): aime/q1, math/2
    assert np.isnan(s.n_tokens[1]) and s.n_tokens[0] == 5
    parts = s.by_benchmark()
    assert list(parts) == ["aime", "math"] and len(parts["aime"]) == 2 and parts["math"].n_prompts == 1


def test_parquet_equals_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [dict(r, prompt_id=str(r["prompt_id"]), answer=None if r["answer"] is None else str(r["answer"]))
            for r in ROWS]
    keys = sorted({k for r in rows for k in r})  # from_pylist would take the columns of the first row only
    pq.write_table(pa.Table.from_pydict({k: [r.get(k) for r in rows] for k in keys}), tmp_path / "s.parquet")
    a = load_samples(tmp_path / "s.parquet")
    b = load_samples(_write(tmp_path / "s.jsonl", ROWS))
    assert a.correct.tolist() == b.correct.tolist()
    np.testing.assert_allclose(a.logprob_mean, b.logprob_mean)
    assert a.prompt_ids.tolist() == b.prompt_ids.tolist()


def test_decision_and_class_probs(tmp_path):
    rows = [
        {"prompt_id": 0, "correct": True, "decision_prob": 0.9, "class_probs": [0.9, 0.1], "label": "Y",
         "classes": ["Y", "N"]},
        {"prompt_id": 1, "correct": False, "decision_prob": 0.6, "class_probs": [0.4, 0.6], "label": 0,
         "classes": ["Y", "N"]},
    ]
    path = _write(tmp_path / "d.jsonl", rows)
    s = load_samples(path)
    assert s.confidence_kind == "decision_prob"
    np.testing.assert_allclose(s.confidence(), [0.9, 0.6])
    c = load_samples(path, confidence="class_probs")
    assert c.labels.tolist() == [0, 0] and c.classes == ["Y", "N"]
    np.testing.assert_allclose(c.confidence(), [0.9, 0.6])
    assert c.confidence_target().tolist() == [True, False]
    # correct may be derived from class_probs + label
    rows2 = [{k: v for k, v in r.items() if k != "correct"} for r in rows]
    assert load_samples(_write(tmp_path / "e.jsonl", rows2), confidence="class_probs").correct.tolist() == [True, False]


BAD = [
    ({"correct": True, "logprob_mean": -0.1}, "field 'prompt_id': missing"),
    ({"prompt_id": 1, "logprob_mean": -0.1}, "field 'correct': missing"),
    ({"prompt_id": 1, "correct": "yes", "logprob_mean": -0.1}, "field 'correct': expected a bool"),
    ({"prompt_id": 1.5, "correct": True, "logprob_mean": -0.1}, "field 'prompt_id': expected str or int"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": "high"}, "field 'logprob_mean': expected a number"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": 0.5}, "field 'logprob_mean': out of range"),
    ({"prompt_id": 1, "correct": True}, "field 'logprob_mean': missing"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "decision_prob": 1.5}, "field 'decision_prob': out of range"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "class_probs": [0.5, 0.2], "label": 0}, "field 'class_probs': out of range"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "class_probs": [0.5, 0.5], "label": 2}, "field 'label': out of range"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "class_probs": [0.5, 0.5], "label": "Z"}, "field 'label'"),
    ({"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "answer": ["x"]}, "field 'answer': expected a string"),
]


@pytest.mark.parametrize("row,message", BAD)
def test_bad_rows_name_file_line_and_field(tmp_path, row, message):
    path = _write(tmp_path / "bad.jsonl", [ROWS[0], ROWS[1]] + [row])
    with pytest.raises(SamplesError) as err:
        load_samples(path)
    assert str(err.value).startswith("bad.jsonl:3: ")
    assert message in str(err.value)


def test_nan_and_inf_are_rejected(tmp_path):
    for literal in ("NaN", "Infinity", "-Infinity"):
        path = _write(tmp_path / "nan.jsonl", ROWS[:1],
                      raw_lines=[f'{{"prompt_id": 1, "correct": true, "logprob_mean": {literal}}}'])
        with pytest.raises(SamplesError, match=r"^nan\.jsonl:2: field 'logprob_mean': must be finite"):
            load_samples(path)


def test_unreadable_inputs(tmp_path):
    with pytest.raises(SamplesError, match="no such file"):
        load_samples(tmp_path / "missing.jsonl")
    with pytest.raises(SamplesError, match=r"^e\.jsonl: no samples"):
        load_samples(_write(tmp_path / "e.jsonl", []))
    with pytest.raises(SamplesError, match=r"^j\.jsonl:2: invalid JSON"):
        load_samples(_write(tmp_path / "j.jsonl", ROWS[:1], raw_lines=["{oops"]))
    with pytest.raises(SamplesError, match="unknown confidence"):
        load_samples(_write(tmp_path / "k.jsonl", ROWS), confidence="entropy")


def test_parquet_errors_name_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"prompt_id": "a", "correct": True, "logprob_mean": -0.1},
                                         {"prompt_id": "a", "correct": True, "logprob_mean": float("nan")}]),
                   tmp_path / "p.parquet")
    with pytest.raises(SamplesError, match=r"^p\.parquet:2: field 'logprob_mean': must be finite"):
        load_samples(tmp_path / "p.parquet")


def test_non_utf8_gzip_bom_and_json_array(tmp_path):
    import gzip

    good = "".join(json.dumps(r) + "\n" for r in ROWS)
    # a bad byte on line 2 is reported on line 2
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(good.encode().replace(b'"answer": 4', b'"answer": "\xe94"'))
    with pytest.raises(SamplesError, match=r"^latin\.jsonl:2: not UTF-8 text \(byte 0xe9"):
        load_samples(latin)
    gz = tmp_path / "s.jsonl.gz"
    gz.write_bytes(gzip.compress(good.encode()))
    with pytest.raises(SamplesError, match=r"^s\.jsonl\.gz:1: not UTF-8 text \(the file is gzip-compressed"):
        load_samples(gz)
    # a leading UTF-8 byte-order mark is accepted
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + good.encode())
    s = load_samples(bom)
    assert len(s) == 3 and s.prompt_ids.tolist() == ["q1", "q1", "2"]
    # CRLF line ends are fine
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(good.replace("\n", "\r\n").encode())
    assert len(load_samples(crlf)) == 3
    # a JSON array (one line or pretty-printed) is named as such
    for name, text in (("a.json", json.dumps(ROWS)), ("b.json", json.dumps(ROWS, indent=2))):
        (tmp_path / name).write_text(text)
        with pytest.raises(SamplesError, match=rf"^{name[0]}\.json:1: the file is a JSON array; JSON Lines is expected"):
            load_samples(tmp_path / name)


def test_huge_integers_are_errors_naming_the_field(tmp_path):
    digits = "9" * 400  # parses as a Python int too large for a float
    head = '"prompt_id": 1, "correct": true'
    for field, line in (("logprob_mean", f'{{{head}, "logprob_mean": -{digits}}}'),
                        ("n_tokens", f'{{{head}, "logprob_mean": -0.1, "n_tokens": {digits}}}'),
                        ("class_probs", f'{{{head}, "logprob_mean": -0.1, "class_probs": [{digits}, 0], "label": 0}}')):
        path = _write(tmp_path / "big.jsonl", ROWS[:1], raw_lines=[line])
        with pytest.raises(SamplesError, match=rf"^big\.jsonl:2: field '{field}': out of range: .*too large"):
            load_samples(path)
    # beyond Python's int digit limit the JSON decoder itself refuses the number
    path = _write(tmp_path / "huge.jsonl", ROWS[:1], raw_lines=['{"prompt_id": 1, "reward": ' + "1" * 5000 + "}"])
    with pytest.raises(SamplesError, match=r"^huge\.jsonl:2: invalid JSON"):
        load_samples(path)


def test_deeply_nested_json_is_an_error_naming_the_line(tmp_path):
    depth = 200_000
    nested = "[" * depth + "]" * depth
    path = _write(tmp_path / "deep.jsonl", ROWS[:1],
                  raw_lines=['{"prompt_id": 1, "correct": true, "logprob_mean": -0.1, "x": ' + nested + "}"])
    with pytest.raises(SamplesError, match=r"^deep\.jsonl:2: invalid JSON \(nested too deeply\)"):
        load_samples(path)


def test_classes_must_match_class_probs(tmp_path):
    # "C" is index 2 of classes but class_probs has only 2 entries: the row would be counted wrong
    rows = [{"prompt_id": 0, "class_probs": [0.3, 0.7], "label": "C", "classes": ["A", "B", "C"]}]
    with pytest.raises(SamplesError, match=r"^c\.jsonl:1: field 'classes': has 3 classes but 'class_probs' has 2"):
        load_samples(_write(tmp_path / "c.jsonl", rows))
    # classes named on the first row only apply to later rows too
    rows = [{"prompt_id": 0, "class_probs": [0.3, 0.7], "label": "B", "classes": ["A", "B"]},
            {"prompt_id": 1, "class_probs": [0.2, 0.3, 0.5], "label": 0}]
    with pytest.raises(SamplesError, match=r"^d\.jsonl:2: field 'class_probs': has 3 classes, earlier rows have 2"):
        load_samples(_write(tmp_path / "d.jsonl", rows))


def test_calibrl_files_are_detected_as_calibrl(tmp_path):
    # extra fields another format also uses (step, prompt, completion) do not change the format
    rows = [dict(r, step=3, prompt="p", completion="c") for r in ROWS]
    s = load_samples(_write(tmp_path / "s.jsonl", rows))
    assert s.format == "calibrl" and s.notes == [] and len(s) == 3
    assert load_samples(_write(tmp_path / "t.jsonl", ROWS), format="calibrl").format == "calibrl"
    with pytest.raises(SamplesError, match="unknown format 'csv'; choose one of calibrl, trl, verl"):
        load_samples(tmp_path / "t.jsonl", format="csv")
    # a first row missing its outcome is still read as calibrl, so the missing field is named
    with pytest.raises(SamplesError, match=r"^u\.jsonl:1: field 'correct': missing"):
        load_samples(_write(tmp_path / "u.jsonl", [{"prompt_id": 1, "logprob_mean": -0.1}]))
    with pytest.raises(SamplesError, match=r"^v\.jsonl:1: expected a JSON object per line, got int"):
        load_samples(_write(tmp_path / "v.jsonl", [3]))


# ------------------------------------------------------------------------------------ verbalized confidence
def test_verbalized_confidence_field_and_parsed_from_completion(tmp_path):
    rows = [
        {"prompt_id": "a", "correct": True, "logprob_mean": -0.1, "verbalized_confidence": 0.7},
        # an explicit null means "stated none": the text is not read again
        {"prompt_id": "a", "correct": False, "logprob_mean": -0.9, "verbalized_confidence": None,
         "completion": "x <confidence>0.9</confidence>"},
        {"prompt_id": "b", "correct": True, "logprob_mean": -0.2,
         "completion": "<confidence>0.1</confidence> 4 <confidence>.8</confidence>"},  # the LAST tag counts
        {"prompt_id": "b", "correct": False, "logprob_mean": -0.5, "completion": "4 <confidence>80%</confidence>"},
        {"prompt_id": "c", "correct": False, "logprob_mean": -0.6, "completion": "4 <confidence>1.2</confidence>"},
        {"prompt_id": "c", "correct": True, "logprob_mean": -0.3},
    ]
    s = load_samples(_write(tmp_path / "v.jsonl", rows))
    assert s.confidence_kind == "logprob_mean"  # the main confidence is unchanged by the new source
    np.testing.assert_array_equal(s.verbalized_confidence, [0.7, np.nan, 0.8, np.nan, np.nan, np.nan])
    assert s.confidence_sources() == ["logprob_mean", "verbalized_confidence"]
    assert s.source_mask("verbalized_confidence").tolist() == [True, False, True, False, False, False]
    assert any("on 1 rows" in n for n in s.notes)  # only row 3 was read from its text
    sub = s.subset(np.array([False, False, True, True, False, False]))
    np.testing.assert_array_equal(sub.verbalized_confidence, [0.8, np.nan])
    with pytest.raises(SamplesError, match="'verbalized_confidence' is not present on every row"):
        s.confidence("verbalized_confidence")


def test_verbalized_confidence_as_main_and_errors(tmp_path):
    only_text = [{"prompt_id": i, "correct": i % 2 == 0, "completion": f"{i} <confidence>0.{i + 1}</confidence>"}
                 for i in range(4)]
    # a confidence stated only in the text is the main one when asked for, never by detection
    with pytest.raises(SamplesError, match="pass --confidence verbalized_confidence"):
        load_samples(_write(tmp_path / "t.jsonl", only_text))
    s = load_samples(tmp_path / "t.jsonl", confidence="verbalized_confidence")
    assert s.confidence_kind == "verbalized_confidence"
    np.testing.assert_allclose(s.confidence(), [0.1, 0.2, 0.3, 0.4])
    gap = only_text + [{"prompt_id": 9, "correct": True, "completion": "no tag"}]
    with pytest.raises(SamplesError, match=r"g\.jsonl:5: field 'verbalized_confidence': missing"):
        load_samples(_write(tmp_path / "g.jsonl", gap), confidence="verbalized_confidence")
    # a field in the first row is detected (after the other kinds)
    field = [{"prompt_id": 1, "correct": True, "verbalized_confidence": 0.6}]
    assert load_samples(_write(tmp_path / "f.jsonl", field)).confidence_kind == "verbalized_confidence"
    bad = [{"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "verbalized_confidence": 1.5}]
    with pytest.raises(SamplesError, match=r"b\.jsonl:1: field 'verbalized_confidence': out of range"):
        load_samples(_write(tmp_path / "b.jsonl", bad))
    text = [{"prompt_id": 1, "correct": True, "logprob_mean": -0.1, "verbalized_confidence": "0.5"}]
    with pytest.raises(SamplesError, match="field 'verbalized_confidence': expected a number"):
        load_samples(_write(tmp_path / "s.jsonl", text))


# ------------------------------------------------------------------------------------------- memory: texts


def _long_text_rows(n=12, length=20_000, seed=0):
    """Rows of 3 prompts whose completions are long random texts, some repeated within a prompt, one missing."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        text = "".join(rng.choice(list("abcdé 字"), length))
        if i % 4 == 3:
            text = rows[i - 2]["completion"]  # the same text as an earlier path of its prompt
        rows.append({"prompt_id": f"p{i // 4}", "correct": bool(i % 2), "logprob_mean": -0.1 * (i + 1),
                     "answer": str(i % 3), "completion": None if i == 5 else text})
    return rows


def _held_strings(value, seen=None):
    """Every str a Samples attribute holds (inside arrays, lists and dicts too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, np.ndarray):
        if value.dtype.kind == "U":
            yield from value.reshape(-1).tolist()
        elif value.dtype == object:
            for item in value.reshape(-1):
                yield from _held_strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _held_strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _held_strings(item)


def test_samples_hold_text_ids_not_texts(tmp_path):
    rows = _long_text_rows()
    s = load_samples(_write(tmp_path / "long.jsonl", rows))
    texts = [r["completion"] for r in rows]
    held = [text for name in vars(s) for text in _held_strings(getattr(s, name))]
    assert max(len(t) for t in held) < 1000  # prompt ids, answers, the source name: no completion text
    # ids: equal texts share one, a missing text has its own
    ids = s.completion_ids.tolist()
    for i in range(len(rows)):
        for j in range(len(rows)):
            same = texts[i] is not None and texts[i] == texts[j]
            assert (ids[i] == ids[j]) == (same or i == j)
    # the texts are read again from the file when asked for, in row order, for a subset too
    assert s.completions.tolist() == texts
    mask = np.arange(len(rows)) % 3 == 1
    assert s.subset(mask).completions.tolist() == [t for t, m in zip(texts, mask) if m]


def test_pc_and_rpc_from_the_ids_equal_pc_and_rpc_from_the_texts(tmp_path):
    from calibrl import selection as S

    s = load_samples(_write(tmp_path / "long.jsonl", _long_text_rows(n=40, length=300, seed=1)))
    ids = S.answer_clusters(s.answers, s.prompt_index, use_math_verify=False)
    for method in ("pc", "rpc"):
        from_texts = S.select(method, ids, s.correct, s.prompt_index, logprob_mean=s.logprob_mean,
                              completions=s.completions)
        from_ids = S.select(method, ids, s.correct, s.prompt_index, logprob_mean=s.logprob_mean,
                            completions=s.completion_ids)
        np.testing.assert_array_equal(from_ids.correct, from_texts.correct)
        np.testing.assert_array_equal(from_ids.confidence, from_texts.confidence)


def test_reading_long_completions_allocates_about_the_rows_not_their_texts(tmp_path):
    """tracemalloc peak of load_samples on 40 rows of 200,000-character completions (8 MB of text): a few of the
    longest rows (one is decoded at a time), far below the texts' total."""
    import tracemalloc

    rng = np.random.default_rng(2)
    path = tmp_path / "long.jsonl"
    with open(path, "w") as f:
        for i in range(40):
            text = (rng.integers(0, 10, 200_000, dtype=np.uint8) + ord("0")).tobytes().decode()  # 200,000 digits
            f.write(json.dumps({"prompt_id": i // 4, "correct": True, "logprob_mean": -0.5, "completion": text}) + "\n")
    tracemalloc.start()
    try:
        s = load_samples(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(s) == 40 and s.completion_ids.max() == 39  # all distinct
    assert peak < 2_000_000  # one 200 kB row a few times over; holding the texts takes 8 MB


def test_a_row_over_the_size_limit_is_refused_with_its_line(tmp_path, monkeypatch):
    from calibrl.evaluation.readers import base

    monkeypatch.setattr(base, "MAX_ROW_BYTES", 400)
    short = {"prompt_id": "a", "correct": True, "logprob_mean": -0.5, "completion": "x"}
    line = json.dumps(short)
    at_limit = {**short, "completion": "x" * (400 - len(line) + 1)}  # exactly 400 bytes before its newline
    assert len(json.dumps(at_limit)) == 400
    s = load_samples(_write(tmp_path / "ok.jsonl", [short, at_limit, short]))
    assert len(s) == 3
    over = {**short, "completion": "x" * 1000}
    with pytest.raises(SamplesError, match=r"^big\.jsonl:2: the row is too large \(more than 0\.000381"):
        load_samples(_write(tmp_path / "big.jsonl", [short, over, short]))


def test_parquet_rows_read_in_chunks_equal_the_whole_table_and_big_rows_are_refused(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from calibrl.evaluation.readers import base

    rows = [{"prompt_id": f"p{i // 3}", "correct": i % 2 == 0, "logprob_mean": -0.1 * i,
             "completion": [{"role": "assistant", "content": "y" * (10 * i)}], "tags": None if i % 4 else ["ab", "c"]}
            for i in range(30)]
    path = tmp_path / "s.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    # bytes of a row: its prompt id (2), "assistant" (9), the content (10 i), the tags (3 on every 4th row) and
    # 8 for each of its two other values
    table = pq.read_table(path)
    sizes = sum(base._text_bytes(column.combine_chunks()) for column in table.columns)
    assert sizes.tolist() == [2 + 9 + 10 * i + (3 if i % 4 == 0 else 0) + 16 for i in range(30)]
    monkeypatch.setattr(base, "_PARQUET_BATCH_ROWS", 4)
    monkeypatch.setattr(base, "_PARQUET_CHUNK_BYTES", 100)
    assert list(base.rows_parquet(path)) == list(enumerate(table.to_pylist(), start=1))
    monkeypatch.setattr(base, "MAX_ROW_BYTES", 2 + 9 + 10 * 12 + 3 + 16 - 1)  # row 13 (i = 12): the first over
    got = []
    with pytest.raises(SamplesError, match=r"^s\.parquet:13: the row is too large \(0\.0 MiB of text\)"):
        for lineno, _row in base.rows_parquet(path):
            got.append(lineno)
    assert got == list(range(1, 13))
