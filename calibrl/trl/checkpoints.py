"""Which ``checkpoint-N`` folder ``--resume`` continues from: the newest COMPLETE one.

transformers 5 writes a checkpoint in place, in this order: the weights (``model.safetensors``, sharded
``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``, or ``adapter_model.safetensors`` for
LoRA) with ``config.json``; ``optimizer.pt``, ``scheduler.pt`` (and ``scaler.pt``); ``rng_state.pth`` (one
``rng_state_<rank>.pth`` per process when distributed); ``trainer_state.json`` last. calibrl writes its own file
(``calibrl_capo_mask.json``) before all of them. A run killed while saving leaves a folder without
``trainer_state.json`` or with a file cut short, which ``Trainer.train(resume_from_checkpoint=...)`` fails on
with a traceback (or, for a missing ``optimizer.pt``, silently restarts the optimizer).

A checkpoint is complete when ``trainer_state.json`` reads as JSON with an integer ``global_step`` equal to the
folder's number and a ``log_history`` that is a list of records, it holds model or adapter weights and every other
file resuming reads (the optimizer's, the scheduler's and the random state: without them transformers restarts
them silently, so a resumed run would differ from the uninterrupted one), and every file that resuming reads is whole: JSON files parse, ``.safetensors`` files have their
header and exactly the bytes it promises (and an index's shards are there), ``.pt`` / ``.pth`` / ``.bin`` files
(``torch.save``'s zip format) have their closing central directory. These checks read headers only.

A checkpoint is loadable when it is complete and its contents read back: every weight tensor loads and holds only
finite values (a run that diverged, or a file damaged in place with its size unchanged, which the size checks
cannot see), and every member of a ``torch.save`` file matches the CRC-32 its zip directory records. These read
every byte once, one tensor at a time (:func:`weights_problem`, ``loadable=True``).

API: :func:`checkpoint_problem`, :func:`last_complete_checkpoint`, :func:`inside_generation_block`.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path

__all__ = ["checkpoint_problem", "checkpoint_step", "inside_generation_block", "last_complete_checkpoint",
           "run_contents", "train_loss_keeper", "weights_problem"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin",
            "pytorch_model.bin.index.json", "adapter_model.bin")
_WEIGHT_FILE = re.compile(r"^(model|adapter_model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)$")
_RNG_STATE = re.compile(r"^rng_state(_\d+)?\.pth$")
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


def _safetensors_content_problem(path: Path) -> str | None:
    """Every tensor of a whole ``.safetensors`` file loads and is finite (one tensor in memory at a time)."""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    return f"{path.name} holds NaN or infinite values (tensor {name})"
    except Exception as exc:  # safetensors raises its own SafetensorError besides OSError / ValueError
        return f"{path.name} has tensors that do not load ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
    return None


def _zip_content_problem(path: Path) -> str | None:
    """Every member of a ``torch.save`` file matches its recorded CRC-32 (a byte changed in place)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
        return f"{path.name} does not read back ({type(exc).__name__})"
    return f"{path.name} is damaged ({bad} fails its CRC check)" if bad else None


def _file_problem(path: Path, *, loadable: bool = False) -> str | None:
    if path.stat().st_size == 0:
        return f"{path.name} is empty"
    if path.suffix == ".json":
        return _json_problem(path)
    if path.suffix == ".safetensors":
        return _safetensors_problem(path) or (_safetensors_content_problem(path) if loadable else None)
    return _zip_problem(path) or (_zip_content_problem(path) if loadable else None)


