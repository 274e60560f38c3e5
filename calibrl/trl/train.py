"""``calibrl train``: a parsed recipe (:mod:`calibrl.trl.recipes`) -> a ready ``CalibratedGRPOTrainer`` -> training.

Datasets and rewards are looked up by name in :mod:`calibrl.tasks.registry`; the model is a hub id, a local folder
or ``builtin:tiny`` (the testbed's model, :mod:`calibrl.models`). Progress shows reward and calibration
while training; the end prints a summary of the last logged steps.

API: :func:`load_recipe` (from :mod:`calibrl.trl.recipes`), :func:`build_trainer`, :func:`train`.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from calibrl._files import FolderInUse, folder_lock
from calibrl.advantages import EstimatorFailed
from calibrl.trl.checkpoints import (checkpoint_step, inside_generation_block, last_complete_checkpoint, run_contents,
                                     train_loss_keeper, weights_problem)
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
    "LOG_HISTORY", "RecipeError", "build_trainer", "end_process_group", "last_checkpoint", "load_recipe",
    "summarize", "train", "validate_recipe",
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


def _check_fills_a_generation_batch(dataset, args, source: str) -> None:
    """TRL's ``RepeatSampler`` draws ``generation_batch_size / num_generations`` distinct prompts per generation
    batch and drops an incomplete one, so a dataset with fewer prompts trains 0 steps and "succeeds" (transformers
    only logs it). Refused here with the numbers, on every rank alike (``args.world_size`` is the launch's)."""
    try:
        n_prompts = len(dataset)
    except TypeError:  # a streaming dataset: its length is unknown
        return
    needed = args.generation_batch_size // args.num_generations
    if n_prompts < needed:
        raise RecipeError(
            f"{source}: dataset: {n_prompts} prompts, fewer than the {needed} distinct prompts one generation batch "
            f"draws (generation_batch_size {args.generation_batch_size} = per_device_train_batch_size "
            f"{args.per_device_train_batch_size} x {args.world_size} process(es) x steps_per_generation "
            f"{args.steps_per_generation}, / num_generations {args.num_generations}), so TRL would train 0 steps; "
            "give more prompts or a smaller batch")


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
        if key == "name_or_path" and path.is_dir():
            _check_model_folder(path, name, source)
    if spec.name_or_path == TINY and spec.tiny is not None and not isinstance(spec.tiny, dict):
        raise RecipeError(f"{source}: model.tiny must be a mapping of TinyModelConfig fields")


_MODEL_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.h5", "*.msgpack", "*.index.json")


def _check_model_folder(path: Path, name: str, source: str) -> None:
    """A local model folder holds a ``config.json`` (or a PEFT adapter's ``adapter_config.json``) that reads as a
    JSON mapping, and weights (what ``save_pretrained`` writes), so a wrong folder is refused before loading."""
    configs = [path / f for f in ("config.json", "adapter_config.json") if (path / f).is_file()]
    if not configs:
        raise RecipeError(f"{source}: model.name_or_path: {name} is a folder without config.json (a saved "
                          "model folder holds config.json and the weights, as save_pretrained writes them)")
    for config in configs:
        try:
            parsed = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            detail = exc.strerror if isinstance(exc, OSError) else " ".join(str(exc).split())
            raise RecipeError(f"{source}: model.name_or_path: {config} does not read as JSON ({detail})") from None
        if not isinstance(parsed, dict):
            raise RecipeError(f"{source}: model.name_or_path: {config} holds {type(parsed).__name__}, not a JSON "
                              "mapping of model settings")
    if not any(any(path.glob(pattern)) for pattern in _MODEL_WEIGHTS):
        raise RecipeError(f"{source}: model.name_or_path: {name} holds no weights (no .safetensors or .bin "
                          "file; save_pretrained writes them beside config.json)")


def _check_hub_model(name: str, source: str, init_kwargs: dict) -> None:
    """A hub id that is not in the local hub cache must be downloadable (:func:`calibrl.models.hub_problem`): one
    line now rather than a traceback after transformers' retries."""
    from calibrl.models import hub_problem

    problem = hub_problem(name, cache_dir=init_kwargs.get("cache_dir"), revision=init_kwargs.get("revision"))
    if problem:
        raise RecipeError(f"{source}: model.name_or_path: {problem}")


def _check_decision_classes(spec: ModelSpec, classes: list[str] | None, tokenizer, source: str) -> None:
    """Each decision class must have a single-token spelling of its own in the run's tokenizer (the rule the
    trainer applies, :func:`calibrl.trl.decision.class_tokens`), checked with the tokenizer alone, before the model
    loads. A tokenizer that does not load here (a GGUF builtin, a hub id) is checked when the trainer is built."""
    if not classes:
        return
    if tokenizer is None and spec.name_or_path == TINY:
        from calibrl.models import build_char_tokenizer

        tokenizer = build_char_tokenizer()
    elif tokenizer is None and not spec.name_or_path.startswith("builtin:"):
        from transformers import AutoTokenizer

        try:
            with quiet_transformers_bars():
                tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer or spec.name_or_path)
        except (OSError, ValueError):
            return  # the model's own load names the problem
    if tokenizer is None:
        return
    from calibrl.trl.decision import class_tokens

    try:
        class_tokens(tokenizer, list(classes))
    except ValueError as exc:
        raise RecipeError(f"{source}: trainer.{' '.join(str(exc).split())}") from None


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


