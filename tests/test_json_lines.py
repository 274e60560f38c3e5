"""JSON Lines are read by orjson, and by ``json.loads`` where orjson refuses a line or could read it differently:
the values are ``json.loads``'s in every case, and so are the errors."""

import json
import math

import numpy as np
import pytest

from calibrl.evaluation.readers.base import SamplesError, _decode_json, rows_jsonl


def _same(a, b) -> bool:
    """Equal values of equal types, recursively (nan equal to nan, -0.0 told from 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def _decode(text: str):
    return _decode_json(text.encode("utf-8", "surrogatepass"), text, lambda: "f.jsonl:1")


TRICKY = [
    '{"prompt_id": 123456789012345678901234567890, "correct": true}',  # beyond 64 bits: kept whole
    '{"x": -9223372036854775809}', '{"x": 18446744073709551616}', '{"x": 18446744073709551615}',
    '{"x": 9223372036854775807}', '{"x": -0}', '{"x": -0.0}', '{"x": 1E5}', '{"x": 1e-400}', '{"x": 1e400}',
    '{"x": NaN, "y": Infinity, "z": -Infinity}', '{"x": "\\ud800"}', '{"x": "\\ud83d\\ude00 \\u00e9 é"}',
    '{"a": 1, "a": 2}', '{"a": [1, 2.5, null, true, false, {"b": []}]}', '{"t": "1234567890123456789 in text"}',
    '{"x": 0.1234567890123456789}', '[' * 300 + ']' * 300, '"just a string"', '3', 'null',
]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_lines_read_as_json_loads_reads_them(text):
    assert _same(_decode(text), json.loads(text))


def test_random_numbers_read_as_json_loads_reads_them():
    """Floats printed by repr, decimal strings of up to 25 digits with exponents near a double's limits, and
    integers of every width: the same value and type, bit for bit."""
    rng = np.random.default_rng(0)
    doubles = rng.standard_normal(3000) * 10.0 ** rng.integers(-300, 300, 3000)
    texts = [repr(float(x)) for x in doubles]
    for _ in range(3000):
        digits = "".join(str(d) for d in rng.integers(0, 10, int(rng.integers(1, 26))))
        texts.append(f"{'-' if rng.random() < 0.5 else ''}{digits[0]}.{digits[1:] or '0'}e{int(rng.integers(-330, 310))}")
        texts.append(("-" if rng.random() < 0.5 else "") + str(int(rng.integers(1, 10))) + digits)  # whole numbers
    for text in texts:
        line = '{"v": ' + text + ', "w": [' + text + "]}"
        assert _same(_decode(line), json.loads(line)), text


@pytest.mark.parametrize("text", ['{"x": }', '{"x": 1', '{"x": 1}}', '', '{"x": "a\tb"}', "{'x': 1}",
                                  '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"])
def test_bad_lines_give_json_s_errors_with_their_line(text):
    with pytest.raises(SamplesError) as err:
        _decode(text)
    message = str(err.value)
    assert message.startswith("f.jsonl:1: invalid JSON (")
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        assert message == f"f.jsonl:1: invalid JSON ({exc.msg} at column {exc.colno})"
    except RecursionError:
        assert message == "f.jsonl:1: invalid JSON (nested too deeply)"


def test_a_file_reads_as_json_loads_reads_it_line_by_line(tmp_path):
    lines = TRICKY[:-3] + ['{"prompt_id": "q", "completion": "' + "x" * 100_000 + '"}']
    path = tmp_path / "rows.jsonl"
    path.write_text("\ufeff" + "\n".join(lines) + "\n\n", encoding="utf-8")  # a byte-order mark, a blank line
    rows = list(rows_jsonl(path))
    assert [n for n, _ in rows] == list(range(1, len(lines) + 1))
    assert all(_same(value, json.loads(text)) for (_, value), text in zip(rows, lines))


def test_ordinary_lines_are_read_by_orjson(monkeypatch):
    """The fast path is taken: an ordinary row never reaches json.loads (a row with a 19-digit run does)."""
    from calibrl.evaluation.readers import base

    calls = []
    monkeypatch.setattr(base.json, "loads", lambda text: calls.append(text) or json.JSONDecoder().decode(text))
    assert _decode('{"prompt_id": "q1", "correct": true, "logprob_mean": -0.25, "answer": "12"}')["answer"] == "12"
    assert calls == []
    assert _decode('{"prompt_id": 1234567890123456789012}')["prompt_id"] == 1234567890123456789012
    assert len(calls) == 1


def test_lines_after_the_first_are_checked_as_the_first_is(tmp_path):
    """Past the first line orjson reads a line straight from its bytes; a line it refuses still gets the careful
    reading: a line of Unicode white space alone (U+3000, a form feed) is skipped as blank, a bad byte and bad JSON
    are errors naming their line and column, as on the first line."""
    path = tmp_path / "rows.jsonl"
    path.write_bytes('{"a": 1}\n\u3000 \x0c\n{"a": 2}\n'.encode("utf-8"))
    assert [(n, v) for n, v in rows_jsonl(path)] == [(1, {"a": 1}), (3, {"a": 2})]
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": "caf\xe9"}\n')
    with pytest.raises(SamplesError, match=r"^rows\.jsonl:3: not UTF-8 text \(byte 0xe9 at column 11\)$"):
        list(rows_jsonl(path))
    path.write_bytes(b'{"a": 1}\n\n{"a": 2,}\n')
    with pytest.raises(SamplesError) as err:
        list(rows_jsonl(path))
    try:
        json.loads('{"a": 2,}')
    except json.JSONDecodeError as exc:
        assert str(err.value) == f"rows.jsonl:3: invalid JSON ({exc.msg} at column {exc.colno})"
