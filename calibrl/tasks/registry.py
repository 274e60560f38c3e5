"""Name registries for datasets and reward functions, shared by built-in testbed tasks and real workloads.

A dataset loader returns a ``datasets.Dataset`` whose rows carry at least ``prompt`` (str) and the columns its
reward function reads (e.g. ``answer``; decision tasks also ``classes``: list of single-token class strings, and
``label`` when fixed). A reward function has TRL's signature ``fn(prompts, completions, **columns) -> list[float]``
(verl's custom reward hook is adapted in :mod:`calibrl.tasks.rewards`).
"""

from __future__ import annotations

from typing import Any, Callable

from calibrl._registry import registering_decorator

_DATASETS: dict[str, Callable[..., Any]] = {}
_REWARDS: dict[str, Callable[..., list[float]]] = {}


def register_dataset(name: str, *, overwrite: bool = False):
    """Decorator registering ``loader(split: str = ..., **kwargs) -> datasets.Dataset`` under ``name``."""
    return registering_decorator(_DATASETS, "dataset", name, overwrite)


def register_reward(name: str, *, overwrite: bool = False):
    """Decorator registering a TRL-style reward function under ``name``."""
    return registering_decorator(_REWARDS, "reward", name, overwrite)


def _builtins() -> None:
    # Importing the modules registers their datasets and rewards; missing modules are tolerated so the
    # registries work in partial installs.
    import importlib

    for module in ("calibrl.testbed.tasks", "calibrl.tasks.datasets", "calibrl.tasks.rewards"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def get_dataset_loader(name: str) -> Callable[..., Any]:
    _builtins()
    try:
        return _DATASETS[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; registered: {', '.join(sorted(_DATASETS))}") from None


def get_reward(name: str) -> Callable[..., list[float]]:
    _builtins()
    try:
        return _REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown reward {name!r}; registered: {', '.join(sorted(_REWARDS))}") from None


def available_datasets() -> list[str]:
    _builtins()
    return sorted(_DATASETS)


def available_rewards() -> list[str]:
    _builtins()
    return sorted(_REWARDS)