def _peft_config(peft: dict | None, source: str = "<recipe>"):
    """The recipe's ``peft.LoraConfig`` (None without a ``peft`` section); an unknown key or a value LoraConfig
    refuses is a one-line :class:`RecipeError` naming ``model.peft``."""
    if not peft:
        return None
    import dataclasses

    from peft import LoraConfig

    known = [f.name for f in dataclasses.fields(LoraConfig) if f.init]
    for key in peft:
        if key not in known:
            raise unknown_key_error(key, "model.peft", known, source)
    kwargs = dict(peft)
    kwargs.setdefault("task_type", "CAUSAL_LM")
    try:
        return LoraConfig(**kwargs)
    except (TypeError, ValueError) as exc:
        raise RecipeError(f"{source}: model.peft: {' '.join(str(exc).split())}") from None


def _reward_funcs(recipe: Recipe) -> list:
    """The recipe's reward functions, looked up by name (an unknown name is an error naming ``rewards``)."""
    from calibrl.tasks.registry import get_reward

    funcs = []
    for spec in recipe.rewards:
        try:
            fn = get_reward(spec.name)
        except KeyError as exc:
            raise RecipeError(f"{recipe.source}: rewards: {exc.args[0]}") from None
        funcs.append(_with_params(fn, spec, recipe.source) if spec.params else fn)
    return funcs


def _with_params(fn, spec, source: str):
    """``fn`` with the recipe's ``params`` as keyword arguments, under the reward's own name (TRL logs
    ``rewards/<__name__>``); a keyword the reward does not take is an error naming it."""
    import functools
    import inspect

    taken = inspect.signature(fn).parameters
    named = {k for k, p in taken.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    unknown = sorted(set(spec.params) - named - {"prompts", "completions"})
    if unknown:
        raise RecipeError(f"{source}: rewards: {spec.name!r} takes no parameter {', '.join(map(repr, unknown))} "
                          f"(it takes {', '.join(sorted(named - {'prompts', 'completions'}))})")

    @functools.wraps(fn)
    def reward(prompts, completions, **columns):
        return fn(prompts, completions, **columns, **spec.params)

    return reward


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


# Counts TRL and transformers take without checking (0 divides by zero in TRL's config or fails in torch's sampler
# after the model loaded; a negative logging_steps logs never): each must be >= 1, or > 0 for the *_steps fields,
# which also take a fraction of the run (0.1 = every tenth of max_steps).
_POSITIVE_COUNTS = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                    "num_generations", "num_generations_eval", "num_iterations", "steps_per_generation",
                    "generation_batch_size")
_POSITIVE_INTERVALS = ("logging_steps", "save_steps", "eval_steps")