def weights_problem(folder: str | Path, *, loadable: bool = True) -> str | None:
    """Why the model or adapter weights saved in ``folder`` (a checkpoint, or a run's final model) cannot be used
    (a short phrase naming the file), or None; "no model or adapter weights" when there are none. With
    ``loadable`` every tensor is read back and must be finite (module docstring)."""
    folder = Path(folder)
    if not any((folder / name).is_file() for name in _WEIGHTS) and not any(folder.glob("pytorch_model_fsdp*")):
        return "no model or adapter weights"
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / name).is_file():
            problem = _json_problem(folder / name) or _index_problem(folder / name)
            if problem:
                return problem
    for path in sorted(folder.iterdir()):
        if path.is_file() and _WEIGHT_FILE.match(path.name):
            problem = _file_problem(path, loadable=loadable)
            if problem:
                return problem
    return None


def run_contents(output_dir: str | Path) -> list[str]:
    """The names in ``output_dir`` that mark a training run, sorted: ``checkpoint-N`` folders, the log
    (``log_history.jsonl``), a trainer state and a saved model's weights or ``training_args.bin``. Empty when the
    folder does not exist or holds none of them (an empty folder, or one holding other files)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    marks = {"log_history.jsonl", TRAINER_STATE, "training_args.bin", *_WEIGHTS}
    return sorted(p.name for p in output_dir.iterdir()
                  if (p.is_dir() and _CHECKPOINT.match(p.name)) or (p.is_file() and (
                      p.name in marks or _WEIGHT_FILE.match(p.name))))


def checkpoint_step(folder: str | Path) -> int | None:
    """The ``global_step`` a checkpoint's ``trainer_state.json`` records, or None when it has none that is an
    integer >= 0 (or the file does not read)."""
    try:
        step = json.loads((Path(folder) / TRAINER_STATE).read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def _index_problem(path: Path) -> str | None:
    """A sharded-weights index: each shard it names is in the folder."""
    weight_map = json.loads(path.read_text()).get("weight_map") or {}
    for shard in sorted(set(weight_map.values())):
        if not (path.parent / shard).is_file():
            return f"{shard} (named by {path.name}) is missing"
    return None


def checkpoint_problem(folder: str | Path, *, loadable: bool = False) -> str | None:
    """Why the checkpoint folder ``folder`` cannot be resumed from (a short phrase naming the file), or None when it
    is complete (and, with ``loadable``, its tensors read back finite and its zip files pass their CRC checks:
    module docstring)."""
    folder = Path(folder)
    state = folder / TRAINER_STATE
    if not state.is_file():
        return f"no {TRAINER_STATE} (the save was cut off)"
    for path in sorted(folder.iterdir()):
        if path.is_file() and _READ_ON_RESUME.match(path.name):
            problem = _file_problem(path, loadable=loadable)
            if problem:
                return problem
    try:
        state_data = json.loads(state.read_text())
    except (OSError, ValueError):
        return f"{TRAINER_STATE} does not read as JSON"
    if not isinstance(state_data, dict) or "global_step" not in state_data:
        return f"{TRAINER_STATE} has no global_step"
    step = checkpoint_step(folder)
    if step is None:
        return f"{TRAINER_STATE} has global_step {state_data['global_step']!r}, not an integer >= 0"
    named = _CHECKPOINT.match(folder.name)
    if named and int(named.group(1)) != step:
        return f"{TRAINER_STATE} says step {step}, not the {named.group(1)} of the folder's name"
    history = state_data.get("log_history", [])
    if not isinstance(history, list) or not all(isinstance(record, dict) for record in history):
        return f"{TRAINER_STATE}'s log_history is not a list of log records"
    return weights_problem(folder, loadable=False) or _resume_files_problem(folder)  # contents checked above


def _resume_files_problem(folder: Path) -> str | None:
    """A file ``Trainer.train(resume_from_checkpoint=...)`` reads besides the weights and the state is missing:
    without the optimizer's or the scheduler's state it restarts them silently (Adam's moments at 0, the learning
    rate at its first value), without the random state its sampling differs from the uninterrupted run's. DeepSpeed
    keeps all three in its ``global_step*`` folder, FSDP its optimizer in ``optimizer_*``."""
    names = {p.name for p in folder.iterdir()}
    deepspeed = any(n.startswith("global_step") and (folder / n).is_dir() for n in names)
    if not deepspeed:
        if not any(n in ("optimizer.pt", "optimizer.bin") or n.startswith("optimizer_") or n.endswith("-optimizer.pt")
                   for n in names):
            return "optimizer.pt is missing (resuming would restart the optimizer's state)"
        if "scheduler.pt" not in names:
            return "scheduler.pt is missing (resuming would restart the learning-rate schedule)"
    if not any(_RNG_STATE.match(n) for n in names):
        return "rng_state.pth is missing (resuming would not draw what the uninterrupted run draws)"
    return None


def last_complete_checkpoint(output_dir: str | Path, *, loadable: bool = False
                             ) -> tuple[str | None, list[tuple[str, str]]]:
    """(the newest complete (with ``loadable``: complete and loadable) ``checkpoint-N`` folder in ``output_dir`` or
    None, [(newer folder, its problem), ...] for the ones passed over, newest first)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None, []
    found = sorted(((int(m.group(1)), p) for p in output_dir.iterdir()
                    if (m := _CHECKPOINT.match(p.name)) and p.is_dir()), reverse=True)
    skipped: list[tuple[str, str]] = []
    for _, path in found:
        problem = checkpoint_problem(path, loadable=loadable)
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


