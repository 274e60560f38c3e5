"""The ``calibrl`` Typer application; each subcommand lives in its own module and registers itself here."""

import typer

app = typer.Typer(
    name="calibrl",
    help="Calibration-aware RL for reasoning LLMs: train (TRL), generate samples, evaluate calibration, run the demo.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
