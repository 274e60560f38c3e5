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
_DATASET_REWARDS: dict[str, str] = {}  # dataset name -> the reward that grades it when none is named
_DATASET_MAX_NEW_TOKENS: dict[str, int] = {}  # dataset name -> completion budget when none is named


def register_dataset(name: str, *, overwrite: bool = False, reward: str | None = None,
                     max_new_tokens: int | None = None):
    """Decorator registering ``loader(split: str = ..., **kwargs) -> datasets.Dataset`` under ``name``.

    ``reward``: the registered reward that grades this dataset's completions when the caller names none
    (``calibrl generate`` without ``--reward``); None keeps the default by row format (``"decision"`` for rows
    with ``classes``, else ``"math"``). ``max_new_tokens``: the completion budget ``calibrl generate`` uses when
    ``--max-new-tokens`` is not given (short-answer tasks need far fewer than a reasoning benchmark's); None keeps
    its general default.
    """
    decorate = registering_decorator(_DATASETS, "dataset", name, overwrite)

    def decorator(fn):
        fn = decorate(fn)
        for table, value in ((_DATASET_REWARDS, reward), (_DATASET_MAX_NEW_TOKENS, max_new_tokens)):
            if value is not None:
                table[name] = value
            else:
                table.pop(name, None)
        return fn

    return decorator


def register_reward(name: str, *, overwrite: bool = False):
    """Decorator registering a TRL-style reward function under ``name``."""
    return registering_decorator(_REWARDS, "reward", name, overwrite)


_PROVIDERS: list[Callable[[], None]] = []  # not yet run: each registers more datasets and rewards


def add_provider(load: Callable[[], None]) -> None:
    """Run ``load()`` (once) before the next lookup: it registers datasets and rewards of a layer above this one.
    The testbed provides its ``testbed/<task>`` tasks this way (wired in :mod:`calibrl`'s ``__init__``), so this
    registry never imports the testbed."""
    _PROVIDERS.append(load)


def _builtins() -> None:
    from calibrl.tasks import datasets, rewards, synthetic  # noqa: F401  (importing them registers theirs)

    while _PROVIDERS:
        _PROVIDERS.pop(0)()


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


def dataset_reward(name: str) -> str | None:
    """The reward registered as ``name``'s grader (:func:`register_dataset`'s ``reward``), or None."""
    _builtins()
    return _DATASET_REWARDS.get(name)


def dataset_max_new_tokens(name: str) -> int | None:
    """The completion budget registered for ``name`` (:func:`register_dataset`'s ``max_new_tokens``), or None."""
    _builtins()
    return _DATASET_MAX_NEW_TOKENS.get(name)


def available_datasets() -> list[str]:
    _builtins()
    return sorted(_DATASETS)


def available_rewards() -> list[str]:
    _builtins()
    return sorted(_REWARDS)

