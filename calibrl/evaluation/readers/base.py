"""What every reader shares: the error type, raw JSONL / Parquet rows, field access with ``file:line`` errors, and
the conversions several formats need (prompt text -> prompt id, grading a completion against a gold answer)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import orjson

__all__ = ["MAX_ROW_BYTES", "SamplesError", "rows_jsonl", "rows_parquet", "file_rows", "fail", "too_large",
           "prompt_text", "prompt_key", "as_float", "grade", "find_gold", "need_object", "Skips",
           "GRADERS", "Grading", "answers_table", "hit_token_limit"]

PARQUET_SUFFIXES = (".parquet", ".pq")
# the largest row read: a JSONL line's bytes, or the text bytes of a Parquet row (its strings, nested ones too).
# A row is held a few times over while it is decoded (bytes, text, parsed value, its digest's UTF-8), so the limit
# bounds that cost to a few hundred MiB; a reasoning trace of 16k tokens is about 64 KiB.
MAX_ROW_BYTES = 64 * 2**20


class SamplesError(ValueError):
    """A samples file is unreadable or a row is invalid; the message starts with ``file:line``."""


class Skips:
    """Rows of a run that failed on them, left out and counted by cause (``strict``: refused instead).

    A *failed* row is one the tool wrote for a request or reward that did not succeed: a null / NaN reward (TRL
    writes a reward function's None as NaN), an API request with an ``error`` object or a status other than 200, a
    response with no choices, a choice without text. A *malformed* row (wrong types, unparsable JSON, a missing
    field the format always has) is always refused.
    """

    def __init__(self, *, strict: bool = False):
        self.strict = strict
        self.counts: dict[str, int] = {}
        self.first: SamplesError | None = None  # the first row's error (named when every row failed)

    def skip(self, error: SamplesError, cause: str, n: int = 1) -> None:
        """Count ``n`` rows left out for ``cause``; with ``strict``, raise ``error`` instead."""
        if self.strict:
            raise error
        self.counts[cause] = self.counts.get(cause, 0) + n
        self.first = self.first or error

    def note(self, name: str) -> list[str]:
        """The notes saying what was left out of file ``name`` (none when nothing was)."""
        if not self.counts:
            return []
        causes = ", ".join(f"{n} {cause}" for cause, n in self.counts.items())
        return [f"{name}: {sum(self.counts.values())} failed rows left out ({causes}); --strict refuses them"]


def fail(where: str, name: str, problem: str) -> SamplesError:
    """The error for field ``name`` of the row at ``where`` (``file:line``)."""
    return SamplesError(f"{where}: field '{name}': {problem}")


# each byte of a line kept as "0" where it is a digit and a space otherwise, to find a run of 19 digits
_DIGIT_RUNS = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_NINETEEN_DIGITS = b"0" * 19


_UNREAD = object()  # what _orjson_value gives for a line that json.loads is to read


def _orjson_value(data: bytes) -> Any:
    """orjson's value of a line's bytes, or ``_UNREAD`` where orjson refuses them (malformed, NaN, bad UTF-8, ...)
    or could read them otherwise than ``json.loads`` (a run of 19 digits: :func:`_decode_json`)."""
    if _NINETEEN_DIGITS in data.translate(_DIGIT_RUNS):
        return _UNREAD
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _UNREAD


def _decode_json(data: bytes, line: str, where: Callable[[], str]) -> Any:
    """One JSON value of a line, given as its bytes ``data`` and its text ``line``; malformed, too deeply nested or
    over-long-integer text is a SamplesError naming ``where()`` (``file:line``), not a crash.

    orjson reads it (5x faster than ``json.loads``: a million short rows in 0.4 s against 1.9-2.1 s, measured on
    2026-11-30). ``json.loads`` reads what orjson refuses: it reads NaN and Infinity, numbers beyond a double's range
    and lone surrogate escapes, and its errors (malformed text, nesting past Python's recursion limit) are the ones
    reported; and it reads any line with a run of 19 digits, where orjson would read an integer beyond 64 bits as a
    float and ``json.loads`` keeps it whole. Both read the same values otherwise (floats correctly rounded,
    duplicate keys the last one; tests/test_json_lines.py)."""
    value = _orjson_value(data)
    if value is not _UNREAD:
        return value
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise SamplesError(f"{where()}: invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise SamplesError(f"{where()}: invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer longer than Python's int digit limit
        raise SamplesError(f"{where()}: invalid JSON ({exc})") from None


def too_large(where: str, size: int | None = None) -> SamplesError:
    """The error for a row larger than :data:`MAX_ROW_BYTES` (``size``: its bytes of text, when known)."""
    held = f"{size / 2**20:.1f} MiB of text" if size is not None else f"more than {MAX_ROW_BYTES / 2**20:g} MiB"
    return SamplesError(f"{where}: the row is too large ({held}); rows of up to {MAX_ROW_BYTES / 2**20:g} MiB are "
                        "read (a completion of a million tokens is about 4 MiB)")


def rows_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """JSON Lines rows as ``(line number, value)``. Lines are decoded one by one (so a bad byte is reported on its
    line); a leading UTF-8 byte-order mark is accepted; a gzip file or a JSON array gets an error saying so; a line
    longer than :data:`MAX_ROW_BYTES` is refused before it is read whole (its first MAX_ROW_BYTES bytes are the most
    held)."""
    try:
        handle = path.open("rb", buffering=2**20)  # long lines are read in few pieces
    except OSError as exc:
        raise SamplesError(f"{path}: cannot open ({exc.strerror or exc})") from None
    with handle:
        first = True
        lineno = 0
        while data := handle.readline(MAX_ROW_BYTES + 1):
            lineno += 1
            if not first and len(data) <= MAX_ROW_BYTES:
                # the usual line, once the first one is read, goes straight to orjson, which checks its UTF-8 as
                # strictly as the decoding below; a line it leaves (a blank one, say) takes the careful path below,
                # which names what is wrong (a fifth of this loop's time saved on short rows)
                value = _orjson_value(data)
                if value is not _UNREAD:
                    del data
                    yield lineno, value
                    continue
            if lineno == 1 and data.startswith(b"\x1f\x8b"):
                raise SamplesError(f"{path.name}:1: not UTF-8 text (the file is gzip-compressed; decompress it first)")
            if len(data) > MAX_ROW_BYTES and not (len(data) == MAX_ROW_BYTES + 1 and data.endswith(b"\n")):
                raise too_large(f"{path.name}:{lineno}")
            try:
                line = data.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise SamplesError(f"{path.name}:{lineno}: not UTF-8 text (byte {data[exc.start]:#04x} at column "
                                   f"{exc.start + 1})") from None
            if not line.strip():
                continue
            if first and line.lstrip().startswith("["):
                raise SamplesError(f"{path.name}:{lineno}: the file is a JSON array; JSON Lines is expected (one "
                                   "object per line, no enclosing [ ])")
            first = False
            value = _decode_json(data, line, lambda: f"{path.name}:{lineno}")
            del data, line
            yield lineno, value


def _text_bytes(values) -> np.ndarray:
    """[len(values)] int64: the bytes of the strings and binaries each Arrow value holds (lists and structs summed
    over their children; other types count 8 bytes a value, null strings 0)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = values.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or \
            pa.types.is_large_binary(kind):
        return pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_floating(kind.value_type):
        # numbers only (token_confidence): 8 bytes a value, from the lists' lengths without flattening them
        return pc.list_value_length(values).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64) * 8
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        parents = pc.list_parent_indices(values).to_numpy(zero_copy_only=False)
        sizes = _text_bytes(values.flatten())
        return np.bincount(parents, weights=sizes, minlength=len(values)).astype(np.int64)
    if pa.types.is_struct(kind):
        total = np.zeros(len(values), dtype=np.int64)
        for child in values.flatten():
            total += _text_bytes(child)
        return total
    return np.full(len(values), 8, dtype=np.int64)


_PARQUET_BATCH_ROWS = 4096
_PARQUET_CHUNK_BYTES = 16 * 2**20  # rows are turned into Python objects at most this many text bytes at a time


ARRAY_COLUMNS = ("token_confidence",)  # lists of numbers handed over as numpy arrays, not Python lists


def _pylist_with_arrays(batch) -> tuple[list[dict], dict[str, list]]:
    """``batch.to_pylist()``, but the :data:`ARRAY_COLUMNS` that are lists of floats come as one numpy view per
    row (None for a null row) of their flattened values: a 16k-token float16 list is one slice, not 16k floats."""
    import pyarrow as pa

    arrays = {}
    for name in ARRAY_COLUMNS:
        index = batch.schema.get_field_index(name)
        if index < 0:
            continue
        column = batch.column(index)
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or \
                not pa.types.is_floating(column.type.value_type) or column.values.null_count:
            continue  # nulls inside a list: the Python list keeps them (a row's validation names them)
        offsets = column.offsets.to_numpy()  # [rows + 1] into the unsliced values: only this slice's are read
        flat = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_numpy(zero_copy_only=False)
        offsets = offsets - offsets[0]
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        arrays[name] = [flat[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(column))]
        batch = batch.drop_columns([name])
    return batch.to_pylist(), arrays


_PARQUET_BATCH_BYTES = 16 * 2**20  # the uncompressed bytes of the rows read per batch, at most (one row at least)


def _batch_rows(metadata) -> int:
    """Rows per Parquet batch: :data:`_PARQUET_BATCH_ROWS`, fewer for wide rows (long token_confidence lists) so a
    batch holds about :data:`_PARQUET_BATCH_BYTES` (pyarrow's decoding of a batch takes several times its size:
    8,000 rows of 16,384 float16 values peaked at 900 MB in batches of 4,096 rows, 380 MB in batches of 256)."""
    if metadata.num_row_groups == 0 or metadata.row_group(0).num_rows == 0:
        return _PARQUET_BATCH_ROWS
    group = metadata.row_group(0)
    per_row = max(1, group.total_byte_size // group.num_rows)
    return int(max(1, min(_PARQUET_BATCH_ROWS, _PARQUET_BATCH_BYTES // per_row)))


def rows_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    """Parquet rows as ``(1-based row number, dict)``, read a batch at a time and turned into Python objects
    a few MiB of text at a time; a row holding more than :data:`MAX_ROW_BYTES` of text is refused."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        batches = parquet.iter_batches(batch_size=_batch_rows(parquet.metadata))
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise SamplesError(f"{path.name}: cannot read Parquet ({exc})") from None
    start = 1
    while True:
        try:
            batch = next(batches, None)
        except Exception as exc:
            raise SamplesError(f"{path.name}: cannot read Parquet ({exc})") from None
        if batch is None:
            return
        sizes = np.zeros(batch.num_rows, dtype=np.int64)  # [rows] text bytes of each row
        for column in batch.columns:
            sizes += _text_bytes(column)
        big = np.flatnonzero(sizes > MAX_ROW_BYTES)
        # rows up to the first oversized one are read; that one is refused
        stop = int(big[0]) if big.size else batch.num_rows
        ends = np.cumsum(sizes[:stop])
        lo = 0
        while lo < stop:
            # the rows [lo, hi): at least one, at most _PARQUET_CHUNK_BYTES of text
            hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + _PARQUET_CHUNK_BYTES,
                                                 side="right")))
            hi = min(hi, stop)
            rows, arrays = _pylist_with_arrays(batch.slice(lo, hi - lo))
            for offset, row in enumerate(rows):
                for name, values in arrays.items():
                    row[name] = values[offset]
                yield start + lo + offset, row
            lo = hi
        if big.size:
            raise too_large(f"{path.name}:{start + stop}", int(sizes[stop]))
        start += batch.num_rows


def file_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """The rows of one file, by its suffix: Parquet, else JSON Lines."""
    return rows_parquet(path) if path.suffix.lower() in PARQUET_SUFFIXES else rows_jsonl(path)


def as_float(value: Any, where: str, name: str) -> float:
    """A finite float from a number or a numeric string (some tools write numbers as text)."""
    if value is None:
        raise fail(where, name, "missing")
    if isinstance(value, bool):
        raise fail(where, name, f"expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise fail(where, name, f"expected a number, got {type(value).__name__} {value!r}") from None
    except OverflowError:
        raise fail(where, name, "out of range: the number is too large") from None
    if not math.isfinite(number):
        raise fail(where, name, f"must be finite, got {number}")
    return number


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a multimodal content list."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else str(content)


def prompt_text(prompt: Any) -> str:
    """A prompt as one text: a string as is; a conversation (list of ``{"role", "content"}``) as ``role: content``
    lines, so two conversations differing in any message are different prompts."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        return "\n".join(f"{m.get('role', '')}: {_content_text(m.get('content'))}" if isinstance(m, dict)
                         else str(m) for m in prompt)
    return json.dumps(prompt, sort_keys=True, default=str)


def prompt_key(step: Any, prompt: Any) -> str:
    """A short stable prompt id from a training step and the prompt: ``<step>:<16 hex digits of its SHA-1>``."""
    digest = hashlib.sha1(prompt_text(prompt).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{step}:{digest}"


def grade(text: str, gold: dict[str, Any]) -> tuple[str | None, bool]:
    r"""``(answer, correct)`` of a completion graded with calibrl's rewards: with ``classes`` and ``label`` the
    decision (last standalone class string) against the label's class; else the last ``\boxed{}`` against
    ``gold`` with math-verify."""
    from calibrl.tasks.rewards import check_math, extract_decision, label_to_class

    if gold.get("classes") is not None:
        answer, _ = extract_decision(text, gold["classes"])
        return answer, answer is not None and answer == label_to_class(gold["label"], gold["classes"])
    return check_math(text, gold["gold"])


GRADERS = ("boxed", "math-verify")


def _extract(text: str, grader: str) -> str | None:
    r"""The final answer of a math completion: ``boxed``, the last ``oxed{}`` content; ``math-verify``, what
    math-verify's ``parse`` finds in the whole completion (LaTeX or a plain expression, after anchors such as "the
    answer is"; its string form), as TRL's ``accuracy_reward`` parses completions. None: no parsable answer."""
    from calibrl.tasks.rewards import last_boxed

    if grader == "boxed":
        return last_boxed(text)
    from math_verify import parse

    parsed = parse(text)
    return str(parsed[1]) if len(parsed) > 1 and str(parsed[1]).strip() else None


class Grading:
    """How completions of files without a correctness field (API responses, vLLM outputs) are graded: the math
    ``grader`` (one of :data:`GRADERS`; the answer found is compared to the gold with
    :func:`calibrl.tasks.rewards.math_equal`), and ``answers`` (prompt id / ``custom_id`` -> gold, from
    ``--answers``) used for the lines that carry no gold of their own. Counts the completions graded and those
    with no parsable answer, for the report."""

    def __init__(self, *, grader: str = "boxed", answers: dict[str, dict[str, Any]] | None = None,
                 source: str | None = None):
        if grader not in GRADERS:
            raise SamplesError(f"unknown grader {grader!r}; choose one of {', '.join(GRADERS)}")
        self.grader, self.answers, self.source = grader, answers, source
        self.n_graded = self.n_unparsed = 0

    def gold(self, places: list[Any], keys: list[Any], where: str) -> dict[str, Any]:
        """The line's own gold (see :func:`find_gold`), else the ``answers`` entry of the first of ``keys``."""
        try:
            return find_gold(places, where)
        except SamplesError:
            if self.answers is None:
                raise
        for key in keys:
            if key is not None and str(key) in self.answers:
                return self.answers[str(key)]
        shown = ", ".join(repr(str(k)) for k in keys if k is not None) or "none"
        raise fail(where, "gold", f"missing: the line has no gold and its ids ({shown}) are not in --answers "
                                  f"{self.source}")

    def grade(self, text: str, gold: dict[str, Any]) -> tuple[str | None, bool]:
        """``(answer, correct)`` of one completion (see :func:`grade`), counted."""
        self.n_graded += 1
        if gold.get("classes") is not None or self.grader == "boxed":
            answer, correct = grade(text, gold)
        else:
            from calibrl.tasks.rewards import math_equal

            answer = _extract(text, self.grader)
            correct = answer is not None and math_equal(answer, gold["gold"])
        self.n_unparsed += answer is None
        return answer, correct

    def note(self, name: str) -> list[str]:
        """The note saying how ``name``'s completions were graded."""
        if not self.n_graded:
            return []
        how = ("the last \\boxed{} of each completion" if self.grader == "boxed" else
               "math-verify's parse of the whole completion")
        given = f"; gold answers from --answers {self.source} where a line has none" if self.answers else ""
        return [f"{name}: graded with the {self.grader} grader ({how}, compared to the gold with math-verify; "
                f"decision tasks: the last class string){given}; {self.n_unparsed} of {self.n_graded} completions "
                "had no parsable answer"]


def answers_table(rows: list[dict], source: str) -> dict[str, dict[str, Any]]:
    """``{id: gold}`` from dataset rows: the id is ``prompt_id`` (else ``custom_id``, ``id``, ``unique_id``), the gold
    ``answer`` / ``gold``, or ``label`` with ``classes`` (as :func:`find_gold` reads a line)."""
    table: dict[str, dict[str, Any]] = {}
    for number, row in enumerate(rows, start=1):
        where = f"{source}:{number}"
        row = need_object(row, where)
        key = next((row[k] for k in ("prompt_id", "custom_id", "id", "unique_id") if row.get(k) is not None), None)
        if key is None:
            raise fail(where, "prompt_id", "missing (an answers row needs prompt_id, custom_id, id or unique_id)")
        table[str(key)] = find_gold([row], where)
    if not table:
        raise SamplesError(f"{source}: no answers (the file is empty)")
    return table


def find_gold(places: list[Any], where: str) -> dict[str, Any]:
    """The gold of a row of a file that has none of its own (API responses): the first of ``places`` (dicts: the
    row, its ``metadata``, ...) holding ``label`` with ``classes`` (decision task) or ``gold`` / ``answer``."""
    for place in places:
        if not isinstance(place, dict):
            continue
        if place.get("classes") is not None and place.get("label") is not None:
            classes = place["classes"]
            if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
                raise fail(where, "classes", f"expected a list of strings, got {classes!r}")
            return {"classes": classes, "label": place["label"]}
        for name in ("gold", "answer"):
            if place.get(name) is not None:
                return {"gold": place[name]}
    raise fail(where, "gold", "missing (the file has no gold answer: add 'gold' (or 'answer') to each line or to "
                              "its 'metadata', or 'label' with 'classes' for a decision task)")


def hit_token_limit(item: dict) -> bool | None:
    """Whether an API choice or vLLM output stopped at the token limit (``finish_reason`` "length"), for the
    ``truncated`` field; None when it does not say."""
    reason = item.get("finish_reason")
    return None if reason is None else reason == "length"


def need_object(raw: Any, where: str) -> dict:
    """``raw`` when it is a JSON object (a dict), else the error saying one object per line is expected."""
    if not isinstance(raw, dict):
        raise SamplesError(f"{where}: expected a JSON object per line, got {type(raw).__name__}")
    return raw


def need_fields(raw: dict, names: tuple[str, ...], where: str, *, what: str) -> None:
    """Raise, naming the first of ``names`` that ``raw`` lacks (or holds null) and what ``what`` (e.g. "a verl
    validation dump") always has."""
    for name in names:
        if raw.get(name) is None:
            raise fail(where, name, f"missing ({what} has {', '.join(names)})")
