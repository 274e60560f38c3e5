"""Inference-time scaling: pick one answer per prompt among N sampled reasoning paths.

Methods (all take flat arrays, one entry per sampled path, and a prompt id per path):

- ``majority``: self-consistency; the answer cluster with the most paths wins.
- ``weighted``: probability-weighted vote; score(y) = sum over paths with answer y of exp(logprob_mean).
- ``pc``: Perplexity Consistency (arXiv 2502.00511): like ``weighted`` but identical completion texts count once.
- ``rpc``: Reasoning Pruning + PC: per prompt, fit a 2-component Weibull mixture to the path probabilities
  exp(logprob_mean) and drop a path whose posterior favours the lower-mean component AND whose probability is below
  the prompt's mean probability; then PC over the remaining paths.
- ``best_of_n``: the single path with the highest confidence.

Ties follow the reference code (WNJXYK/RPC): when k answers tie for the top score, the prompt counts as (number of
correct among them) / k, i.e. the expected accuracy of a uniform tie-break.

The package, in the order a selection runs:

- :mod:`~calibrl.selection.answers`: :func:`answers_equivalent` (THE answer equivalence, shared with grading),
  :func:`answer_clusters` (answers -> cluster ids), :func:`group_answer_ids` (the same for training-time
  estimators: -1 for no answer) and :func:`normalize_answer`;
- :mod:`~calibrl.selection.voting`: majority, weighted vote, PC, best-of-N, :class:`SelectionResult` and the
  vote they share;
- :mod:`~calibrl.selection.pruning`: the Weibull mixture and RPC's pruning (:func:`rpc_keep_mask`);
- :mod:`~calibrl.selection.deepconf`: DeepConf's trace signals (:func:`trace_signals`) and the votes weighted or
  filtered by them;
- :mod:`~calibrl.selection.registry`: :data:`METHODS` (the default ones), :data:`ALL_METHODS` and :func:`select`
  (a method by name);
- :mod:`~calibrl.selection.scaling`: :func:`scaling_curve` (accuracy vs N, :class:`ScalingCurve`) and
  :func:`maj_at_k`.
"""

from __future__ import annotations

from calibrl.selection.answers import answer_clusters, answers_equivalent, group_answer_ids, normalize_answer
from calibrl.selection.deepconf import trace_signals
from calibrl.selection.registry import ALL_METHODS, DEEPCONF_METHODS, METHODS, select
from calibrl.selection.pruning import rpc, rpc_keep_mask
from calibrl.selection.scaling import ScalingCurve, maj_at_k, scaling_curve
from calibrl.selection.voting import SelectionResult, best_of_n, majority_vote, perplexity_consistency, weighted_vote

__all__ = [
    "ALL_METHODS",
    "DEEPCONF_METHODS",
    "METHODS",
    "ScalingCurve",
    "SelectionResult",
    "answer_clusters",
    "group_answer_ids",
    "answers_equivalent",
    "best_of_n",
    "maj_at_k",
    "majority_vote",
    "normalize_answer",
    "perplexity_consistency",
    "rpc",
    "rpc_keep_mask",
    "scaling_curve",
    "select",
    "trace_signals",
    "weighted_vote",
]
