"""``calibrl train RECIPE [--resume | --overwrite] [--max-steps N] [--output-dir D] [--set key=value ...]`` and
``calibrl train --list``."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Optional

import typer

from calibrl.cli.app import app, require_extra


def _parse_sets(items: list[str]) -> dict:
    """``--set key=value`` items as a mapping; values are parsed as recipe YAML (``1e-5`` is a float)."""
    import yaml

    from calibrl.trl.recipes import RecipeError, load_yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise typer.BadParameter(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip()
        if key.startswith("trainer."):
            key = key[len("trainer."):]
        try:
            out[key] = load_yaml(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise RecipeError(f"--set {key}: {value!r} is not a YAML value ({' '.join(problem.split())})") from None
    return out


def _first_sentence(path: Path) -> str:
    """The first sentence of a recipe's header comment (its first paragraph, joined across lines)."""
    paragraph: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if not text:
            if paragraph:
                break
            continue
        paragraph.append(text)
    return re.split(r"(?<=\.)\s", " ".join(paragraph), maxsplit=1)[0]


def _list_recipes() -> None:
    """Print the recipes shipped in the package, each with the first sentence of its header comment."""
    from calibrl.trl.recipes import shipped_recipes

    for name, path in shipped_recipes().items():
        typer.echo(name)
        typer.echo(textwrap.fill(_first_sentence(path), width=78, initial_indent="    ", subsequent_indent="    ",
                                 break_on_hyphens=False))


@app.command("train", short_help="Train with calibration-aware RL through TRL, from a YAML recipe.")
def train_command(
    config: Optional[str] = typer.Argument(
        None, help="YAML recipe file, or the name of a shipped recipe (calibrl train --list), e.g. tiny_cpu."),
    list_: bool = typer.Option(False, "--list", help="List the shipped recipes and exit."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in the output dir (a "
                                "finished run is left as it is)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="The output dir holds an earlier run: move it aside "
                                   "to <dir>.replaced-<UTC time> and start afresh (without it, such a dir is refused)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Override trainer.max_steps."),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", help="Override trainer.output_dir."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a trainer field: --set learning_rate=1e-5 (value parsed as YAML); repeatable."
    ),
    rehearse: bool = typer.Option(
        False, "--rehearse", help="Run the recipe on the CPU first: its model class at tiny width with its real "
        "vocabulary, the shipped sample data, GPU-only settings mapped (each printed), 2 optimizer steps through the "
        "real training path, no download. Output in runs/rehearse/<recipe> unless --output-dir."),
) -> None:
    """Train with a calibration-aware advantage (CAPO, GCPO, ...) through TRL, from a YAML recipe.

    The recipe is checked before anything loads: a bad value is one line naming the file and key (exit 2). An
    output dir that holds a run is refused unless --resume (continue it; a finished run is left unchanged) or
    --overwrite (move it aside to <dir>.replaced-<UTC time>).
    """
    from rich.console import Console

    require_extra("train", "trl")
    if list_:
        _list_recipes()
        return
    console = Console(stderr=True)
    if config is None:
        console.print("error: give a recipe file or a shipped recipe name (calibrl train --list)", markup=False)
        raise typer.Exit(2)
    from calibrl.trl.recipes import RecipeError, check_trainer_fields, load_recipe

    try:
        # checked before TRL, transformers and torch load (seconds), so a typo answers at once
        recipe = load_recipe(config)
        overrides = _parse_sets(set_)
        if max_steps is not None:
            overrides["max_steps"] = max_steps
        if output_dir is not None:
            overrides["output_dir"] = str(output_dir)
        check_trainer_fields(overrides, recipe.source, "overrides")
        if rehearse:
            if resume:
                raise RecipeError(f"{recipe.source}: --rehearse starts a fresh CPU run; it does not take --resume")
            from calibrl.trl.rehearse import rehearse as run_rehearsal

            steps = overrides.pop("max_steps", 2)
            run_rehearsal(recipe, overrides=overrides, steps=steps, output_dir=overrides.pop("output_dir", None),
                          console=console, overwrite=overwrite)
            return
        from calibrl.trl.train import end_process_group, train

        train(recipe, resume=resume, overwrite=overwrite, overrides=overrides, console=console,
              result_console=Console())  # stdout
        end_process_group()  # the process ends here: under accelerate launch / torchrun, leave the group cleanly
    except RecipeError as exc:
        console.print(f"error: {' '.join(str(exc).split())}", markup=False, soft_wrap=True, highlight=False)
        raise typer.Exit(2)
    except RuntimeError as exc:
        from calibrl.advantages import EstimatorFailed  # here, not above: the recipe check loads no torch

        if not isinstance(exc, EstimatorFailed):
            raise
        # during the run: what was wrong, where, and what was kept (exit 1)
        console.print(f"error: {' '.join(str(exc).split())}", markup=False, soft_wrap=True, highlight=False)
        raise typer.Exit(1)