def _check_counts(settings: dict, section: str, source: str) -> None:
    for key in _POSITIVE_COUNTS + _POSITIVE_INTERVALS:
        value = settings.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # unset, or a type check_trainer_fields already refused
        if key in _POSITIVE_COUNTS and value < 1:
            raise RecipeError(f"{source}: {section}.{key}: must be an integer >= 1, got {value!r}")
        if key in _POSITIVE_INTERVALS and not value > 0:
            raise RecipeError(f"{source}: {section}.{key}: must be > 0 (a number of steps, or a fraction of the run "
                              f"below 1), got {value!r}")


def _output_key(overrides: dict | None) -> str:
    return "overrides.output_dir" if "output_dir" in (overrides or {}) else "trainer.output_dir"


def _check_writable(existing: Path, output_dir: str, where: str) -> None:
    """The run can write in ``existing``: the output folder itself (``os.access``, which also answers no on a
    read-only mount, so a folder holding a run is left untouched, its times included), or its nearest existing
    parent, where a temporary folder is made and removed (what creating the output folder will need)."""
    if existing == Path(output_dir).expanduser().absolute():
        if not os.access(existing, os.W_OK | os.X_OK):
            raise RecipeError(f"{where}: cannot write in {output_dir} (no permission, or a read-only file system)")
        return
    try:
        tempfile.TemporaryDirectory(dir=existing, prefix=".calibrl-write-check-").cleanup()
    except OSError as exc:
        raise RecipeError(f"{where}: cannot write in {existing} ({exc.strerror or type(exc).__name__}), so not "
                          f"{output_dir} either") from None


def validate_recipe(recipe: Recipe, *, overrides: dict | None = None, stand_in_model: bool = False):
    """The recipe's :class:`~calibrl.trl.CalibratedGRPOConfig`, after checking everything that can be checked
    without loading a model or a dataset: field names and types, value ranges, the estimator name and the fields it
    reads, counts that must be positive (batch sizes, ``num_generations``, ``logging_steps``, ...), the reward names
    and ``correctness_reward``, dataset sections and paths, a local model folder (a JSON ``config.json`` and
    weights), ``model.peft``'s keys, an ``output_dir`` that can be a folder and can be written. Any problem is a
    one-line :class:`RecipeError` naming the file and the key, so ``calibrl train`` fails in a second, not after
    loading. Leaves nothing on disk (where the output folder does not exist yet, the write check makes and removes
    a temporary folder in its nearest existing parent)."""
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
    for section, settings in (("trainer", recipe.trainer), ("overrides", overrides or {})):
        _check_counts(settings, section, source)
    weights = [r.weight for r in recipe.rewards]
    if any(w != 1.0 for w in weights) and "reward_weights" not in trainer_kwargs:
        trainer_kwargs["reward_weights"] = weights
    try:
        args = CalibratedGRPOConfig(**trainer_kwargs)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        message = " ".join(str(exc).split())
        if "bf16/gpu" in message or "fp16" in message.lower() and "gpu" in message.lower():
            from calibrl.trl.recipes import RECIPES_DIR

            half = "bf16" if trainer_kwargs.get("bf16") else "fp16"
            name = Path(source).stem if Path(source).parent == RECIPES_DIR else source
            raise RecipeError(
                f"{source}: trainer.{half}: true needs a GPU, and this machine has none; rehearse the recipe on the "
                f"CPU with `calibrl train {name} --rehearse` (2 steps at tiny width, no download), or train on the "
                f"CPU with --set {half}=false") from None
        raise RecipeError(f"{source}: section 'trainer': {message}") from exc
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
    if existing is not None:
        _check_writable(existing, args.output_dir, f"{source}: {_output_key(overrides)}")
    if not stand_in_model:
        _peft_config(recipe.model.peft, source)
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
    args = validate_recipe(recipe, overrides=overrides, stand_in_model=model is not None)
    inputs = _prepare(recipe, args, model=model, tokenizer=tokenizer)
    return _construct(recipe, inputs, model=model, tokenizer=tokenizer, callbacks=callbacks)


@dataclass
class _Inputs:
    """What a run needs besides its model, gathered (and checked) before any model loads or any file moves."""

    args: Any
    reward_funcs: list
    train_dataset: Any
    eval_dataset: Any
    calibration_dataset: Any


