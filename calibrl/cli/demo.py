"""``calibrl demo [--out runs/demo] [--quick] [--seeds 1] [--steps N] [--workers 2] [--methods ...]``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from calibrl.cli.app import app, require_extra


@app.command("demo", short_help="Built-in demo on a tiny model: GRPO vs CAPO and more; report.md.")
def demo_command(
    out: Path = typer.Option(Path("runs/demo"), "--out", help="Output folder (report.md, PNGs, results.json)."),
    quick: bool = typer.Option(
        False, "--quick", help="Smoke run: few steps, fewer methods, small eval (about 15 s on 2 cores; about 45 s "
                               "on the first run, which trains the warm starts; bench/timings.py)."),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Number of seeds (0..N-1) per method."),
    steps: Optional[int] = typer.Option(None, "--steps", min=0, help="RL steps per method (default 200; quick 10)."),
    workers: int = typer.Option(2, "--workers", min=1, help="Worker processes (one torch thread each)."),
    methods: Optional[str] = typer.Option(
        None, "--methods",
        help="Comma-separated subset, e.g. 'stochastic_reasoning/grpo, stochastic_reasoning/capo, decision/decision' "
             "(spaces allowed). "
             "With --model: one of grpo, capo, capo_mask, grpo_decision (default grpo).",
    ),
    model: Optional[str] = typer.Option(
        None, "--model",
        help="A real model instead of the tiny one: builtin:smollm2-135m-instruct, builtin:smollm2-135m-warm or a "
             ".gguf / Hugging Face folder. Evaluates it on held-out prompts (arithmetic for the warm model, the task "
             "it was warm-started on; multiple choice for any other), trains a few LoRA steps (--steps, default 6; "
             "--quick: 2) and evaluates again; about 4 minutes on 2 cores for the built-in model with --quick (README).",
    ),
    dtype: Optional[str] = typer.Option(
        None, "--dtype",
        help="With --model: the weights' dtype, float32 (default), bfloat16, float16 or auto. bfloat16 steps are "
             "1.3-1.8x faster on a CPU with AVX512-BF16 (docs/realmodel.md); the LoRA adapters stay float32.",
    ),
) -> None:
    """Built-in demo on the tiny model: GRPO vs CAPO (sequence confidence) and SFT vs GRPO vs decision-token
    calibration (decisions), with GCPO and SEED-GRPO beside them, from one warm start; writes report.md + plots.
    With --model: the same question on a real model, in a short LoRA run."""
    import warnings

    require_extra("demo", "trl")
    if model is not None:
        _real_model_demo(model=model, out=out, quick=quick, steps=steps, methods=methods, dtype=dtype or "float32")
        return
    if dtype is not None:
        raise typer.BadParameter("--dtype applies to a real model (--model); the tiny model runs in float32",
                                 param_hint="'--dtype'")

    from calibrl.testbed.demo import run_demo
    from calibrl.testbed.methods import DemoConfig, method_specs

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' deprecation notes inside TRL

    overrides = {"seeds": tuple(range(seeds)), "workers": workers}
    if steps is not None:
        overrides["steps"] = steps
        overrides["eval_every"] = max(1, min(25, steps // 4 or 1)) if not quick else max(1, steps // 2 or 1)
    if methods:
        overrides["methods"] = tuple(m.strip() for m in methods.split(",") if m.strip())
    config = DemoConfig.quick_config(**overrides) if quick else DemoConfig(**overrides)
    # checked here, before the demo prints its header or creates the output folder
    known = method_specs(capo_tau=config.capo_tau, decision_coef=config.decision_coef)
    unknown = [m for m in config.methods if m not in known]
    if unknown:
        raise typer.BadParameter(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(known)}",
                                 param_hint="'--methods'")
    try:
        run_demo(config, out)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _real_model_demo(*, model: str, out: Path, quick: bool, steps: Optional[int], methods: Optional[str],
                     dtype: str) -> None:
    import warnings

    from calibrl.models import DTYPES
    from calibrl.testbed.realmodel import REAL_MODEL_METHODS, run_real_model_demo

    warnings.filterwarnings("ignore", category=FutureWarning)
    method = (methods or "grpo").strip()
    if method not in REAL_MODEL_METHODS:
        raise typer.BadParameter(f"with --model, --methods is one of {', '.join(REAL_MODEL_METHODS)}; got "
                                 f"{method!r}", param_hint="'--methods'")
    if dtype not in DTYPES:
        raise typer.BadParameter(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}", param_hint="'--dtype'")
    out = out if out != Path("runs/demo") else Path("runs/demo-realmodel")
    try:
        report = run_real_model_demo(out, model=model, method=method, steps=steps if steps is not None else
                                     (2 if quick else 6), eval_prompts=8 if quick else 32, dtype=dtype)
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"report: {report}")
    typer.echo((report.parent / "report.md").read_text().split("## Held-out evaluations")[0].split(
        "## What this run shows")[-1].strip())
