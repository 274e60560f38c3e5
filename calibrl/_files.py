"""File writing shared by every layer that must never leave a half-written file, and the lock that keeps one writer
per run folder."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # Windows: the lock falls back to an exclusively created file (folder_lock)
    fcntl = None

__all__ = ["FolderInUse", "folder_lock", "lock_path", "write_then_rename"]


def write_then_rename(path: str | Path, content: str | bytes) -> None:
    """``content`` (text as UTF-8, or bytes) into ``path`` through ``<path>.tmp`` renamed over it: a kill leaves
    the old file or the new one, never a torn one (the rename is atomic on one file system)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    tmp.replace(path)


class FolderInUse(RuntimeError):
    """Another process holds a folder's lock (:func:`folder_lock`); the message names it."""


def lock_path(folder: str | Path) -> Path:
    """The lock file of ``folder``: ``<parent>/.<name>.lock``, beside the folder rather than in it, so that the lock
    stays while the folder itself is moved aside (``--overwrite``) or created."""
    folder = Path(folder).expanduser().absolute()
    return folder.with_name(f".{folder.name}.lock")


_HELD: dict[Path, int] = {}  # lock file -> how many nested folder_lock blocks of this process hold it


def _holder(text: str) -> str:
    """A lock file's contents as words: 'process 123 on host (started 2026-...Z: calibrl train ...)'."""
    try:
        info = json.loads(text)
        return (f"process {info['pid']} on {info['host']} (started {info['started']}: "
                f"{' '.join(str(info.get('command', '')).split())[:120]})")
    except (ValueError, KeyError, TypeError):
        return "an unknown process"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    return True


@contextlib.contextmanager
def folder_lock(folder: str | Path, *, what: str = "run") -> Iterator[str | None]:
    """Hold an exclusive lock on ``folder`` for the block: a second process asking for the same folder gets a
    :class:`FolderInUse` at once (no waiting), naming the holder (pid, host, start time, command). Re-entrant
    within one process (an outer block, e.g. a rehearsal replacing its folder, covers the inner ``calibrl train``).

    The lock is ``flock`` on :func:`lock_path` (released by the kernel when its process dies, so a killed run never
    blocks the next one); the file holds the holder's description and is removed when the block ends. A file
    found non-empty when the lock is taken was left by a process that died holding it: the block's value is then
    a one-line note saying so (else None). Without ``fcntl`` (Windows) the file is created exclusively instead,
    and one whose process no longer runs on this host is taken over with the same note."""
    path = lock_path(folder)
    if path in _HELD:
        _HELD[path] += 1
        try:
            yield None
        finally:
            _HELD[path] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, previous = _acquire(path, what=what, folder=Path(folder))
    stale = (f"note: {folder} was locked by {_holder(previous)}, which ended without releasing it (killed?); "
             "the lock is taken over") if previous.strip() else None
    info = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _rewrite(fd, json.dumps(info) + "\n")
    _HELD[path] = 1
    try:
        yield stale
    finally:
        del _HELD[path]
        with contextlib.suppress(OSError):
            path.unlink()  # before the unlock: a process that opened this file now finds it gone and starts anew
        os.close(fd)  # releases the flock


def _acquire(path: Path, *, what: str, folder: Path) -> tuple[int, str]:
    """(an open descriptor of ``path`` holding its lock, the text it held before)."""
    while True:
        if fcntl is None:
            fd = _create_exclusive(path, what=what, folder=folder)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                text = _read(fd)
                os.close(fd)
                raise FolderInUse(f"{folder} is in use by another {what}: {_holder(text)}; wait for it to end or "
                                  "give another output folder") from None
        try:  # the file we locked must still be the one at the path: its holder may have removed it meanwhile
            same = os.fstat(fd).st_ino == path.stat().st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, _read(fd)
        os.close(fd)


def _create_exclusive(path: Path, *, what: str, folder: Path) -> int:
    """Without ``fcntl``: the lock file created exclusively; an existing one whose process no longer runs on this
    host is stale and replaced (its text is put back so the caller reports it)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        text = path.read_text(errors="replace") if path.exists() else ""
    try:
        info = json.loads(text)
        dead = info["host"] == socket.gethostname() and not _pid_alive(int(info["pid"]))
    except (ValueError, KeyError, TypeError):
        dead = False
    if not dead:
        raise FolderInUse(f"{folder} is in use by another {what}: {_holder(text)}; wait for it to end or give "
                          f"another output folder (if no such process runs, remove {path})")
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    _rewrite(fd, text)
    return fd


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode(errors="replace")


def _rewrite(fd: int, text: str) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, text.encode())
