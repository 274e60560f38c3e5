"""TRL completions logs: ``<output_dir>/completions/completions_<step>.parquet``, written by ``GRPOTrainer.log``
(TRL 1.16) when ``log_completions=True``.

Columns, in order: ``step``, ``prompt`` (text, or a conversation: list of ``{"role", "content"}``),
``completion``, one float column per reward function (named after it), the extra columns, ``advantage``.
calibrl's trainer adds the extra columns ``logprob_mean`` (float; NaN where unknown), ``correct`` (bool, by the
correctness reward) and, on decision tasks, ``decision_prob`` (float or null); a ``self_certainty`` column (float;
NaN where unknown: INTUITOR's self-certainty) is read as well where a log has one.

Completions of one prompt at one step form a group: the prompt id is ``<step>:<hash of the prompt's text>``.
``correct`` comes from the ``correct`` column, else from the first reward column (> 0.5), which is noted.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterator

from calibrl.evaluation.readers.base import Skips, as_float, fail, need_fields, prompt_key, rows_parquet

REQUIRED = ("step", "prompt", "completion")
_CALIBRL_EXTRAS = ("logprob_mean", "correct", "decision_prob", "self_certainty")


def files(path: Path) -> list[Path]:
    """The Parquet files of ``path``: itself, or a folder's ``completions_*.parquet`` (else any ``*.parquet``) in
    name order (the step is zero-padded, so name order is step order)."""
    if path.is_file():
        return [path]
    found = sorted(path.glob("completions_*.parquet")) or sorted(path.glob("*.parquet"))
    return found


def _reward_columns(row: dict) -> list[str]:
    """The reward functions' columns: the numeric columns after ``completion`` up to the first extra column
    calibrl adds or ``advantage`` (TRL writes them in that order)."""
    names = list(row)
    start = names.index("completion") + 1 if "completion" in names else len(names)
    out = []
    for name in names[start:]:
        if name in _CALIBRL_EXTRAS or name == "advantage":
            break
        value = row[name]
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            out.append(name)
        else:
            break
    return out


def _nan_to_none(value: Any) -> Any:
    """NaN (TRL's "not known") as a missing value."""
    return None if isinstance(value, float) and math.isnan(value) else value


def read(path: Path, notes: list[str], skips: Skips | None = None) -> Iterator[tuple[str, dict]]:
    """calibrl rows of a TRL completions Parquet file or folder of them; a row whose reward is null / NaN (the
    reward function returned None) is left out and counted in ``skips`` (None: refused)."""
    skips = skips if skips is not None else Skips(strict=True)
    from calibrl.tasks.rewards import completion_text, last_boxed

    noted = False
    for file in files(path):
        for lineno, raw in rows_parquet(file):
            where = f"{file.name}:{lineno}"
            need_fields(raw, REQUIRED, where, what="a TRL completions log")
            text = completion_text(raw["completion"])
            row: dict[str, Any] = {"prompt_id": prompt_key(raw["step"], raw["prompt"]), "completion": text}
            for name in ("logprob_mean", "decision_prob", "self_certainty"):
                if name in raw:
                    row[name] = _nan_to_none(raw[name])
            if raw.get("correct") is not None:
                row["correct"] = raw["correct"]
            else:
                rewards = _reward_columns(raw)
                if not rewards:
                    raise fail(where, "correct", "missing (no 'correct' column and no reward column after "
                                                 "'completion' to read correctness from)")
                if _nan_to_none(raw[rewards[0]]) is None:
                    skips.skip(fail(where, rewards[0], "missing"), f"null reward '{rewards[0]}'")
                    continue
                row["reward"] = as_float(raw[rewards[0]], where, rewards[0])
                if not noted:
                    notes.append(f"{file.name}: no 'correct' column; correct = reward '{rewards[0]}' > 0.5")
                    noted = True
            if "decision_prob" not in raw:
                row["answer"] = last_boxed(text)
            yield where, row
    notes.extend(skips.note(path.name))
