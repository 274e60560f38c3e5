"""The selection methods by name: :data:`METHODS` and :func:`select`, the entry point ``calibrl eval`` and
:func:`calibrl.selection.scaling.scaling_curve` use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from functools import partial

from calibrl.selection.deepconf import SELECTIONS as _DEEPCONF, deepconf_select
from calibrl.selection.pruning import rpc
from calibrl.selection.voting import (SelectionResult, best_of_n, confidence_weighted_vote, majority_vote,
                                      perplexity_consistency, weighted_vote)

__all__ = ["ALL_METHODS", "DEEPCONF_METHODS", "METHODS", "select"]

METHODS = ("majority", "weighted", "pc", "rpc", "best_of_n")  # the default --methods
# DeepConf's votes (calibrl.selection.deepconf): asked for by name; they need a token_confidence array per path
DEEPCONF_METHODS = tuple(_DEEPCONF)
ALL_METHODS = METHODS + DEEPCONF_METHODS
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
    **{name: partial(deepconf_select, name) for name in DEEPCONF_METHODS},
}


def select(method: str, answer_ids, correct, prompt_ids, **kwargs: Any) -> SelectionResult:
    """Run selection ``method`` (one of :data:`ALL_METHODS`); kwargs: logprob_mean, completions, confidence,
    deepconf_signals ([N, 4] :func:`calibrl.selection.deepconf.trace_signals` rows, the DeepConf methods)."""
    try:
        fn = _FUNCS[method]
    except KeyError:
        raise ValueError(f"unknown selection method {method!r}; choose one of {', '.join(ALL_METHODS)}") from None
    return fn(answer_ids, correct, prompt_ids, **kwargs)
