"""YAML training recipes for ``calibrl train``: load, validate, build a :class:`~calibrl.trl.CalibratedGRPOTrainer`.

A recipe::

    model:                                 # or simply  model: Qwen/Qwen2.5-Math-1.5B  /  model: "builtin:tiny"
      name_or_path: Qwen/Qwen2.5-Math-1.5B # hub id, local folder, .gguf file, "builtin:smollm2-135m-instruct"
                                           # (calibrl.models) or "builtin:tiny" (calibrl.models)
      dtype: bfloat16                      # float32 | bfloat16 | float16 | auto
      peft: {r: 16, lora_alpha: 32, target_modules: all-linear}   # optional LoRA (peft.LoraConfig fields)
    dataset: {name: deepscaler, split: train, path: null, limit: null}   # calibrl.tasks.registry name
    eval_dataset: {name: math500, split: test, limit: 100}             # optional, same shape
    rewards: [math]                        # registered reward names; or [{name: math, weight: 1.0}, ...]; a reward's
                                           # keyword arguments as params: {name: risk_threshold, params: {threshold: 0.75}}
    trainer:                               # any CalibratedGRPOConfig / GRPOConfig field, TRL's own names
      output_dir: runs/capo
      learning_rate: 1.0e-6
      advantage_estimator: capo
      capo_tau: 0.6
    calibration_eval: {every: 10, prompts: 32, k: 4}   # optional: calibrl.trl.callbacks.CalibrationEvalConfig fields
                                                       # (+ dataset: a section; default: eval_dataset's prompts)
    plugins: [my_estimators]               # optional: modules imported before the recipe is checked (a user's
                                           # register_estimator / register_reward / register_dataset, on PYTHONPATH)

Unknown keys are errors that name the key, the section and the file (with the closest valid name). Extra keys
in a dataset section (or its ``options:`` mapping) are passed to the dataset loader (e.g. ``template:
qwen-math-chat``) and must be one of its named parameters, so a typo (``tempalte``) is an error. Keyword
arguments for the hub's ``datasets.load_dataset`` (``revision``, ``data_dir``, ...) go under ``load_kwargs:``
(a mapping), accepted only by loaders that take ``**kwargs`` (the built-in benchmark loaders do).

``plugins`` are imported first, so the rest of the recipe may name what they register (docs/custom-estimator.md).
The entries of ``trainer.advantage_params`` must be parameters of the estimator, of the types its signature declares
(:func:`check_advantage_params`).

Values must have the type of their CalibratedGRPOConfig field (``learning_rate: fast`` is an error naming the key);
``1e-5`` without a dot reads as a float. A relative dataset ``path`` is looked up next to the recipe file first,
then in the working directory. The recipes shipped in the package (``calibrl/recipes/``, their small data in
``calibrl/recipes/data/``) load by name: ``load_recipe("tiny_cpu")``; :func:`shipped_recipes` lists them.

API: :func:`load_recipe` / :func:`parse_recipe` here; :func:`calibrl.trl.train.build_trainer` and
:func:`calibrl.trl.train.train` build and run the trainer.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from calibrl.models import TINY  # light: no torch at import

__all__ = [
    "RecipeError", "ModelSpec", "DatasetSpec", "RewardSpec", "Recipe", "load_recipe", "parse_recipe",
    "trainer_fields", "check_trainer_fields", "unknown_key_error", "load_yaml", "shipped_recipes",
    "resolve_recipe_path", "RECIPES_DIR", "check_advantage_params", "import_plugins",
]

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"  # the recipes shipped in the package


class _RecipeLoader(yaml.SafeLoader):
    """PyYAML's safe loader reading ``1e-5`` (no dot) as a float, as YAML 1.2 and Python do; PyYAML alone reads
    it as the string "1e-5", which would then be rejected as a learning rate. A key given twice in one mapping is
    an error (PyYAML alone keeps the last value silently, so the first one looks set but is not)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first given at line {first_line[key]})",
                        key_node.start_mark)
                first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def load_yaml(text: str) -> Any:
    """``text`` parsed as YAML the way recipes and ``--set`` values are (``1e-5`` is a float)."""
    return yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 (a SafeLoader subclass)


class RecipeError(ValueError):
    """A recipe is malformed; the message names the file, the section and the key."""


@dataclass
class ModelSpec:
    name_or_path: str
    dtype: str | None = None
    peft: dict | None = None
    tokenizer: str | None = None  # tokenizer path if not the model's
    init_kwargs: dict = field(default_factory=dict)  # extra from_pretrained kwargs (attn_implementation, ...)
    tiny: dict | None = None  # TinyModelConfig fields for builtin:tiny (+ seed)


