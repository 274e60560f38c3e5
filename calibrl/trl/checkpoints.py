"""Which ``checkpoint-N`` folder ``--resume`` continues from: the newest COMPLETE one.

transformers 5 writes a checkpoint in place, in this order: the weights (``model.safetensors``, sharded
``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``, or ``adapter_model.safetensors`` for
LoRA) with ``config.json``; ``optimizer.pt``, ``scheduler.pt`` (and ``scaler.pt``); ``rng_state.pth`` (one
``rng_state_<rank>.pth`` per process when distributed); ``trainer_state.json`` last. calibrl writes its own file
(``calibrl_capo_mask.json``) before all of them. A run killed while saving leaves a folder without
``trainer_state.json`` or with a file cut short, which ``Trainer.train(resume_from_checkpoint=...)`` fails on
with a traceback (or, for a missing ``optimizer.pt``, silently restarts the optimizer).

A checkpoint is complete when ``trainer_state.json`` reads as JSON with a ``global_step``, it holds model or
adapter weights, and every file that resuming reads is whole: JSON files parse, ``.safetensors`` files have their
header and exactly the bytes it promises (and an index's shards are there), ``.pt`` / ``.pth`` / ``.bin`` files
(``torch.save``'s zip format) have their closing central directory. Nothing is loaded into memory but headers.

API: :func:`checkpoint_problem`, :func:`last_complete_checkpoint`, :func:`inside_generation_block`.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path

__all__ = ["checkpoint_problem", "inside_generation_block", "last_complete_checkpoint"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin",
            "pytorch_model.bin.index.json", "adapter_model.bin")
_READ_ON_RESUME = re.compile(r".*\.(safetensors|pt|pth|bin)$|config\.json$|.*\.index\.json$|calibrl_.*\.json$")


def _json_problem(path: Path) -> str | None:
    try:
        json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path.name} does not read as JSON ({type(exc).__name__})"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """A ``.safetensors`` file: an 8-byte little-endian header length, the JSON header, then the tensors' bytes,
    which end at the largest ``data_offsets`` end; a file cut short (or padded) has another size."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            raw = handle.read(8)
            if len(raw) < 8:
                return f"{path.name} is cut short ({size} bytes)"
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > size - 8:
                return f"{path.name} is cut short ({size} bytes, its header alone needs {header_len + 8})"
            header = json.loads(handle.read(header_len))
    except (OSError, ValueError) as exc:
        return f"{path.name} has no readable header ({type(exc).__name__})"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if size != 8 + header_len + end:
        return f"{path.name} is cut short ({size} bytes of {8 + header_len + end})"
    return None


def _zip_problem(path: Path) -> str | None:
    """A ``torch.save`` file (zip format): whole when its central directory, written last, is there."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.namelist()
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        return f"{path.name} is not a whole torch.save file ({type(exc).__name__})"
    return None


def _file_problem(path: Path) -> str | None:
    if path.stat().st_size == 0:
        return f"{path.name} is empty"
    if path.suffix == ".json":
        return _json_problem(path)
    if path.suffix == ".safetensors":
        return _safetensors_problem(path)
    return _zip_problem(path)


def _index_problem(path: Path) -> str | None:
    """A sharded-weights index: each shard it names is in the folder."""
    weight_map = json.loads(path.read_text()).get("weight_map") or {}
    for shard in sorted(set(weight_map.values())):
        if not (path.parent / shard).is_file():
            return f"{shard} (named by {path.name}) is missing"
    return None


def checkpoint_problem(folder: str | Path) -> str | None:
    """Why the checkpoint folder ``folder`` cannot be resumed from (a short phrase naming the file), or None when it
    is complete (module docstring)."""
    folder = Path(folder)
    state = folder / TRAINER_STATE
    if not state.is_file():
        return f"no {TRAINER_STATE} (the save was cut off)"
    for path in sorted(folder.iterdir()):
        if path.is_file() and _READ_ON_RESUME.match(path.name):
            problem = _file_problem(path)
            if problem:
                return problem
    try:
        if "global_step" not in json.loads(state.read_text()):
            return f"{TRAINER_STATE} has no global_step"
    except (OSError, ValueError):
        return f"{TRAINER_STATE} does not read as JSON"
    if not any((folder / name).is_file() for name in _WEIGHTS) and not any(folder.glob("pytorch_model_fsdp*")):
        return "no model or adapter weights"
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / name).is_file():
            problem = _index_problem(folder / name)
            if problem:
                return problem
    return None


def last_complete_checkpoint(output_dir: str | Path) -> tuple[str | None, list[tuple[str, str]]]:
    """(the newest complete ``checkpoint-N`` folder in ``output_dir`` or None, [(newer folder, its problem), ...]
    for the incomplete ones newer than it, newest first)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None, []
    found = sorted(((int(m.group(1)), p) for p in output_dir.iterdir()
                    if (m := _CHECKPOINT.match(p.name)) and p.is_dir()), reverse=True)
    skipped: list[tuple[str, str]] = []
    for _, path in found:
        problem = checkpoint_problem(path)
        if problem is None:
            return str(path), skipped
        skipped.append((str(path), problem))
    return None, skipped


def inside_generation_block(step: int, *, gradient_accumulation_steps: int, steps_per_generation: int,
                            num_iterations: int) -> bool:
    """Whether optimizer step ``step`` ends inside one of TRL's generation blocks.

    TRL 1.16 generates completions once every ``steps_per_generation * num_iterations`` micro-batches and reuses
    them until then; the micro-batch counter and the reused completions are not in a checkpoint, so a run resumed
    from a step where ``step * gradient_accumulation_steps`` is not a multiple of that block generates afresh at
    once and is no longer bit-identical to the uninterrupted run (with TRL's defaults, ``steps_per_generation =
    gradient_accumulation_steps`` and ``num_iterations = 1``, every step ends a block)."""
    return (step * gradient_accumulation_steps) % (steps_per_generation * num_iterations) != 0
