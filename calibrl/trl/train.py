"""``calibrl train``: a parsed recipe (:mod:`calibrl.trl.recipes`) -> a ready ``CalibratedGRPOTrainer`` -> training.

Datasets and rewards are looked up by name in :mod:`calibrl.tasks.registry`; the model is a hub id, a local folder
or ``builtin:tiny`` (the testbed's model, :mod:`calibrl.models`). Progress shows reward and calibration
while training; the end prints a summary of the last logged steps.

API: :func:`load_recipe` (from :mod:`calibrl.trl.recipes`), :func:`build_trainer`, :func:`train`.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from pathlib import Path
from typing import Any

from calibrl.trl.checkpoints import inside_generation_block, last_complete_checkpoint
from calibrl.trl.progress import (LOG_HISTORY, log_history_writer, print_summary, progress_callback,
                                  quiet_transformers_bars, summarize)
from calibrl.trl.recipes import (
    TINY,
    DatasetSpec,
    ModelSpec,
    Recipe,
    RecipeError,
    check_advantage_params,
    check_trainer_fields,
    load_recipe,
    unknown_key_error,
)

__all__ = [
    "LOG_HISTORY", "RecipeError", "build_trainer", "last_checkpoint", "load_recipe", "summarize",
    "train", "validate_recipe",
]


_TRL_CHECKPOINTING_DEPRECATION = r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated"
_TRL_RESPONSE_SCHEMA_NOTE = r"The tokenizer has a legacy `response_schema`"


def _filter_known_warnings() -> None:
    """Inside a ``warnings.catch_warnings()`` block: hide the FutureWarnings a calibrl user cannot act on, each by
    category and message (and module where it is fixed), so any other warning still shows."""
    # TRL 1.16 calls transformers 5's deprecated gradient_checkpointing names around every generation
    # (trl.models.utils.unwrap_model_for_generation): three FutureWarnings per run
    warnings.filterwarnings("ignore", message=_TRL_CHECKPOINTING_DEPRECATION, category=FutureWarning)
    # TRL's GRPOTrainer on a chat tokenizer that ships a response_schema (Qwen3): a note to TRL's own maintainers
    warnings.filterwarnings("ignore", message=_TRL_RESPONSE_SCHEMA_NOTE, category=FutureWarning,
                            module=r"trl\.trainer\.grpo_trainer")


def _dataset_kwargs(spec: DatasetSpec, section: str, source: str) -> tuple[Any, dict[str, Any]]:
    """(loader, keyword arguments) for a dataset section, checked without reading anything: a registered name,
    only the loader's named parameters (a typo must not vanish into ``**kwargs``), an existing local path."""
    from calibrl.tasks.registry import get_dataset_loader

    try:
        loader = get_dataset_loader(spec.name)
    except KeyError as exc:
        raise RecipeError(f"{source}: {section}.name: {exc.args[0]}") from None
    kwargs: dict[str, Any] = {}
    if spec.split is not None:
        kwargs["split"] = spec.split
    if spec.path is not None:
        if not Path(str(spec.path)).expanduser().exists():
            raise RecipeError(f"{source}: {section}.path: {spec.path} does not exist (relative paths are looked up "
                              "next to the recipe, then in the working directory)")
        kwargs["path"] = str(Path(str(spec.path)).expanduser())
    if spec.limit is not None:
        kwargs["limit"] = spec.limit
    kwargs.update(spec.options)
    params = inspect.signature(loader).parameters
    named = [k for k, p in params.items() if k != "self" and p.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key in kwargs:
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
    return loader, kwargs


def _load_dataset(spec: DatasetSpec, section: str, source: str):
    """The dataset of a section; a loader's error (unreadable file, no usable rows, hub unreachable) becomes a
    one-line :class:`RecipeError` naming the file and the section."""
    loader, kwargs = _dataset_kwargs(spec, section, source)
    try:
        dataset = loader(**kwargs)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        message = " ".join(str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc).split())
        raise RecipeError(f"{source}: {section}: {message}") from exc
    if spec.limit is not None and hasattr(dataset, "select") and len(dataset) > spec.limit:
        dataset = dataset.select(range(spec.limit))
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise RecipeError(f"{source}: {section}: the dataset has no rows")
    return dataset


def _looks_local(name: str) -> bool:
    """Whether a model / tokenizer name is meant as a local folder rather than a hub id: it starts with ``./``,
    ``../``, ``/`` or ``~``, or its parent folder exists here (``runs/sft/final``)."""
    if name.startswith(("./", "../", "/", "~", ".\\", "..\\")) or name in (".", ".."):
        return True
    parent = Path(name).parent
    return str(parent) not in ("", ".") and parent.is_dir()


