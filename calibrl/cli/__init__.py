"""Command-line interface: ``calibrl train | generate | eval | demo``.

Each subcommand module registers itself on the shared Typer app; heavy imports (torch, transformers, TRL)
happen inside the command bodies, and ``calibrl``'s torch-backed API loads on first use (``calibrl/__init__.py``),
so ``calibrl --help``, ``calibrl <cmd> --help`` and argument errors never import torch (tests/test_cli.py).
"""

import gc

from calibrl.cli.app import app, ends_clean
from calibrl.cli import demo, eval, generate, train  # noqa: F401,A004  (register subcommands)


def main() -> None:
    """The ``calibrl`` command (``python -m calibrl`` too). After a command that closed everything it wrote
    (:func:`calibrl.cli.app.mark_ends_clean`), the objects left are frozen (``gc.freeze``): Python's exit then
    frees them by their reference counts without its collector's passes over each of the 200,000 or so that
    numba, matplotlib and scipy made, 0.2-0.3 s of every ``calibrl eval`` (measured on 2026-11-30); a cycle left
    at exit is not collected, which only matters to one holding unwritten data, and the command has none."""
    try:
        app()
    finally:
        if ends_clean():
            gc.freeze()


__all__ = ["app", "main"]
