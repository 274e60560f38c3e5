"""The estimator registry: name -> function(batch, **params) -> advantages [N] (or (advantages, info)).

Built-in estimators register themselves when :mod:`calibrl.advantages` is imported; users add their own with
:func:`register_estimator`. The TRL trainer, the verl plugin and the testbed all resolve estimators here, so an
estimator registered once is usable by every engine. :func:`compute_advantages` is also where rows without tokens
(``lengths == 0``) are left out, once for every estimator.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import torch

from calibrl._registry import registering_decorator
from calibrl.batch import RolloutBatch

EstimatorOutput = Union[torch.Tensor, "tuple[torch.Tensor, dict[str, Any]]"]
Estimator = Callable[..., EstimatorOutput]

_ESTIMATORS: dict[str, Estimator] = {}

# Which optional RolloutBatch fields each built-in estimator reads, so that engine adapters gather only those.
# Unknown (user) estimators receive logprob_mean (and ref_logprob_mean where the engine has it anyway).
_ESTIMATOR_INPUTS: dict[str, frozenset[str]] = {
    "grpo": frozenset(),
    "dr_grpo": frozenset(),
    "rloo": frozenset(),
    "capo": frozenset({"logprob_mean"}),
    "grpo_mask": frozenset({"ref_logprob_mean"}),
    "codapo": frozenset({"logprob_mean"}),
    "cde": frozenset({"logprob_mean"}),
    "seed_grpo": frozenset({"logprob_mean", "answer_ids"}),
    "gcpo": frozenset({"logprob_mean", "embeddings"}),
}



def register_estimator(name: str, *, overwrite: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator registering ``fn(batch: RolloutBatch, **params)`` under ``name``.

    The function returns the advantages as a float tensor [N] (or per-token [N, T]), or a tuple
    ``(advantages, info)`` where ``info`` is a dict of scalar diagnostics (e.g. the fraction of samples masked)
    that trainers log. Through :func:`compute_advantages` it only ever sees rows with tokens.

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

    Rows without tokens: when ``batch.lengths`` is given, the estimator runs on the rows with ``lengths > 0``
    only and its advantages are scattered back; rows with ``lengths == 0`` get 0 and enter no statistic of any
    estimator (group means and stds, CAPO's pairs and quantile mask, semantic clusters, dispersions, ...) nor
    its diagnostics. ``info["n_empty_rows"]`` then counts them (0 when there are none). A batch without any
    row with tokens gives zeros [N] without calling the estimator. Estimators may return per-token advantages
    [N, T]; they are scattered row for row.
    """
    fn = get_estimator(estimator) if isinstance(estimator, str) else estimator
    name = estimator if isinstance(estimator, str) else getattr(estimator, "__name__", "estimator")
    keep = None if batch.lengths is None else batch.lengths > 0
    if keep is None or bool(keep.all()):
        advantages, info = _run(fn, batch, name=name, params=params)
    elif not bool(keep.any()):
        advantages, info = torch.zeros_like(batch.rewards), {}
    else:
        kept, info = _run(fn, batch.select(keep), name=name, params=params)
        advantages = kept.new_zeros((len(batch), *kept.shape[1:]))
        advantages[keep] = kept
    if keep is not None:
        info = {**info, "n_empty_rows": int((~keep).sum())}
    return (advantages, dict(info)) if return_info else advantages


def _run(fn: Estimator, batch: RolloutBatch, *, name: str,
         params: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """``fn(batch, **params)`` as (advantages [N] or [N, T], info); a wrong leading shape raises a ValueError."""
    out = fn(batch, **params)
    advantages, info = (out if isinstance(out, tuple) else (out, {}))
    if advantages.dim() not in (1, 2) or advantages.shape[0] != len(batch):
        raise ValueError(f"estimator {name!r} returned shape {tuple(advantages.shape)}, expected ({len(batch)},) "
                         f"or ({len(batch)}, T)")
    return advantages, info


def estimator_inputs(name: str, params: dict[str, Any]) -> frozenset[str]:
    """Optional RolloutBatch fields the estimator ``name`` needs with ``params`` (CAPO's mask adds the reference)."""
    needed = set(_ESTIMATOR_INPUTS.get(name, {"logprob_mean"}))
    if name == "capo" and params.get("mask", "none") != "none":
        needed.add("ref_logprob_mean")
    return frozenset(needed)