def _prepare(recipe: Recipe, args, *, model=None, tokenizer=None) -> _Inputs:
    """Every check that needs the data or the hub but not the model: a hub id that cannot be had, decision classes
    without a token of their own, and the datasets, loaded here once."""
    source = recipe.source
    reward_funcs = _reward_funcs(recipe)
    if model is None:
        name = recipe.model.name_or_path
        if name != TINY and not name.startswith("builtin:") and not _looks_local(name) and not Path(name).exists():
            _check_hub_model(name, source, recipe.model.init_kwargs or {})
    if model is None or tokenizer is not None:  # a stand-in model without its tokenizer: checked by the trainer
        _check_decision_classes(recipe.model, args.decision_classes, tokenizer, source)
    train_dataset = _load_dataset(recipe.dataset, "dataset", source)
    eval_dataset = _load_dataset(recipe.eval_dataset, "eval_dataset", source) if recipe.eval_dataset else None
    calibration_dataset = None
    if recipe.calibration_eval is not None:
        held_out = recipe.calibration_eval_dataset
        calibration_dataset = (_load_dataset(held_out, "calibration_eval.dataset", source) if held_out
                               else eval_dataset)
    return _Inputs(args=args, reward_funcs=reward_funcs, train_dataset=train_dataset, eval_dataset=eval_dataset,
                   calibration_dataset=calibration_dataset)


def _construct(recipe: Recipe, inputs: _Inputs, *, model=None, tokenizer=None, callbacks=None):
    """The trainer of :func:`build_trainer`, from what :func:`_prepare` gathered: loads the model (unless a stand-in
    is given), builds the trainer, adds the log writer and the held-out calibration callback."""
    from calibrl.trl import CalibratedGRPOTrainer

    source = recipe.source
    if model is None:
        try:
            model, recipe_tokenizer = _load_model(recipe.model)
        except RecipeError as exc:
            raise RecipeError(f"{source}: {exc}") from exc
        tokenizer = tokenizer if tokenizer is not None else recipe_tokenizer

    try:
        trainer = CalibratedGRPOTrainer(
            model=model,
            reward_funcs=inputs.reward_funcs,
            args=inputs.args,
            train_dataset=inputs.train_dataset,
            eval_dataset=inputs.eval_dataset,
            processing_class=tokenizer,
            peft_config=_peft_config(recipe.model.peft, source),
            callbacks=callbacks,
        )
    except ValueError as exc:  # the classes checked against the tokenizer (calibrl.trl.decision.class_tokens)
        if str(exc).startswith("decision_classes"):
            raise RecipeError(f"{source}: trainer.{' '.join(str(exc).split())}") from None
        raise
    trainer.callback_handler.callbacks.insert(0, log_history_writer())  # first: the others see filtered logs
    trainer.callback_handler.callbacks.insert(0, train_loss_keeper(trainer))  # before the writer: it sets train_loss
    if recipe.calibration_eval is not None:  # held-out calibration: calibrl.trl.callbacks
        from calibrl.trl.callbacks import attach_calibration_eval

        attach_calibration_eval(trainer, config=recipe.calibration_eval, dataset=inputs.calibration_dataset)
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


def _move_aside(output: Path, where: str) -> Path:
    """Renames the folder ``output`` to a sibling ``<name>.replaced-<UTC time>`` and returns it (``--overwrite``)."""
    resolved, here = output.resolve(), Path.cwd().resolve()
    if resolved == here or resolved in here.parents or resolved == Path.home().resolve():
        raise RecipeError(f"{where}: --overwrite would move {output} aside, and it is the working directory, one of "
                          "its parents or the home folder; give the run a folder of its own")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target, n = output.with_name(f"{output.name}.replaced-{stamp}"), 2
    while target.exists():
        target, n = output.with_name(f"{output.name}.replaced-{stamp}-{n}"), n + 1
    try:
        output.rename(target)
    except OSError as exc:
        raise RecipeError(f"{where}: --overwrite: cannot move {output} aside to {target.name} "
                          f"({exc.strerror or type(exc).__name__}); move or remove it yourself") from None
    return target


