"""``calibrl train``: a parsed recipe (:mod:`calibrl.trl.recipes`) -> a ready ``CalibratedGRPOTrainer`` -> training.

Datasets and rewards are looked up by name in :mod:`calibrl.tasks.registry`; the model is a hub id, a local folder
or ``builtin:tiny`` (the testbed's model, :mod:`calibrl.testbed.model`). Progress shows reward and calibration
while training; the end prints a summary of the last logged steps.

API: :func:`load_recipe` (from :mod:`calibrl.trl.recipes`), :func:`build_trainer`, :func:`train`.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

from calibrl.trl.recipes import (
    TINY,
    DatasetSpec,
    ModelSpec,
    Recipe,
    RecipeError,
    check_trainer_fields,
    load_recipe,
    unknown_key_error,
)

__all__ = ["RecipeError", "build_trainer", "last_checkpoint", "load_recipe", "summarize", "train"]

def _load_dataset(spec: DatasetSpec, section: str, source: str):
    from calibrl.tasks.registry import get_dataset_loader

    try:
        loader = get_dataset_loader(spec.name)
    except KeyError as exc:
        raise RecipeError(f"{source}: {section}.name: {exc.args[0]}") from None
    kwargs: dict[str, Any] = {}
    if spec.split is not None:
        kwargs["split"] = spec.split
    if spec.path is not None:
        kwargs["path"] = spec.path
    if spec.limit is not None:
        kwargs["limit"] = spec.limit
    kwargs.update(spec.options)
    params = inspect.signature(loader).parameters
    named = [k for k, p in params.items() if k != "self" and p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key in kwargs:  # only the loader's named parameters: a typo must not vanish into **kwargs
        if key not in named:
            raise unknown_key_error(key, section, named + ["load_kwargs"], source)
    if spec.load_kwargs:
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            raise RecipeError(f"{source}: {section}.load_kwargs: the {spec.name!r} loader takes no extra keyword "
                              f"arguments (its parameters: {', '.join(named)})")
        clash = sorted(set(spec.load_kwargs) & set(named))
        if clash:
            raise RecipeError(f"{source}: {section}.load_kwargs: {clash} are loader parameters; set them in "
                              f"section {section!r} itself")
        kwargs.update(spec.load_kwargs)
    dataset = loader(**kwargs)
    if spec.limit is not None and hasattr(dataset, "select") and len(dataset) > spec.limit:
        dataset = dataset.select(range(spec.limit))
    return dataset


def _load_model(spec: ModelSpec):
    """(model or model id, tokenizer or None, model_init_kwargs)."""
    if spec.name_or_path == TINY:
        from calibrl.testbed.model import TinyModelConfig, build_tiny_model

        tiny = dict(spec.tiny or {})
        seed = int(tiny.pop("seed", 0))
        model, tokenizer = build_tiny_model(config=TinyModelConfig(**tiny), seed=seed)
        return model, tokenizer, {}
    init_kwargs = dict(spec.init_kwargs)
    if spec.dtype is not None:
        init_kwargs["dtype"] = spec.dtype
    tokenizer = None
    if spec.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer)
    return spec.name_or_path, tokenizer, init_kwargs


def _peft_config(peft: dict | None):
    if not peft:
        return None
    from peft import LoraConfig

    kwargs = dict(peft)
    kwargs.setdefault("task_type", "CAUSAL_LM")
    return LoraConfig(**kwargs)


def build_trainer(recipe: Recipe, *, model=None, tokenizer=None, overrides: dict | None = None, callbacks=None):
    """A ready :class:`~calibrl.trl.CalibratedGRPOTrainer` for ``recipe``.

    Args:
        recipe: from :func:`load_recipe`.
        model, tokenizer: a stand-in model (e.g. the tiny model) used instead of the recipe's (both, or the model
            alone when the recipe's tokenizer loads). Recipe tests build every recipe this way on CPU.
        overrides: CalibratedGRPOConfig fields replacing the recipe's ``trainer`` values (e.g. ``max_steps``).
        callbacks: extra ``transformers.TrainerCallback`` objects.
    """
    from calibrl.tasks.registry import get_reward
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

    source = recipe.source
    trainer_kwargs = dict(recipe.trainer)
    trainer_kwargs.update(check_trainer_fields(overrides or {}, source, "overrides"))
    trainer_kwargs.setdefault("output_dir", str(Path("runs") / Path(source).stem))
    trainer_kwargs.setdefault("report_to", "none")

    if model is None:
        model, recipe_tokenizer, init_kwargs = _load_model(recipe.model)
        tokenizer = tokenizer if tokenizer is not None else recipe_tokenizer
        if init_kwargs:
            merged = dict(trainer_kwargs.get("model_init_kwargs") or {})
            merged.update(init_kwargs)
            trainer_kwargs["model_init_kwargs"] = merged
    weights = [r.weight for r in recipe.rewards]
    if any(w != 1.0 for w in weights) and "reward_weights" not in trainer_kwargs:
        trainer_kwargs["reward_weights"] = weights
    try:
        args = CalibratedGRPOConfig(**trainer_kwargs)
    except (TypeError, ValueError) as exc:
        raise RecipeError(f"{source}: section 'trainer': {exc}") from exc

    reward_funcs = []
    for spec in recipe.rewards:
        try:
            reward_funcs.append(get_reward(spec.name))
        except KeyError as exc:
            raise RecipeError(f"{source}: rewards: {exc.args[0]}") from None
    train_dataset = _load_dataset(recipe.dataset, "dataset", source)
    eval_dataset = _load_dataset(recipe.eval_dataset, "eval_dataset", source) if recipe.eval_dataset else None

    return CalibratedGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=_peft_config(recipe.model.peft),
        callbacks=callbacks,
    )


# ----------------------------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------------------------

_SUMMARY_KEYS = (
    ("reward", "reward"),
    ("accuracy", "calibration/accuracy"),
    ("AUROC (pooled)", "calibration/auroc"),
    ("AUROC (per prompt)", "calibration/auroc_per_prompt"),
    ("confidence right", "calibration/confidence_correct"),
    ("confidence wrong", "calibration/confidence_wrong"),
    ("masked fraction", "calibration/estimator/mask_fraction"),
    ("decision ECE", "calibration/decision_ece"),
    ("decision p>0.99", "calibration/decision_frac_above_099"),
    ("entropy", "entropy"),
)


def _progress_callback(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from transformers import TrainerCallback

    class RichProgress(TrainerCallback):
        """Rich progress bar with the latest reward and AUROC (main process only)."""

        def __init__(self):
            self.progress = None
            self.task = None
            self.last: dict[str, float] = {}

        def on_train_begin(self, args, state, control, **kwargs):
            if not state.is_world_process_zero:
                return
            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console, transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task("train", total=state.max_steps, completed=state.global_step, info="")

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                self.last.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
            if self.progress is not None:
                parts = []
                for label, key in (("reward", "reward"), ("auroc", "calibration/auroc")):
                    value = self.last.get(key)
                    if value is not None and not (isinstance(value, float) and math.isnan(value)):
                        parts.append(f"{label} {value:.3f}")
                self.progress.update(self.task, info="  ".join(parts))

        def on_step_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update(self.task, completed=state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update(self.task, completed=state.global_step)
                self.progress.stop()
                self.progress = None

    return RichProgress()


def summarize(log_history: list[dict], *, last_n: int = 5) -> dict[str, dict[str, float]]:
    """First and last (mean of the last ``last_n`` logged values) of the summary metrics, and final eval values."""
    out: dict[str, dict[str, float]] = {}
    for label, key in _SUMMARY_KEYS:
        values = [h[key] for h in log_history if isinstance(h.get(key), (int, float)) and not math.isnan(h[key])]
        evals = [h[f"eval_{key}"] for h in log_history
                 if isinstance(h.get(f"eval_{key}"), (int, float)) and not math.isnan(h[f"eval_{key}"])]
        if not values and not evals:
            continue
        row = {}
        if values:
            row["first"] = float(values[0])
            tail = values[-last_n:]
            row["last"] = float(sum(tail) / len(tail))
        if evals:
            row["eval"] = float(evals[-1])
        out[label] = row
    return out


def _print_summary(console, summary: dict, trainer) -> None:
    from rich.table import Table

    table = Table(title=f"calibrl train: {trainer.args.advantage_estimator} ({trainer.state.global_step} steps)")
    table.add_column("metric")
    table.add_column("first", justify="right")
    table.add_column("last (mean of 5)", justify="right")
    table.add_column("eval", justify="right")
    fmt = lambda row, k: f"{row[k]:.4f}" if k in row else "-"  # noqa: E731
    for label, row in summary.items():
        table.add_row(label, fmt(row, "first"), fmt(row, "last"), fmt(row, "eval"))
    console.print(table)
    console.print(f"output: {trainer.args.output_dir}")


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest ``checkpoint-N`` folder in ``output_dir`` (None if there is none)."""
    from transformers.trainer_utils import get_last_checkpoint

    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    return get_last_checkpoint(str(output_dir))


