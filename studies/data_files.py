"""A study's data file (docs/results/<study>_results.json[.gz]): compact JSON, gzip-compressed with reproducible
bytes (mtime 0, no file name) when the path ends in .gz, so the same records give the same bytes."""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from pathlib import Path


def save_data(data: dict, path: Path) -> None:
    """Write a study's records as JSON (gzip-compressed when ``path`` ends in .gz); numpy scalars as floats."""
    text = json.dumps(data, separators=(",", ":"), default=float)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
            f.write(text.encode())  # mtime 0 and no name: the same records give the same bytes
    else:
        path.write_text(text)


def load_data(path: Path) -> dict:
    """Read a file written by :func:`save_data`."""
    return json.loads(gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text())


def pack_generate_run(generated: Path, samples: Path, run: Path, *, times: dict[str, str], command: str,
                      extra: dict | None = None) -> None:
    """Commit-ready data from a finished ``calibrl generate`` run: its JSONL gzip-compressed into ``samples`` with
    reproducible bytes (mtime 0, no file name) and ``run`` (JSON) with the command, the run's UTC times
    (``times``), ``calibrl generate``'s settings file and ``extra``."""
    samples.parent.mkdir(parents=True, exist_ok=True)
    with open(generated, "rb") as src, open(samples, "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0, filename="") as dst:
        shutil.copyfileobj(src, dst)
    meta_path = generated.with_name(generated.name + ".meta.json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
    run.write_text(json.dumps({"command": command, **times, "generate_settings": meta, **(extra or {})},
                              indent=1) + "\n")


def load_packed_samples(path: Path, **load_kwargs):
    """The rows of a :func:`pack_generate_run` file read by :func:`calibrl.evaluation.samples.load_samples` (with
    ``load_kwargs``), the gzip file decompressed to a temporary file first, since the reader takes plain JSONL."""
    from calibrl.evaluation.samples import load_samples

    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "samples.jsonl"
        with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return load_samples(plain, **load_kwargs)