def _check_model_spec(spec: ModelSpec, source: str) -> None:
    """A local-looking model or tokenizer path must exist (a hub id is checked when it is downloaded)."""
    for key in ("name_or_path", "tokenizer"):
        name = getattr(spec, key)
        if not name or name == TINY:
            continue
        if not isinstance(name, str):
            raise RecipeError(f"{source}: model.{key} must be a string, got {name!r}")
        path = Path(name).expanduser()
        if _looks_local(name) and not path.exists():
            raise RecipeError(f"{source}: model.{key}: {name} does not exist (a local folder; hub ids look like "
                              "'org/name')")
        if key == "name_or_path" and path.is_dir() and not any(
                (path / f).is_file() for f in ("config.json", "adapter_config.json")):
            raise RecipeError(f"{source}: model.name_or_path: {name} is a folder without config.json (a saved "
                              "model folder holds config.json and the weights, as save_pretrained writes them)")
    if spec.name_or_path == TINY and spec.tiny is not None and not isinstance(spec.tiny, dict):
        raise RecipeError(f"{source}: model.tiny must be a mapping of TinyModelConfig fields")


def _model_init_kwargs(spec: ModelSpec) -> dict:
    """The ``from_pretrained`` keyword arguments a recipe's model section asks for (none for the tiny model)."""
    if spec.name_or_path == TINY:
        return {}
    init_kwargs = dict(spec.init_kwargs)
    if spec.dtype is not None:
        init_kwargs["dtype"] = spec.dtype
    return init_kwargs


def _load_model(spec: ModelSpec):
    """(model or model id, tokenizer or None)."""
    if spec.name_or_path == TINY:
        from calibrl.models import TinyModelConfig, build_tiny_model

        tiny = dict(spec.tiny or {})
        seed = int(tiny.pop("seed", 0))
        try:
            config = TinyModelConfig(**tiny)
        except TypeError as exc:
            raise RecipeError(f"model.tiny: {exc}") from exc
        return build_tiny_model(config=config, seed=seed)
    tokenizer = None
    if spec.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer)
    return spec.name_or_path, tokenizer


def _peft_config(peft: dict | None):
    if not peft:
        return None
    from peft import LoraConfig

    kwargs = dict(peft)
    kwargs.setdefault("task_type", "CAUSAL_LM")
    return LoraConfig(**kwargs)


def _reward_funcs(recipe: Recipe) -> list:
    """The recipe's reward functions, looked up by name (an unknown name is an error naming ``rewards``)."""
    from calibrl.tasks.registry import get_reward

    funcs = []
    for spec in recipe.rewards:
        try:
            funcs.append(get_reward(spec.name))
        except KeyError as exc:
            raise RecipeError(f"{recipe.source}: rewards: {exc.args[0]}") from None
    return funcs


def _check_fields_read(recipe: Recipe, overrides: dict, args) -> None:
    """An estimator's field that the chosen estimator does not read (``capo_mask`` with ``grpo``) is an error, not a
    silent no-op (:func:`calibrl.trl.config.estimator_fields_read`, from each estimator's registration): the
    recipe's fields are checked against the recipe's own estimator, ``--set`` overrides against the estimator the
    run uses (so ``--set advantage_estimator=grpo`` on a CAPO recipe still gives its GRPO baseline)."""
    from calibrl.trl.config import CalibratedGRPOConfig, ignored_field_error

    own = recipe.trainer
    for section, settings, estimator, mask in (
            ("trainer", own, own.get("advantage_estimator", CalibratedGRPOConfig.advantage_estimator),
             own.get("capo_mask", CalibratedGRPOConfig.capo_mask)),
            ("overrides", overrides, args.advantage_estimator, args.capo_mask)):
        problem = ignored_field_error(settings, estimator=estimator, capo_mask=mask)
        if problem:
            raise RecipeError(f"{recipe.source}: {section}.{problem}")