@dataclass
class DatasetSpec:
    name: str | None = None
    split: str | None = None
    path: str | None = None
    limit: int | None = None
    options: dict = field(default_factory=dict)  # extra keyword arguments for the loader (its named parameters)
    load_kwargs: dict = field(default_factory=dict)  # passed through the loader's **kwargs (hub load_dataset)


@dataclass
class RewardSpec:
    name: str
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the reward (e.g. a threshold)


@dataclass
class Recipe:
    """A parsed recipe. ``trainer`` holds CalibratedGRPOConfig keyword arguments (validated names)."""

    model: ModelSpec
    dataset: DatasetSpec
    rewards: list[RewardSpec]
    trainer: dict[str, Any]
    eval_dataset: DatasetSpec | None = None
    source: str = "<recipe>"
    calibration_eval: Any = None  # a calibrl.trl.callbacks.CalibrationEvalConfig when the recipe sets the key
    calibration_eval_dataset: DatasetSpec | None = None  # its held-out prompts when not the eval_dataset's
    plugins: list[str] = field(default_factory=list)  # modules imported before the recipe was checked


_TOP_KEYS = ("model", "dataset", "eval_dataset", "rewards", "trainer", "calibration_eval", "plugins")


def trainer_fields() -> set[str]:
    """Names accepted in the ``trainer`` section: every init field of CalibratedGRPOConfig."""
    return set(_trainer_specs())


