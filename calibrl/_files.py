"""File writing shared by every layer that must never leave a half-written file."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_then_rename"]


def write_then_rename(path: str | Path, content: str | bytes) -> None:
    """``content`` (text as UTF-8, or bytes) into ``path`` through ``<path>.tmp`` renamed over it: a kill leaves
    the old file or the new one, never a torn one (the rename is atomic on one file system)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    tmp.replace(path)