def validate_recipe(recipe: Recipe, *, overrides: dict | None = None, stand_in_model: bool = False):
    """The recipe's :class:`~calibrl.trl.CalibratedGRPOConfig`, after checking everything that can be checked
    without loading a model or a dataset: field names and types, value ranges, the estimator name and the fields it
    reads, the reward names and ``correctness_reward``, dataset sections and paths, a local model folder, an
    ``output_dir`` that can be a folder. Any problem is a one-line
    :class:`RecipeError` naming the file and the key, so ``calibrl train`` fails in a second, not after loading.
    Creates nothing on disk."""
    from calibrl.advantages import available_estimators
    from calibrl.trl.config import CalibratedGRPOConfig
    source = recipe.source
    trainer_kwargs = check_trainer_fields(recipe.trainer, source)
    trainer_kwargs.update(check_trainer_fields(overrides or {}, source, "overrides"))
    trainer_kwargs.setdefault("output_dir", str(Path("runs") / Path(source).stem))
    trainer_kwargs.setdefault("report_to", "none")
    if not stand_in_model:
        init_kwargs = _model_init_kwargs(recipe.model)
        if init_kwargs:
            merged = dict(trainer_kwargs.get("model_init_kwargs") or {})
            merged.update(init_kwargs)
            trainer_kwargs["model_init_kwargs"] = merged
        _check_model_spec(recipe.model, source)
    weights = [r.weight for r in recipe.rewards]
    if any(w != 1.0 for w in weights) and "reward_weights" not in trainer_kwargs:
        trainer_kwargs["reward_weights"] = weights
    try:
        args = CalibratedGRPOConfig(**trainer_kwargs)
    except (TypeError, ValueError) as exc:
        raise RecipeError(f"{source}: section 'trainer': {' '.join(str(exc).split())}") from exc
    names = available_estimators()
    if args.advantage_estimator not in names:
        close = difflib.get_close_matches(args.advantage_estimator, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RecipeError(f"{source}: trainer.advantage_estimator: unknown estimator {args.advantage_estimator!r}"
                          f"{hint}; registered: {', '.join(names)}")
    _check_fields_read(recipe, overrides or {}, args)
    check_advantage_params(args.advantage_estimator, args.advantage_params, source,
                           "overrides" if "advantage_params" in (overrides or {}) else "trainer")
    output = Path(args.output_dir).expanduser().absolute()
    existing = next((p for p in (output, *output.parents) if p.exists()), None)  # the folder or its nearest parent
    if existing is not None and not existing.is_dir():
        key = "overrides.output_dir" if "output_dir" in (overrides or {}) else "trainer.output_dir"
        what = "" if existing == output else f" ({existing} is a file)"
        raise RecipeError(f"{source}: {key}: {args.output_dir} is not a folder{what}")
    funcs = _reward_funcs(recipe)
    if args.correctness_reward is not None:
        known = [r.name for r in recipe.rewards] + [getattr(f, "__name__", "") for f in funcs]
        if args.correctness_reward not in known:
            raise RecipeError(f"{source}: trainer.correctness_reward: {args.correctness_reward!r} is not one of the "
                              f"recipe's rewards ({', '.join(r.name for r in recipe.rewards)})")
    _dataset_kwargs(recipe.dataset, "dataset", source)
    if recipe.eval_dataset is not None:
        _dataset_kwargs(recipe.eval_dataset, "eval_dataset", source)
    if recipe.calibration_eval_dataset is not None:
        _dataset_kwargs(recipe.calibration_eval_dataset, "calibration_eval.dataset", source)
    return args


def build_trainer(recipe: Recipe, *, model=None, tokenizer=None, overrides: dict | None = None, callbacks=None):
    """A ready :class:`~calibrl.trl.CalibratedGRPOTrainer` for ``recipe``.

    The recipe is validated (:func:`validate_recipe`) and its datasets loaded before any model is built. The
    trainer writes its log history to ``<output_dir>/log_history.jsonl`` (undefined metrics left out).

    Args:
        recipe: from :func:`load_recipe`.
        model, tokenizer: a stand-in model (e.g. the tiny model) used instead of the recipe's (both, or the model
            alone when the recipe's tokenizer loads). Recipe tests build every recipe this way on CPU.
        overrides: CalibratedGRPOConfig fields replacing the recipe's ``trainer`` values (e.g. ``max_steps``).
        callbacks: extra ``transformers.TrainerCallback`` objects.
    """
    from calibrl.trl import CalibratedGRPOTrainer

    source = recipe.source
    args = validate_recipe(recipe, overrides=overrides, stand_in_model=model is not None)
    reward_funcs = _reward_funcs(recipe)
    train_dataset = _load_dataset(recipe.dataset, "dataset", source)
    eval_dataset = _load_dataset(recipe.eval_dataset, "eval_dataset", source) if recipe.eval_dataset else None
    if model is None:
        try:
            model, recipe_tokenizer = _load_model(recipe.model)
        except RecipeError as exc:
            raise RecipeError(f"{source}: {exc}") from exc
        tokenizer = tokenizer if tokenizer is not None else recipe_tokenizer

    trainer = CalibratedGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=_peft_config(recipe.model.peft),
        callbacks=callbacks,
    )
    trainer.callback_handler.callbacks.insert(0, log_history_writer())  # first: the others see filtered logs
    if recipe.calibration_eval is not None:  # held-out calibration: calibrl.trl.callbacks
        from calibrl.trl.callbacks import attach_calibration_eval

        held_out = recipe.calibration_eval_dataset
        dataset = _load_dataset(held_out, "calibration_eval.dataset", source) if held_out else eval_dataset
        attach_calibration_eval(trainer, config=recipe.calibration_eval, dataset=dataset)
    return trainer


# ----------------------------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------------------------

