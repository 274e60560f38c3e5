"""Readers that turn other tools' output files into calibrl sample rows, for :func:`calibrl.evaluation.samples.
load_samples` to validate.

Each reader yields ``(where, row)``: ``where`` is ``file:line`` (the 1-based row for Parquet) of the source line,
``row`` a dict in calibrl's samples schema (``prompt_id``, ``correct`` / ``reward``, ``logprob_mean``, ...).
Errors in the source format raise :class:`SamplesError` naming the file, line and the source's field.

Formats (``FORMATS``) and the fields that identify each when no format is given (:func:`detect_format` reads the
first row; a folder is identified by its first file):

- ``calibrl``: ``prompt_id`` with ``correct``, ``reward`` or ``class_probs`` (checked first; a row with
  ``prompt_id`` matching no other format is read as calibrl too, so its missing field is named);
- ``trl``: ``step``, ``prompt``, ``completion`` (TRL's completions Parquet logs; a file or a folder of them);
- ``verl``: ``input``, ``output``, ``score`` (verl validation dumps; a file or a folder of them);
- ``openai``: ``choices``, or ``custom_id`` with ``response`` (API responses, Batch API output);
- ``vllm``: ``outputs`` (serialised ``RequestOutput``);
- ``lm-eval``: ``doc_id``, ``target``, ``resps`` (lm-evaluation-harness ``--log_samples``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Iterator

from calibrl.evaluation.readers import lm_eval, openai, trl, verl, vllm
from calibrl.evaluation.readers.base import (GRADERS, PARQUET_SUFFIXES, Grading, SamplesError, Skips, answers_table,
                                             file_rows, need_object)

__all__ = ["FORMATS", "GRADERS", "SIGNATURES", "Grading", "SamplesError", "Skips", "answers_table", "detect_format", "read_rows", "source_files",
           "step_files"]

FORMATS = ("calibrl", "trl", "verl", "vllm", "openai", "lm-eval")

# the fields that identify each format, as shown in errors
SIGNATURES = {
    "calibrl": "prompt_id with correct, reward or class_probs",
    "trl": "step, prompt, completion (Parquet)",
    "verl": "input, output, score",
    "vllm": "outputs (a list of {text, token_ids, cumulative_logprob})",
    "openai": "choices, or custom_id with response",
    "lm-eval": "doc_id, target, resps",
}


def _matches(fmt: str, keys: set[str]) -> bool:
    """Whether a first row with these keys has the identifying fields of ``fmt``."""
    if fmt == "calibrl":
        return "prompt_id" in keys and bool(keys & {"correct", "reward", "class_probs"})
    if fmt == "trl":
        return {"step", "prompt", "completion"} <= keys
    if fmt == "verl":
        return {"input", "output", "score"} <= keys
    if fmt == "vllm":
        return "outputs" in keys
    if fmt == "openai":
        return "choices" in keys or {"custom_id", "response"} <= keys
    return {"doc_id", "target", "resps"} <= keys


def source_files(path: Path, fmt: str | None) -> list[Path]:
    """The files ``path`` stands for: itself, or for a folder (TRL and verl logs) the files that reader reads."""
    if path.is_file():
        return [path]
    if fmt == "trl":
        return trl.files(path)
    if fmt == "verl":
        return verl.files(path)
    if fmt is None:
        return trl.files(path) or verl.files(path)
    raise SamplesError(f"{path}: is a folder; only the trl and verl formats read folders (give a file)")


def step_files(path: Path, fmt: str) -> list[tuple[int, Path]]:
    """``(step, file)`` of a TRL or verl folder holding several training steps, in step order: the step is the
    number ending each file's name (verl's ``<step>.jsonl``, TRL's ``completions_<step>.parquet``). Empty when
    ``path`` is a file, the format reads no folders, the folder holds one step, or a file's name gives no step or
    the same step as another's (the files are then read as one input)."""
    if not path.is_dir() or fmt not in ("trl", "verl"):
        return []
    found = []
    for file in source_files(path, fmt):
        match = re.search(r"(\d+)$", file.stem)
        if match is None:
            return []
        found.append((int(match.group(1)), file))
    steps = [step for step, _ in found]
    if len(set(steps)) != len(steps) or len(steps) < 2:
        return []
    return sorted(found, key=lambda item: item[0])


def detect_format(path: Path) -> str:
    """The format of ``path`` from the fields of its first row (of its first file, for a folder)."""
    files = source_files(path, None)
    if not files:
        raise SamplesError(f"{path}: the folder holds no .parquet or .jsonl file")
    first = next(iter(file_rows(files[0])), None)
    if first is None:
        raise SamplesError(f"{files[0].name}: no samples (the file is empty)")
    lineno, row = first
    keys = set(need_object(row, f"{files[0].name}:{lineno}"))
    for fmt in FORMATS:
        if _matches(fmt, keys) and (fmt != "trl" or files[0].suffix.lower() in PARQUET_SUFFIXES):
            return fmt
    if "prompt_id" in keys:  # a calibrl row missing its outcome: the validator names the missing field
        return "calibrl"
    listing = "; ".join(f"{fmt}: {fields}" for fmt, fields in SIGNATURES.items())
    shown = ", ".join(sorted(keys)[:12]) + (", ..." if len(keys) > 12 else "")
    raise SamplesError(f"{files[0].name}:{lineno}: cannot tell the file's format from its fields ({shown or 'none'}); "
                       f"give the format ({', '.join(FORMATS)}); each needs: {listing}")


def _calibrl(path: Path, notes: list[str]) -> Iterator[tuple[str, Any]]:
    """calibrl's own rows, as they are (``load_samples`` validates them)."""
    name = path.name
    for lineno, raw in file_rows(path):
        yield f"{name}:{lineno}", raw


_READERS: dict[str, Callable[[Path, list[str]], Iterator[tuple[str, Any]]]] = {
    "calibrl": _calibrl, "trl": trl.read, "verl": verl.read, "vllm": vllm.read, "openai": openai.read,
    "lm-eval": lm_eval.read,
}


def read_rows(path: Path, fmt: str, notes: list[str], skips: Skips | None = None,
              grading: Grading | None = None) -> Iterator[tuple[str, Any]]:
    """``(file:line, calibrl row)`` of ``path`` read as ``fmt``; remarks on how it was read go to ``notes``; rows
    of failed requests or rewards (TRL, OpenAI-style, vLLM) are left out and counted in ``skips`` (None: refused);
    ``grading``: how files without correctness (OpenAI-style, vLLM) are graded (None: the boxed grader)."""
    if fmt not in _READERS:
        raise SamplesError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if path.is_dir() and fmt not in ("trl", "verl"):
        source_files(path, fmt)  # raises: only the trl and verl formats read folders
    if path.is_dir() and not source_files(path, fmt):
        raise SamplesError(f"{path}: the folder holds no {'.parquet' if fmt == 'trl' else '.jsonl'} file")
    skips = skips if skips is not None else Skips(strict=True)
    if fmt in ("openai", "vllm"):
        return _READERS[fmt](path, notes, skips, grading)
    if fmt == "trl":
        return _READERS[fmt](path, notes, skips)
    return _READERS[fmt](path, notes)
