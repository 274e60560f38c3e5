"""A study's data file (docs/results/<study>_results.json[.gz]): compact JSON, gzip-compressed with reproducible
bytes (mtime 0, no file name) when the path ends in .gz, so the same records give the same bytes."""

from __future__ import annotations

import gzip
import json
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