def _read_log_history(output: Path) -> list[dict]:
    """The records of ``<output>/log_history.jsonl`` (a line that does not parse is left out)."""
    records = []
    path = output / LOG_HISTORY
    for line in path.read_text().splitlines() if path.is_file() else ():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _checkpoint_max_steps(checkpoint: str | None) -> int | None:
    try:
        value = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("max_steps")
    except (TypeError, OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _start(args, where: str, *, resume: bool, overwrite: bool, say) -> tuple[str | None, int | None]:
    """What to do with the output folder before anything loads: (the checkpoint to resume from or None, the step a
    finished run ended at, or None). A folder holding a run (:func:`~calibrl.trl.checkpoints.run_contents`) is
    refused without ``resume`` or ``overwrite``; ``overwrite`` moves it aside; ``resume`` continues from the newest
    checkpoint that is complete and loads (finite weights), or reports a finished run and changes nothing."""
    output = Path(args.output_dir)
    if resume and overwrite:
        raise RecipeError(f"{where}: --resume continues the run in {output} and --overwrite moves it aside: "
                          "give one of them")
    found = run_contents(output)
    listed = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    if found and overwrite:
        say(f"--overwrite: moved the earlier run in {output} to {_move_aside(output, where)}")
        return None, None
    if found and not resume:
        raise RecipeError(f"{where}: {output} holds a run ({listed}); pass --resume to continue it, or --overwrite "
                          "to move it aside and start again")
    if not resume:
        return None, None
    checkpoint, skipped = last_complete_checkpoint(output, loadable=True)
    for folder, problem in skipped:
        say(f"--resume: skipping {folder}: {problem}")
    reached = [s for s in (checkpoint_step(checkpoint) if checkpoint else None,
                           max((r["step"] for r in _read_log_history(output)
                                if "train_runtime" in r and isinstance(r.get("step"), int)), default=None))
               if s is not None]
    target = args.max_steps if args.max_steps > 0 else _checkpoint_max_steps(checkpoint)
    final_model = weights_problem(output, loadable=False) is None
    ended = max(reached, default=None)
    if final_model and ended is not None and (target is None or ended >= target):
        say(f"--resume: the run in {output} has finished (step {ended}{f' of {target}' if target else ''}); "
            "nothing to do, no file changed (a larger --max-steps continues it; --overwrite starts again)")
        return None, ended
    if checkpoint is not None:
        note = " (the last complete checkpoint)" if skipped else ""
        say(f"resuming from {checkpoint}{note}")
        if inside_generation_block(checkpoint_step(checkpoint), gradient_accumulation_steps=args.gradient_accumulation_steps,
                                   steps_per_generation=args.steps_per_generation, num_iterations=args.num_iterations):
            say(f"note: {Path(checkpoint).name} ends inside a generation block (steps_per_generation "
                f"{args.steps_per_generation} x num_iterations {args.num_iterations}); its completions are generated "
                "again, so the run will not be bit-identical to an uninterrupted one")
        return checkpoint, None
    if final_model:
        raise RecipeError(f"{where}: --resume: {output} holds a run ({listed}) but no complete checkpoint to continue "
                          "from; --overwrite moves it aside and starts again")
    if found:  # an earlier run with nothing to continue from: kept aside, never written over
        why = "; ".join(f"{Path(folder).name}: {problem}" for folder, problem in skipped) or "no checkpoint"
        say(f"--resume: nothing in {output} to continue from ({why}); moved the earlier run to "
            f"{_move_aside(output, where)} and starting from scratch")
        return None, None
    say(f"--resume: no run in {output} yet; starting from scratch")
    return None, None


def _finished_result(args, step: int, console, result_console, is_main: bool) -> dict[str, Any]:
    """train()'s result for a finished run that ``--resume`` left as it was: its summary from its log."""
    history = _read_log_history(Path(args.output_dir))
    summary = summarize(history)
    if is_main:
        print_summary(result_console, summary,
                      SimpleNamespace(args=args, state=SimpleNamespace(global_step=step, log_history=history)))
    return {"output_dir": args.output_dir, "global_step": step, "resumed_from": None, "summary": summary,
            "log_history": history}


def train(recipe: Recipe, resume: bool = False, *, overwrite: bool = False, overrides: dict | None = None,
          model=None, tokenizer=None, progress: bool = True, console=None, result_console=None,
          callbacks: list | None = None) -> dict[str, Any]:
    """Train ``recipe``; with ``resume`` continue from the last checkpoint in its output_dir.

    An output folder that holds a run is refused (:class:`RecipeError`) unless ``resume`` (continue it; a finished
    run is left as it is and its summary returned) or ``overwrite`` (move it aside to ``<name>.replaced-<UTC
    time>``, then start afresh).

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
        args = validate_recipe(recipe, overrides=overrides, stand_in_model=model is not None)
        output_dir, is_main = Path(args.output_dir), args.process_index == 0
        where = f"{recipe.source}: {_output_key(overrides)}"

        def say(text: str) -> None:
            if is_main:
                console.print(text, markup=False, highlight=False, soft_wrap=True)

        try:  # one command per run folder, from here to the end (the main process holds the lock for the launch)
            lock = folder_lock(output_dir, what="calibrl train") if is_main else contextlib.nullcontext()
            with lock as stale:
                if stale:
                    say(stale)
                # every refusal that needs no model comes before the folder is touched (--overwrite moves it)
                inputs = _prepare(recipe, args, model=model, tokenizer=tokenizer)
                _check_fills_a_generation_batch(inputs.train_dataset, args, recipe.source)
                with args.main_process_first(local=False, desc="checking the output folder"):
                    checkpoint, finished = _start(args, where, resume=resume, overwrite=overwrite, say=say)
                if finished is not None:
                    return _finished_result(args, finished, console, result_console, is_main)
                trainer, is_main = _run(recipe, inputs, checkpoint, model, tokenizer, callbacks, progress,
                                        output_dir, existed=output_dir.exists())
        except FolderInUse as exc:
            raise RecipeError(f"{where}: {exc}") from None
        except EstimatorFailed as exc:
            kept = last_checkpoint(output_dir)
            raise EstimatorFailed(f"{exc}; the run stopped, " + (
                f"its last checkpoint {kept} kept (--resume continues from it)" if kept else
                "before its first checkpoint")) from exc.__cause__
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


def end_process_group() -> None:
    """Ends a multi-process run (``accelerate launch`` / ``torchrun``) cleanly: every rank waits for the others, then
    destroys torch.distributed's default group, as accelerate's ``Accelerator.end_training`` does. Without it, gloo's
    worker threads can outlive the interpreter and abort the process at exit (SIGABRT, "terminate called without an
    active exception"), so the launcher reports a finished run as failed. A no-op in one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from accelerate import PartialState  # its barrier knows the backend's device (NCCL, XLA, ...)

        state = PartialState()
        state.wait_for_everyone()
        state.destroy_process_group()


def _run(recipe, inputs: _Inputs, checkpoint, model, tokenizer, callbacks, progress, output_dir, *, existed):
    """Builds the trainer, trains (from ``checkpoint`` when given), evaluates, saves; a failure removes the output
    folder when this run created it and left it empty. Returns (trainer, is_main). With ``progress`` (calibrl's
    bar) transformers draws none of its own: no "Loading weights" as the model and the reference load, no "Writing
    model shards" at each checkpoint and at the end."""
    try:
        with quiet_transformers_bars() if progress else contextlib.nullcontext():
            trainer = _construct(recipe, inputs, model=model, tokenizer=tokenizer, callbacks=callbacks)
            if progress:
                from transformers.trainer_callback import PrinterCallback

                trainer.remove_callback(PrinterCallback)  # the rich bar replaces the printed log dicts
            is_main = trainer.accelerator.is_main_process
            trainer.train(resume_from_checkpoint=checkpoint)
            final = trainer.state.global_step
            evaluated = any(h.get("step") == final and "eval_runtime" in h for h in trainer.state.log_history)
            if trainer.eval_dataset is not None and not evaluated:  # eval_strategy "steps" may have run it already
                trainer.evaluate()
            trainer.save_model(trainer.args.output_dir)
    except BaseException:
        _remove_if_empty(output_dir, existed=existed)
        raise
    return trainer, is_main
