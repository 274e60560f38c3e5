"""``calibrl train CONFIG.yaml [--resume] [--max-steps N] [--output-dir D] [--set key=value ...]``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from calibrl.cli.app import app


def _parse_sets(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise typer.BadParameter(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip()
        if key.startswith("trainer."):
            key = key[len("trainer."):]
        out[key] = yaml.safe_load(value)
    return out


@app.command("train")
def train_command(
    config: Path = typer.Argument(..., help="YAML recipe (see configs/ and docs/trl.md)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in the output dir."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Override trainer.max_steps."),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Override trainer.output_dir."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a trainer field: --set learning_rate=1e-5 (value parsed as YAML); repeatable."
    ),
) -> None:
    """Train with a calibration-aware advantage (CAPO, GCPO, ...) through TRL, from a YAML recipe."""
    from rich.console import Console

    from calibrl.trl.train import RecipeError, load_recipe, train

    console = Console(stderr=True)
    try:
        recipe = load_recipe(config)
        overrides = _parse_sets(set_)
        if max_steps is not None:
            overrides["max_steps"] = max_steps
        if output_dir is not None:
            overrides["output_dir"] = str(output_dir)
        train(recipe, resume=resume, overrides=overrides, console=console)
    except RecipeError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2)