def train(recipe: Recipe, resume: bool = False, *, overrides: dict | None = None, model=None, tokenizer=None,
          progress: bool = True, console=None) -> dict[str, Any]:
    """Train ``recipe``; with ``resume`` continue from the last checkpoint in its output_dir.

    Returns ``{"output_dir", "global_step", "resumed_from", "summary", "log_history"}``; saves the final model
    in ``output_dir`` and prints a rich summary table (main process).
    """
    from rich.console import Console

    console = console or Console()
    overrides = dict(overrides or {})
    callbacks = []
    if progress:
        overrides.setdefault("disable_tqdm", True)
        callbacks.append(_progress_callback(console))
    trainer = build_trainer(recipe, model=model, tokenizer=tokenizer, overrides=overrides, callbacks=callbacks)
    if progress:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # the rich bar replaces the printed log dicts
    checkpoint = last_checkpoint(trainer.args.output_dir) if resume else None
    is_main = trainer.accelerator.is_main_process
    if resume and checkpoint is None and is_main:
        console.print(f"[yellow]--resume: no checkpoint in {trainer.args.output_dir}; starting from scratch")
    elif checkpoint and is_main:
        console.print(f"resuming from {checkpoint}")
    trainer.train(resume_from_checkpoint=checkpoint)
    if trainer.eval_dataset is not None:
        trainer.evaluate()
    trainer.save_model(trainer.args.output_dir)
    summary = summarize(trainer.state.log_history)
    if is_main:
        _print_summary(console, summary, trainer)
    return {
        "output_dir": trainer.args.output_dir,
        "global_step": trainer.state.global_step,
        "resumed_from": checkpoint,
        "summary": summary,
        "log_history": trainer.state.log_history,
    }