def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete ``checkpoint-N`` folder in ``output_dir`` (None if there is none): a folder a kill cut
    off while it was being saved is passed over (:mod:`calibrl.trl.checkpoints`)."""
    return last_complete_checkpoint(output_dir)[0]


def _remove_if_empty(folder: Path, *, existed: bool) -> None:
    """Remove ``folder`` when this run created it and a failure left it empty (no stray run folders)."""
    try:
        if not existed and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    except OSError:
        pass


def _save_quietly(trainer) -> None:
    """``save_model`` without transformers' "Writing model shards" bar (a second bar under calibrl's own)."""
    with quiet_transformers_bars():
        trainer.save_model(trainer.args.output_dir)


def train(recipe: Recipe, resume: bool = False, *, overrides: dict | None = None, model=None, tokenizer=None,
          progress: bool = True, console=None, result_console=None,
          callbacks: list | None = None) -> dict[str, Any]:
    """Train ``recipe``; with ``resume`` continue from the last checkpoint in its output_dir.

    Returns ``{"output_dir", "global_step", "resumed_from", "summary", "log_history"}``; saves the final model
    in ``output_dir`` and prints a rich summary table (main process). Progress and notes go to ``console``, the
    summary (the run's result) to ``result_console`` (default: ``console``; ``calibrl train``: stderr and stdout).
    """
    from rich.console import Console

    console = console or Console()
    result_console = result_console or console
    overrides = dict(overrides or {})
    callbacks = list(callbacks or [])  # extra transformers TrainerCallbacks (e.g. calibrl.trl.rehearse's)
    if progress:
        overrides.setdefault("disable_tqdm", True)
        callbacks.append(progress_callback(console))
    with warnings.catch_warnings():
        _filter_known_warnings()
        output_dir = Path(validate_recipe(recipe, overrides=overrides, stand_in_model=model is not None).output_dir)
        existed = output_dir.exists()
        trainer, checkpoint, is_main = _run(recipe, resume, overrides, model, tokenizer, callbacks, console, progress,
                                            output_dir, existed)
    summary = summarize(trainer.state.log_history)
    if is_main:
        print_summary(result_console, summary, trainer)
    return {
        "output_dir": trainer.args.output_dir,
        "global_step": trainer.state.global_step,
        "resumed_from": checkpoint,
        "summary": summary,
        "log_history": trainer.state.log_history,
    }


def _run(recipe, resume, overrides, model, tokenizer, callbacks, console, progress, output_dir, existed):
    """Builds the trainer, trains (from the last checkpoint with ``resume``), evaluates, saves; a failure removes
    the output folder when this run created it and left it empty. Returns (trainer, checkpoint, is_main)."""
    try:
        trainer = build_trainer(recipe, model=model, tokenizer=tokenizer, overrides=overrides, callbacks=callbacks)
        if progress:
            from transformers.trainer_callback import PrinterCallback

            trainer.remove_callback(PrinterCallback)  # the rich bar replaces the printed log dicts
        checkpoint, torn = last_complete_checkpoint(trainer.args.output_dir) if resume else (None, [])
        is_main = trainer.accelerator.is_main_process
        for folder, problem in torn if is_main else ():
            console.print(f"--resume: skipping {folder}: incomplete, {problem}", markup=False, highlight=False)
        if resume and checkpoint is None and is_main:
            console.print(f"[yellow]--resume: no {'complete ' if torn else ''}checkpoint in "
                          f"{trainer.args.output_dir}; starting from scratch")
        elif checkpoint and is_main:
            console.print(f"resuming from {checkpoint}" + (" (the last complete checkpoint)" if torn else ""))
            args = trainer.args
            if inside_generation_block(int(Path(checkpoint).name.rsplit("-", 1)[1]),
                                       gradient_accumulation_steps=args.gradient_accumulation_steps,
                                       steps_per_generation=args.steps_per_generation,
                                       num_iterations=args.num_iterations):
                console.print(f"note: {Path(checkpoint).name} ends inside a generation block (steps_per_generation "
                              f"{args.steps_per_generation} x num_iterations {args.num_iterations}); its completions "
                              "are generated again, so the run will not be bit-identical to an uninterrupted one",
                              markup=False, highlight=False)
        trainer.train(resume_from_checkpoint=checkpoint)
        final = trainer.state.global_step
        evaluated = any(h.get("step") == final and "eval_runtime" in h for h in trainer.state.log_history)
        if trainer.eval_dataset is not None and not evaluated:  # eval_strategy "steps" may have run it already
            trainer.evaluate()
        if progress:
            _save_quietly(trainer)
        else:
            trainer.save_model(trainer.args.output_dir)
    except BaseException:
        _remove_if_empty(output_dir, existed=existed)
        raise
    return trainer, checkpoint, is_main
