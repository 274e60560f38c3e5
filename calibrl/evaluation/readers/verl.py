"""verl validation dumps: ``<trainer.validation_data_dir>/<step>.jsonl``, written by
``RayPPOTrainer._dump_generations`` (verl 0.9.1).

One line per sampled response: ``input`` (the decoded prompt), ``output`` (the decoded response), ``gts`` (the
ground truth), ``score`` (the summed reward), ``step``, and every reward extra-info key with one value per row
(verl adds ``reward``; math_dapo-style scorers add ``acc`` and ``pred``; calibrl.verl adds ``logprob_mean``; a
``self_certainty`` key, where a worker adds one, is read as INTUITOR's self-certainty).

Responses of one input at one step form a group: the prompt id is ``<step>:<hash of input>``. ``correct`` is
``acc`` when present, else ``score > 0.5``; ``answer`` is ``pred`` when present, else the last ``\\boxed{}``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from calibrl.evaluation.readers.base import as_float, fail, need_fields, need_object, prompt_key, rows_jsonl

REQUIRED = ("input", "output", "score")


def files(path: Path) -> list[Path]:
    """``path`` itself, or a folder's ``*.jsonl`` in step order (``2.jsonl`` before ``10.jsonl``)."""
    if path.is_file():
        return [path]

    def order(file: Path) -> tuple[int, str]:
        return (int(file.stem), "") if re.fullmatch(r"\d+", file.stem) else (1 << 62, file.name)

    return sorted(path.glob("*.jsonl"), key=order)


def _correct(raw: dict, where: str, score: float) -> bool:
    """``acc`` (bool or number > 0.5) when the scorer reported it, else ``score > 0.5``."""
    acc = raw.get("acc")
    if acc is None:
        return score > 0.5
    if isinstance(acc, bool):
        return acc
    if isinstance(acc, str) and acc in ("True", "False"):  # verl writes unknown types with str()
        return acc == "True"
    return as_float(acc, where, "acc") > 0.5


def read(path: Path, notes: list[str]) -> Iterator[tuple[str, dict]]:
    """calibrl rows of a verl validation dump or a folder of them."""
    from calibrl.tasks.rewards import last_boxed

    for file in files(path):
        for lineno, raw in rows_jsonl(file):
            where = f"{file.name}:{lineno}"
            need_object(raw, where)
            need_fields(raw, REQUIRED, where, what="a verl validation dump")
            output = raw["output"]
            if not isinstance(output, str):
                raise fail(where, "output", f"expected a string, got {type(output).__name__} {output!r}")
            score = as_float(raw["score"], where, "score")
            pred = raw.get("pred")
            row: dict[str, Any] = {
                "prompt_id": prompt_key(raw.get("step", 0), raw["input"]),
                "completion": output,
                "reward": score,
                "correct": _correct(raw, where, score),
                "answer": pred if isinstance(pred, str) and pred else last_boxed(output),
            }
            for name in ("logprob_mean", "self_certainty"):
                if name in raw:
                    row[name] = raw[name]
            yield where, row