def unknown_key_error(key: str, section: str, valid, source: str) -> RecipeError:
    """An unknown-key error naming the file, the section and the closest valid key."""
    close = difflib.get_close_matches(key, list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return RecipeError(f"{source}: unknown key {key!r} in section {section!r}{hint}")


def _check_builtin(name: Any, source: str) -> None:
    """A ``builtin:`` model name must be one calibrl knows (checked here, before anything loads; the GGUF-backed
    ones are converted by :func:`calibrl.models.resolve_model` when the trainer is built)."""
    from calibrl.models import is_builtin, known_builtins

    if isinstance(name, str) and name.startswith("builtin:") and name != TINY and not is_builtin(name):
        known = ", ".join(known_builtins())
        raise RecipeError(f"{source}: model.name_or_path: unknown builtin model {name!r}; known: {known}")


def _parse_model(raw: Any, source: str) -> ModelSpec:
    if isinstance(raw, str):
        _check_builtin(raw, source)
        return ModelSpec(name_or_path=raw)
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: section 'model' must be a mapping or a model name, got {type(raw).__name__}")
    known = {f.name for f in dataclasses.fields(ModelSpec)}
    for key in raw:
        if key not in known:
            raise unknown_key_error(key, "model", known, source)
    if not raw.get("name_or_path"):
        raise RecipeError(f"{source}: section 'model' needs 'name_or_path' (hub id, folder or {TINY!r})")
    if raw.get("peft") is not None and not isinstance(raw["peft"], dict):
        raise RecipeError(f"{source}: model.peft must be a mapping of peft.LoraConfig fields")
    _check_builtin(raw["name_or_path"], source)
    spec = ModelSpec(**{k: v for k, v in raw.items() if v is not None})
    if spec.dtype not in (None, "auto", "float32", "bfloat16", "float16"):
        raise RecipeError(f"{source}: model.dtype must be float32, bfloat16, float16 or auto, got {spec.dtype!r}")
    return spec


def _parse_dataset(raw: Any, section: str, source: str) -> DatasetSpec:
    if isinstance(raw, str):
        return DatasetSpec(name=raw)
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: section {section!r} must be a mapping, got {type(raw).__name__}")
    raw = dict(raw)
    options = dict(raw.pop("options", None) or {})
    load_kwargs = raw.pop("load_kwargs", None) or {}
    if not isinstance(load_kwargs, dict):
        raise RecipeError(f"{source}: {section}.load_kwargs must be a mapping of datasets.load_dataset arguments")
    known = {"name", "split", "path", "limit"}
    spec = DatasetSpec(**{k: raw.pop(k) for k in list(raw) if k in known})
    options.update(raw)  # extra keys go to the loader; checked against its signature in _load_dataset
    spec.options = options
    spec.load_kwargs = dict(load_kwargs)
    if not spec.name:
        raise RecipeError(f"{source}: section {section!r} needs 'name' (a registered dataset; path= for local files)")
    if spec.limit is not None and (not isinstance(spec.limit, int) or spec.limit <= 0):
        raise RecipeError(f"{source}: {section}.limit must be a positive integer or null, got {spec.limit!r}")
    return spec


def _parse_rewards(raw: Any, source: str) -> list[RewardSpec]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise RecipeError(f"{source}: section 'rewards' must be a non-empty list of reward names")
    out = []
    for item in raw:
        if isinstance(item, str):
            out.append(RewardSpec(item))
        elif isinstance(item, dict):
            for key in item:
                if key not in ("name", "weight", "params"):
                    raise unknown_key_error(key, "rewards", ("name", "weight", "params"), source)
            if "name" not in item:
                raise RecipeError(f"{source}: every entry of 'rewards' needs a 'name'")
            weight = item.get("weight", 1.0)
            if not isinstance(weight, (int, float)) or isinstance(weight, bool):
                raise RecipeError(f"{source}: rewards: the weight of {item['name']!r} must be a number, got {weight!r}")
            params = item.get("params") or {}
            if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
                raise RecipeError(f"{source}: rewards: the params of {item['name']!r} must be a mapping of keyword "
                                  f"arguments, got {params!r}")
            out.append(RewardSpec(item["name"], float(weight), dict(params)))
        else:
            raise RecipeError(f"{source}: rewards entries must be names or {{name, weight, params}}, got {item!r}")
    return out


def type_spec(tp: Any) -> Any:
    """A JSON-able form of the annotation ``tp`` holding what :func:`spec_matches` and :func:`spec_name` need:
    ``"any"``, ``"null"``, ``"bool"``, ``"int"``, ``"float"``, ``"str"``, ``"dict"``, ``{"list": spec or None}``,
    ``{"literal": [values]}``, ``{"union": [specs]}``, ``{"enum": name}`` or ``{"type": "module.qualname"}``; an
    annotation it does not know (``Callable``, a string that did not resolve) is ``"any"``. The trainer fields'
    forms are shipped in :mod:`calibrl.trl.trainer_fields`, so a recipe is checked without importing TRL."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return "any"
    if origin is typing.Union or origin is types.UnionType:
        return {"union": [type_spec(a) for a in args]}
    if tp is type(None):
        return "null"
    if origin is typing.Literal:
        return {"literal": list(args)}
    if tp in (bool, int, float, str):
        return tp.__name__
    if tp in (list, tuple) or origin in (list, tuple):
        return {"list": type_spec(args[0]) if args else None}
    if tp is dict or origin is dict:
        return "dict"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": tp.__name__}
    return {"type": f"{tp.__module__}.{tp.__qualname__}"} if isinstance(tp, type) else "any"


def spec_matches(value: Any, spec: Any) -> bool:
    """Whether ``value`` (as YAML gives it) fits the annotation whose :func:`type_spec` is ``spec``."""
    if spec == "any":
        return True
    if spec == "null":
        return value is None
    if spec == "bool":
        return isinstance(value, bool)
    if spec == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if spec == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if spec == "str":
        return isinstance(value, str)
    if spec == "dict":
        return isinstance(value, dict)
    kind, arg = next(iter(spec.items()))
    if kind == "union":
        return any(spec_matches(value, a) for a in arg)
    if kind == "literal":
        return value in arg
    if kind == "list":
        return isinstance(value, (list, tuple)) and (arg is None or all(spec_matches(v, arg) for v in value))
    if kind == "enum":
        return isinstance(value, enum.Enum) and type(value).__name__ == arg
    return any(f"{c.__module__}.{c.__qualname__}" == arg for c in type(value).__mro__)  # "type"


def spec_name(spec: Any) -> str:
    """A reader's name for an annotation's :func:`type_spec`: ``float``, ``int or null``, ``list of str``."""
    if isinstance(spec, str):
        return spec
    kind, arg = next(iter(spec.items()))
    if kind == "union":
        return " or ".join(dict.fromkeys(spec_name(a) for a in arg))
    if kind == "literal":
        return " or ".join(repr(a) for a in arg)
    if kind == "list":
        return f"list of {spec_name(arg)}" if arg is not None else "list"
    if kind == "enum":
        return "str"
    return arg.rsplit(".", 1)[-1]


def live_trainer_specs() -> dict[str, Any]:
    """``{field: type_spec}`` of every init field of CalibratedGRPOConfig, read from the installed TRL and
    transformers (imports both: about 5 s); what :mod:`calibrl.trl.trainer_fields` ships."""
    from calibrl.trl.config import CalibratedGRPOConfig

    try:
        hints = typing.get_type_hints(CalibratedGRPOConfig)
    except Exception:  # an annotation that does not resolve in this version: skip type checks, keep the names
        hints = {}
    return {f.name: type_spec(hints[f.name]) if f.name in hints else "any"
            for f in dataclasses.fields(CalibratedGRPOConfig) if f.init}


@functools.lru_cache(maxsize=1)
def _trainer_specs() -> dict[str, Any]:
    """The trainer fields' specs: the shipped ones when the installed TRL and transformers are the versions
    they were read from (no import of either), else read from the installed ones."""
    from importlib.metadata import PackageNotFoundError, version

    from calibrl.trl import trainer_fields as shipped

    try:
        installed = {name: version(name) for name in shipped.VERSIONS}
    except PackageNotFoundError:
        installed = None
    return dict(shipped.FIELDS) if installed == shipped.VERSIONS else live_trainer_specs()


def check_trainer_fields(raw: dict, source: str, section: str = "trainer") -> dict:
    """``raw`` if every key is a CalibratedGRPOConfig field holding a value of its annotated type, else an error
    naming the file, the section and the key (unknown keys with the closest valid name)."""
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: section {section!r} must be a mapping of CalibratedGRPOConfig fields")
    specs = _trainer_specs()
    for key, value in raw.items():
        if key not in specs:
            raise unknown_key_error(key, section, specs, source)
        if not spec_matches(value, specs[key]):
            raise RecipeError(f"{source}: {section}.{key}: expected {spec_name(specs[key])}, "
                              f"got {value!r} ({type(value).__name__})")
    return dict(raw)


def import_plugins(raw: Any, source: str) -> list[str]:
    """Import the recipe's ``plugins`` (module names on ``PYTHONPATH`` or installed, or ``.py`` files), so what they
    register (an estimator, a reward, a dataset, a metric) is known before the rest of the recipe is checked
    (:func:`calibrl._registry.import_plugins`). A module that is missing or fails to import is a one-line
    :class:`RecipeError` naming the entry."""
    from calibrl._registry import PluginError
    from calibrl._registry import import_plugins as _import

    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(m, str) and m for m in raw):
        raise RecipeError(f"{source}: plugins: expected a list of module names, got {raw!r}")
    try:
        return _import(raw, f"{source}: plugins")
    except PluginError as exc:
        raise RecipeError(str(exc)) from None


def check_advantage_params(estimator: str, params: Any, source: str, section: str = "trainer") -> None:
    """Each entry of ``advantage_params`` must be a parameter of the estimator ``estimator`` holding a value of its
    annotated type (read from its registration, :class:`calibrl.advantages.EstimatorSpec`), else a
    :class:`RecipeError` naming the file, the key and the closest parameter. An estimator taking ``**kwargs``, or a
    name not registered (reported elsewhere), is not checked. Imports :mod:`calibrl.advantages` (torch)."""
    from calibrl.advantages import estimator_spec

    if not params:
        return
    try:
        spec = estimator_spec(estimator)
    except KeyError:
        return
    if spec.params is None:
        return
    for key, value in params.items():
        where = f"{source}: {section}.advantage_params.{key}"
        if key not in spec.params:
            close = difflib.get_close_matches(str(key), list(spec.params), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            known = ", ".join(spec.params) or "none"
            raise RecipeError(f"{where}: not a parameter of estimator {estimator!r}{hint}; its parameters: {known}")
        expected = type_spec(spec.params[key].annotation)
        if not spec_matches(value, expected):
            raise RecipeError(f"{where}: expected {spec_name(expected)}, got {value!r} ({type(value).__name__})")


def _parse_calibration_eval(raw: Any, has_eval_dataset: bool, source: str):
    """(CalibrationEvalConfig, its own held-out dataset or None) from the ``calibration_eval`` section: ``true``
    or a mapping of CalibrationEvalConfig fields plus an optional ``dataset`` section (default: ``eval_dataset``)."""
    from calibrl.trl.calibration_config import CalibrationEvalConfig

    if raw is True:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: section 'calibration_eval' must be a mapping of its settings (or true), "
                          f"got {raw!r}")
    raw = dict(raw)
    dataset_raw = raw.pop("dataset", None)
    dataset = _parse_dataset(dataset_raw, "calibration_eval.dataset", source) if dataset_raw is not None else None
    if dataset is None and not has_eval_dataset:
        raise RecipeError(f"{source}: calibration_eval needs held-out prompts: set section 'eval_dataset' or "
                          "calibration_eval.dataset (e.g. {name: ..., split: test})")
    hints = typing.get_type_hints(CalibrationEvalConfig)
    for key, value in raw.items():
        if key not in hints:
            raise unknown_key_error(key, "calibration_eval", [*hints, "dataset"], source)
        if not spec_matches(value, type_spec(hints[key])):
            raise RecipeError(f"{source}: calibration_eval.{key}: expected {spec_name(type_spec(hints[key]))}, "
                              f"got {value!r} ({type(value).__name__})")
    try:
        config = CalibrationEvalConfig(**raw)
    except ValueError as exc:
        raise RecipeError(f"{source}: {exc}") from None
    return config, dataset


def parse_recipe(data: dict, source: str = "<recipe>") -> Recipe:
    """A :class:`Recipe` from an already-loaded mapping (``source`` names it in errors)."""
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe must be a YAML mapping with sections {', '.join(_TOP_KEYS)}")
    for key in data:
        if key not in _TOP_KEYS:
            raise unknown_key_error(key, "<top level>", _TOP_KEYS, source)
    plugins = import_plugins(data.get("plugins"), source)
    for key in ("model", "dataset", "rewards"):
        if key not in data or data[key] is None:
            raise RecipeError(f"{source}: missing section {key!r}")
    trainer = check_trainer_fields(data.get("trainer") or {}, source)
    if "advantage_params" in trainer and "advantage_estimator" in trainer:  # else once the defaults are known
        check_advantage_params(trainer["advantage_estimator"], trainer["advantage_params"], source)
    calibration_eval, calibration_eval_dataset = (
        _parse_calibration_eval(data["calibration_eval"], bool(data.get("eval_dataset")), source)
        if data.get("calibration_eval") not in (None, False) else (None, None))
    return Recipe(
        model=_parse_model(data["model"], source),
        dataset=_parse_dataset(data["dataset"], "dataset", source),
        eval_dataset=_parse_dataset(data["eval_dataset"], "eval_dataset", source) if data.get("eval_dataset") else None,
        rewards=_parse_rewards(data["rewards"], source),
        trainer=trainer,
        source=source,
        plugins=plugins,
        calibration_eval=calibration_eval,
        calibration_eval_dataset=calibration_eval_dataset,
    )


def _relative_to_recipe(spec: DatasetSpec | None, folder: Path) -> None:
    """A relative dataset ``path`` names a file next to the recipe when one is there (so a recipe and its data
    travel together, e.g. the recipes shipped in the package); otherwise it stays relative to the working dir."""
    if spec is None or not spec.path:
        return
    path = Path(str(spec.path)).expanduser()
    if not path.is_absolute() and (folder / path).exists():
        spec.path = str(folder / path)


def shipped_recipes() -> dict[str, Path]:
    """The recipes shipped in the package (``calibrl train --list``), by name (file name without ``.yaml``)."""
    return {p.stem: p for p in sorted(RECIPES_DIR.glob("*.yaml"))}


def resolve_recipe_path(name_or_path: str | Path) -> Path:
    """``name_or_path`` if it is a file; a shipped recipe's file for its name (``tiny_cpu``); else a
    :class:`RecipeError` listing the shipped names."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise RecipeError(f"{name_or_path}: is a folder, not a recipe file (give the YAML file in it, or a shipped "
                          "recipe's name: calibrl train --list)")
    shipped = shipped_recipes()
    if str(name_or_path) in shipped:
        return shipped[str(name_or_path)]
    close = difflib.get_close_matches(str(name_or_path), list(shipped), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise RecipeError(f"{name_or_path}: no such recipe file or shipped recipe{hint}; shipped: {', '.join(shipped)}")


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a YAML recipe (a file, or a shipped recipe's name); :class:`RecipeError` names the file
    and key on any problem. Relative dataset paths are looked up next to the recipe first."""
    path = resolve_recipe_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not a YAML text file (byte {exc.start} is not UTF-8 text)") from exc
    try:
        data = load_yaml(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = " ".join(str(exc.problem or exc).split())
        raise RecipeError(f"{where}: invalid YAML ({problem})") from exc
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: invalid YAML ({' '.join(str(exc).split())})") from exc
    recipe = parse_recipe(data, str(path))
    folder = path.resolve().parent  # through a symlink (configs/ -> calibrl/recipes/) to the real folder
    _relative_to_recipe(recipe.dataset, folder)
    _relative_to_recipe(recipe.eval_dataset, folder)
    _relative_to_recipe(recipe.calibration_eval_dataset, folder)
    return recipe
