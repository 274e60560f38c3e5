"""Command-line interface: ``calibrl train | generate | eval | demo``.

Each subcommand module registers itself on the shared Typer app; heavy imports (torch, transformers, TRL)
happen inside the command bodies, and ``calibrl``'s torch-backed API loads on first use (``calibrl/__init__.py``),
so ``calibrl --help``, ``calibrl <cmd> --help`` and argument errors never import torch (tests/test_cli.py).
"""

from calibrl.cli.app import app
from calibrl.cli import demo, eval, generate, train  # noqa: F401,A004  (register subcommands)


def main() -> None:
    app()


__all__ = ["app", "main"]
