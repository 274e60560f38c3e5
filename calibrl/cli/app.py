"""The ``calibrl`` Typer application; each subcommand lives in its own module and registers itself here."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="calibrl",
    help="Calibration-aware RL for reasoning LLMs: train (TRL), generate samples, evaluate calibration, run the demo.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    # click's plain help: at 80 columns it wraps the help and the defaults in full (the rich panels cut them to
    # "[default: majority,weighted,pc,rp..."), and it shows no value type for flags (typer 0.29's rich panels print
    # "<bool>" for every flag, --help included)
    rich_markup_mode=None,
)


# Set by a command that has closed everything it wrote (calibrl eval, once its report is in place): main() then
# ends the process without the collector's passes over the objects the imports made (calibrl.cli.main).
_ends_clean = False


def mark_ends_clean() -> None:
    """Let this process end without the garbage collector's passes at exit (:func:`calibrl.cli.main`)."""
    global _ends_clean
    _ends_clean = True


def ends_clean() -> bool:
    """Whether a command of this process marked it so (:func:`mark_ends_clean`)."""
    return _ends_clean


# What a command needs beyond the core install, by pyproject extra: the modules it imports (the extra's
# requirements install them under the same names) and how users know each.
EXTRA_MODULES = {
    "trl": {"trl": "TRL", "transformers": "transformers", "accelerate": "accelerate", "peft": "peft",
            "datasets": "datasets"},
    "generate": {"transformers": "transformers", "datasets": "datasets", "tqdm": "tqdm"},
}


def require_extra(command: str, extra: str) -> None:
    """Exit 2 with one line when a module of ``extra`` is not installed, before anything loads:
    ``calibrl train needs TRL: install calibrl's [trl] extra (from a clone: pip install '.[trl]')``. Only looks
    the modules up (no import)."""
    import importlib.util

    for module, name in EXTRA_MODULES[extra].items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or an entry of None in sys.modules
            found = False
        if not found:
            typer.echo(f"error: calibrl {command} needs {name}: install calibrl's [{extra}] extra (from a clone: "
                       f"pip install '.[{extra}]')", err=True)
            raise typer.Exit(2)


def _version() -> str:
    """The installed distribution's version (the source tree's when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("calibrl")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"calibrl {_version()}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Calibration-aware RL for reasoning LLMs: train (TRL), generate samples, evaluate calibration, run the demo."""
