"""File writing shared by every layer that must never leave a half-written file, the lock that keeps one writer
per run folder, and the replacement of a whole output folder (``calibrl eval``'s report): built beside it, swapped
in by renames, what a killed run left undone by the next."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Iterator

try:
    import fcntl
except ImportError:  # Windows: the lock falls back to an exclusively created file (folder_lock)
    fcntl = None

__all__ = ["FolderError", "FolderInUse", "cache_entry_lock", "check_renamable", "folder_lock", "lock_path",
           "recover_interrupted", "replace_folder", "signals_held", "write_then_rename"]


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


@contextlib.contextmanager
def cache_entry_lock(entry: str | Path) -> Iterator[None]:
    """Hold the lock of a cache entry (a converted model, a warm start) while it is built: processes that need one
    entry at once build it once, the others WAIT for the lock and then find it (unlike :func:`folder_lock`, which
    refuses at once). The lock file is :func:`lock_path`'s, beside the entry; ``filelock`` (huggingface_hub's
    dependency, there wherever a cache entry is built) waits on it."""
    from filelock import FileLock

    with FileLock(str(lock_path(entry))):
        yield


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
    """Whether process ``pid`` runs; True when that cannot be told (another user's, a pid out of range)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # exists, owned by another user; a number no pid can be
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


# ---------------------------------------------------------------------------------------------------- folders


class FolderError(OSError):
    """An output folder cannot be replaced; the message starts with the folder."""


def _leftovers(out: Path, kind: str) -> list[tuple[Path, int]]:
    """``(path, pid)`` of the ``.<out>.<kind>-<pid>...`` folders beside ``out`` whose process no longer runs (this
    process's own are from a run that ended)."""
    found = []
    for path in out.parent.glob(f".{glob.escape(out.name)}.{kind}-*"):
        pid_text = path.name[len(f".{out.name}.{kind}-"):].split("-", 1)[0]
        if (pid_text.isdigit() and path.is_dir() and not path.is_symlink()
                and (int(pid_text) == os.getpid() or not _pid_alive(int(pid_text)))):
            found.append((path, int(pid_text)))
    return found


def recover_interrupted(out: str | Path) -> Path | None:
    """Undo what a killed :func:`replace_folder` left beside ``out``: when ``out`` is missing, the newest
    ``.<out>.old-<pid>`` (a run killed between its two renames) is renamed back to ``out`` and returned; other
    ``.old-`` folders and the ``.tmp-<pid>-`` build folders of processes that no longer run are removed. Folders of
    running processes are left alone. Returns None when nothing was restored."""
    out = Path(out).resolve()
    if not out.parent.is_dir():
        return None
    restored = None
    olds = sorted(_leftovers(out, "old"), key=lambda item: item[0].stat().st_mtime, reverse=True)
    if olds and not out.exists() and not out.is_symlink():
        restored = olds[0][0]
        restored.rename(out)
        olds = olds[1:]
    for path, _pid in olds + _leftovers(out, "tmp"):
        shutil.rmtree(path, ignore_errors=True)
    return restored


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back until the block ends: between the two renames of a swap the previous folder is
    only in ``.<out>.old-<pid>``, and an interrupt there would leave it so."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held) if hasattr(signal, "pthread_sigmask") else None
    try:
        yield
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _old_name(out: Path) -> Path:
    """Where ``out`` is moved aside during a swap: ``.<out>.old-<pid>`` (:func:`recover_interrupted` knows it)."""
    return out.parent / f".{out.name}.old-{os.getpid()}"


def check_renamable(out: str | Path) -> None:
    """Raise :class:`FolderError` when an existing ``out`` cannot be renamed (a mount point, a folder in a sticky
    folder of another user): :func:`replace_folder` puts the new folder in its place by renaming. Tried by renaming
    it aside and back, signals held (a run killed in between is undone by the next one,
    :func:`recover_interrupted`)."""
    out = Path(out)
    if not out.is_dir():
        return
    out = out.resolve()
    aside = _old_name(out)
    with signals_held():
        try:
            out.rename(aside)
        except OSError as exc:
            mount = "; it is a mount point" if os.path.ismount(out) else ""
            raise FolderError(f"{out} cannot be replaced: the report is put in its place by renaming, and renaming "
                              f"it fails ({exc.strerror or exc}){mount}; choose a folder inside it or elsewhere") \
                from None
        try:
            aside.rename(out)
        except OSError as exc:
            raise FolderError(f"{out} was moved to {aside} to test it and cannot be moved back "
                              f"({exc.strerror or exc}); rename it back") from None


def _swap(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``: a previous ``out`` is moved aside first and removed once ``tmp`` is in place.
    When ``tmp`` cannot be put in place the previous folder is moved back, unless another run's has taken its place
    meanwhile (two runs on one ``out``): that one is newer and kept, the one moved aside removed. Raises the
    OSError of the failed rename."""
    old = _old_name(out) if out.exists() else None
    if old is not None:
        out.rename(old)
    try:
        tmp.rename(out)
    except OSError:
        if old is not None:
            try:
                old.rename(out)
            except OSError:
                shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def replace_folder(out: str | Path, build: Callable[[Path], Any]) -> Any:
    """Run ``build(folder)`` on a fresh temporary folder beside ``out`` and rename it to ``out`` (replacing a
    previous one) once it returns; on any error or interrupt the temporary folder is removed and ``out`` is left
    as it was (an exception after the swap carries ``report_placed = True``). Returns what ``build`` returned."""
    out = Path(out).resolve()  # "." or "rep/" have no usable name/parent for the temp folder and the swap
    out.parent.mkdir(parents=True, exist_ok=True)
    # mkdir, not mkdtemp: the folder gets the permissions of any new folder (0o755 under umask 022), not 0o700
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(6)}"
    tmp.mkdir()
    placed = False
    try:
        result = build(tmp)
        with signals_held():
            _swap(tmp, out)
            placed = True
    except BaseException as exc:
        if not placed:
            shutil.rmtree(tmp, ignore_errors=True)
        exc.report_placed = placed
        raise
    return result
