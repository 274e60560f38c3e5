"""The selection methods by name: :data:`METHODS` and :func:`select`, the entry point ``calibrl eval`` and
:func:`calibrl.selection.scaling.scaling_curve` use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from calibrl.selection.pruning import rpc
from calibrl.selection.voting import (SelectionResult, best_of_n, confidence_weighted_vote, majority_vote,
                                      perplexity_consistency, weighted_vote)

__all__ = ["METHODS", "select"]

METHODS = ("majority", "weighted", "pc", "rpc", "best_of_n")
_NEEDS_LOGPROB = {"weighted", "pc", "rpc"}

_FUNCS: dict[str, Callable[..., SelectionResult]] = {
    "majority": majority_vote,
    "weighted": weighted_vote,
    "pc": perplexity_consistency,
    "rpc": rpc,
    "best_of_n": best_of_n,
    # not in METHODS (no default --methods entry): calibrl eval runs it as weighted_verbalized when the input has a
    # verbalized confidence; listed here so scaling_curve can draw it
    "confidence_weighted": confidence_weighted_vote,
}


def select(method: str, answer_ids, correct, prompt_ids, **kwargs: Any) -> SelectionResult:
    """Run selection ``method`` (one of :data:`METHODS`); kwargs: logprob_mean, completions, confidence."""
    try:
        fn = _FUNCS[method]
    except KeyError:
        raise ValueError(f"unknown selection method {method!r}; choose one of {', '.join(METHODS)}") from None
    return fn(answer_ids, correct, prompt_ids, **kwargs)