def train_loss_keeper(trainer):
    """A callback that makes a resumed run's ``train_loss`` the uninterrupted run's.

    transformers 5 reports ``train_loss = total / steps`` over the steps of the current ``train()`` call only (its
    ``_total_loss_scalar`` and the loss accumulated since the last log, ``_tr_loss``, start at 0 on resume), so a
    resumed run's figure is the mean of its resumed steps. This callback keeps both in each checkpoint's
    ``trainer_state.json`` (``stateful_callbacks``, with the last logged step) and puts them back when a resumed run
    begins, so the sums continue in the same order as in one uninterrupted run; the end-of-training log then holds
    ``total / global_step``, bit for bit the uninterrupted run's figure. A checkpoint written without it falls back
    to the logged losses (``loss x steps since the previous log``, equal up to rounding)."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState

    class CalibrlTrainLoss(TrainerCallback, ExportableState):
        def state(self) -> dict:
            pending = getattr(trainer, "_tr_loss", None)
            return {"args": {}, "attributes": {
                "total_loss": float(getattr(trainer, "_total_loss_scalar", 0.0)),
                "pending_loss": float(pending.item()) if pending is not None else 0.0,
                "last_logged_step": int(getattr(trainer, "_globalstep_last_logged", 0))}}

        def on_train_begin(self, args, state, control, **kwargs):
            name = type(self).__name__
            saved = (state.stateful_callbacks or {}).get(name)
            if state.global_step > 0:
                if isinstance(saved, dict) and isinstance(saved.get("attributes"), dict):
                    kept = saved["attributes"]
                    trainer._total_loss_scalar = float(kept["total_loss"])
                    trainer._tr_loss.fill_(float(kept["pending_loss"]))
                    trainer._globalstep_last_logged = int(kept["last_logged_step"])
                else:  # a checkpoint saved without this callback: the logged losses, each over its interval
                    total, previous = 0.0, 0
                    for record in state.log_history:
                        if isinstance(record.get("loss"), (int, float)) and isinstance(record.get("step"), int):
                            total += record["loss"] * (record["step"] - previous)
                            previous = record["step"]
                    trainer._total_loss_scalar = total
            # transformers' _save_checkpoint indexes stateful_callbacks by name: a state loaded from a checkpoint
            # without this callback must gain its entry
            state.stateful_callbacks[name] = self.state()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "train_loss" in logs:
                value = trainer._total_loss_scalar / max(state.global_step, 0.001)
                logs["train_loss"] = value
                if state.log_history and "train_loss" in state.log_history[-1]:
                    state.log_history[-1]["train_loss"] = value

    return CalibrlTrainLoss()
