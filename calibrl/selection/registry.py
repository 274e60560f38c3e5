"""The selection methods by name: :data:`METHODS` and :func:`select`, the entry point ``calibrl eval`` and
:func:`calibrl.selection.scaling.scaling_curve` use."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from calibrl._registry import already_registered

from calibrl.selection.deepconf import SELECTIONS as _DEEPCONF, deepconf_select
from calibrl.selection.pruning import rpc
from calibrl.selection.voting import (SelectionResult, best_of_n, confidence_weighted_vote, majority_vote,
                                      perplexity_consistency, weighted_vote)

__all__ = ["ALL_METHODS", "DEEPCONF_METHODS", "METHODS", "SELECTION_INPUTS", "SelectionMethod", "method_needs",
           "register_selection", "select", "selection_method"]

# What a selection method can need beyond answers, correctness and prompts (each [N], one entry per path)
SELECTION_INPUTS = {
    "logprob_mean": "the path's mean token log-probability (weighted vote, PC, RPC)",
    "confidence": "the path's confidence score (best-of-N ranks by it)",
    "deepconf_signals": "[N, 4] DeepConf's trace signals of token_confidence",
}


@dataclass(frozen=True)
class SelectionMethod:
    """A selection method: its function ``fn(answer_ids, correct, prompt_ids, **inputs) -> SelectionResult``, the
    inputs it ``needs`` on every path (:data:`SELECTION_INPUTS`) and whether ``calibrl eval`` runs it by default."""

    name: str
    fn: Callable[..., SelectionResult]
    needs: frozenset[str]
    default: bool = False


_METHODS: dict[str, SelectionMethod] = {}


def register_selection(name: str, fn: Callable[..., SelectionResult] | None = None, *, needs=(),
                       default: bool = False, overwrite: bool = False):
    """Declare selection method ``name`` (as a decorator over ``fn``, or called with it)."""
    needs = frozenset(needs)
    if needs - set(SELECTION_INPUTS):
        raise ValueError(f"selection {name!r} needs unknown input(s) {sorted(needs - set(SELECTION_INPUTS))}; "
                         f"inputs are {sorted(SELECTION_INPUTS)}")

    def decorator(function):
        current = _METHODS.get(name)
        if not already_registered(current.fn if current else None, function, kind="selection method", name=name,
                                  overwrite=overwrite):
            _METHODS[name] = SelectionMethod(name, function, needs, default)
        return function

    return decorator if fn is None else decorator(fn)


for _name, _fn, _needs in (("majority", majority_vote, ()), ("weighted", weighted_vote, ("logprob_mean",)),
                           ("pc", perplexity_consistency, ("logprob_mean",)), ("rpc", rpc, ("logprob_mean",)),
                           ("best_of_n", best_of_n, ("confidence",))):
    register_selection(_name, _fn, needs=_needs, default=True)
# not run by default: calibrl eval runs it as weighted_verbalized when the input has a verbalized confidence;
# declared so that scaling_curve can draw it
register_selection("confidence_weighted", confidence_weighted_vote, needs=("confidence",))
# DeepConf's votes (calibrl.selection.deepconf): asked for by name
for _name in _DEEPCONF:
    register_selection(_name, partial(deepconf_select, _name), needs=("deepconf_signals",))

METHODS = tuple(n for n, m in _METHODS.items() if m.default)  # the default --methods
DEEPCONF_METHODS = tuple(_DEEPCONF)
ALL_METHODS = tuple(n for n in _METHODS if n != "confidence_weighted")  # what --methods accepts


def selection_method(name: str) -> SelectionMethod:
    """The declaration of ``name``; a ``ValueError`` naming the choices for an unknown one."""
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"unknown selection method {name!r}; choose one of {', '.join(ALL_METHODS)}") from None


def method_needs(name: str) -> frozenset[str]:
    """What selection method ``name`` needs on every path (:data:`SELECTION_INPUTS`)."""
    return selection_method(name).needs


def select(method: str, answer_ids, correct, prompt_ids, **kwargs: Any) -> SelectionResult:
    """Run selection ``method`` (one of :data:`ALL_METHODS`); kwargs: logprob_mean, completions, confidence,
    deepconf_signals ([N, 4] :func:`calibrl.selection.deepconf.trace_signals` rows, the DeepConf methods)."""
    return selection_method(method).fn(answer_ids, correct, prompt_ids, **kwargs)
