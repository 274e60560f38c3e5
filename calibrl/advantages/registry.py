"""The estimator registry: name -> function(batch, **params) -> advantages [N] (or (advantages, info)).

Built-in estimators register themselves when :mod:`calibrl.advantages` is imported; users add their own with
:func:`register_estimator`. The TRL trainer, the verl plugin and the testbed all resolve estimators here, so an
estimator registered once is usable by every engine.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import torch

from calibrl._registry import registering_decorator
from calibrl.batch import RolloutBatch

EstimatorOutput = Union[torch.Tensor, "tuple[torch.Tensor, dict[str, Any]]"]
Estimator = Callable[..., EstimatorOutput]

_ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, *, overwrite: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator registering ``fn(batch: RolloutBatch, **params)`` under ``name``.

    The function returns the advantages as a float tensor [N], or a tuple ``(advantages, info)`` where ``info``
    is a dict of scalar diagnostics (e.g. the fraction of samples masked) that trainers log.

    >>> @register_estimator("my_est")
    ... def my_est(batch, *, scale=1.0):
    ...     return scale * (batch.rewards - batch.rewards.mean())
    """

    return registering_decorator(_ESTIMATORS, "advantage estimator", name, overwrite)


def get_estimator(name: str) -> Estimator:
    """The estimator registered under ``name``; a KeyError lists the registered names."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; registered: {', '.join(sorted(_ESTIMATORS))}"
        ) from None


def available_estimators() -> list[str]:
    """Sorted names of every registered estimator."""
    return sorted(_ESTIMATORS)


def compute_advantages(
    batch: RolloutBatch, estimator: str | Estimator = "grpo", *, return_info: bool = False, **params: Any
) -> torch.Tensor | tuple[torch.Tensor, dict[str, Any]]:
    """Advantages [N] of ``batch`` under ``estimator`` (a registered name or a function).

    ``params`` are passed to the estimator as keyword arguments (e.g. ``tau=0.6, mask="quantile"`` for capo).
    With ``return_info=True`` returns ``(advantages, info)``, ``info`` being the estimator's diagnostics dict
    (empty for estimators that report none).
    """
    fn = get_estimator(estimator) if isinstance(estimator, str) else estimator
    out = fn(batch, **params)
    advantages, info = (out if isinstance(out, tuple) else (out, {}))
    if advantages.shape != batch.rewards.shape:
        name = estimator if isinstance(estimator, str) else getattr(estimator, "__name__", "estimator")
        raise ValueError(f"estimator {name!r} returned shape {tuple(advantages.shape)}, expected {tuple(batch.rewards.shape)}")
    return (advantages, dict(info)) if return_info else advantages

