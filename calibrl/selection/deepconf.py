"""DeepConf (Fu et al., "Deep Think with Confidence", arXiv 2508.15260): a trace's confidence profile, its signals,
and the votes weighted and filtered by them.

Token confidence (computed where the logits are: :func:`calibrl.logprobs.chunked_token_confidence`, or from
top-k log-probs a file carries: :func:`token_confidence_from_top_logprobs`):

    C_i = -(1/k) * sum_{j=1..k} log P_i(j)     (P_i(j): the j-th most probable token at position i; k = 20)

A high C_i is a peaked distribution (the model is sure of the next token). The signals of one trace with token
confidences C_1 .. C_L (:func:`trace_signals`), window w and tail t (both 2,048 tokens by default):

- ``mean``: (1/L) sum_i C_i;
- ``tail``: the mean of the last t tokens (all of them when L <= t);
- windows: the means G_s = (1/w) sum_{i=s..s+w-1} C_i of every window of w consecutive tokens, s = 1 .. L-w+1
  (stride 1); ``bottom10``: the mean of the m lowest G_s, m = max(1, floor(0.1 * (L - w + 1)));
  ``min``: min_s G_s. A trace shorter than a window (L < w) has the single value ``mean`` for both.

Readings of the authors' analysis code (facebookresearch/deepconf, ``analysis_offline.py``, ``helper.py``) where
the paper is silent, followed here:

- windows slide by one token; ``bottom10`` counts floor(10% of the windows), at least one (``int(n * 0.1)``,
  ``max(1, .)``), and averages the lowest that many (``np.partition``);
- the top-η filter of a prompt's traces keeps those whose signal is >= numpy's linear-interpolation percentile
  ``np.percentile(signals, (1 - η) * 100)`` (η = 0.1 for "top 10%", 0.9 for "top 90%"); ties at the threshold are
  all kept, so more than η of the traces may remain;
- the vote after filtering (and the plain weighted votes) adds each trace's signal itself to its answer's score.

Where we differ, on purpose:

- the authors round each C_i to 3 decimals when they store it; we keep what the generator or the file gives;
- a trace without tokens has no signal (NaN; the authors' 0.0): it adds nothing to its answer's score and is left
  out of the percentile;
- ties between answers count as the expected accuracy of a uniform tie-break (calibrl's rule for every vote,
  :mod:`calibrl.selection.voting`), where the authors' ``max`` takes the answer seen first;
- a path without an extracted answer votes for its prompt's no-answer cluster (as in ``majority``), where the
  authors drop such traces before filtering and voting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from calibrl.selection.voting import SelectionResult, _prepare, _vote

__all__ = [
    "BOTTOM_FRACTION", "DEFAULT_TAIL", "DEFAULT_WINDOW", "SELECTIONS", "SIGNALS", "deepconf_select",
    "filter_top_fraction", "online_threshold", "online_vote", "token_confidence_from_top_logprobs", "trace_signals",
]

DEFAULT_WINDOW = 2048  # tokens per sliding window (the paper's and the authors' code's)
DEFAULT_TAIL = 2048  # tokens of the tail signal
BOTTOM_FRACTION = 0.1  # the share of a trace's lowest windows averaged by ``bottom10``
SIGNALS = ("mean", "tail", "bottom10", "min")  # the columns of :func:`trace_signals`, in this order

# selection name -> (signal, fraction kept by the filter or None for a plain weighted vote over every path)
SELECTIONS: dict[str, tuple[str, float | None]] = {
    "deepconf_mean": ("mean", None),
    "deepconf_tail": ("tail", None),
    "deepconf_bottom10": ("bottom10", None),
    "deepconf_min": ("min", None),
    "deepconf_tail_top10": ("tail", 0.1),
    "deepconf_bottom10_top10": ("bottom10", 0.1),
    "deepconf_tail_top90": ("tail", 0.9),
    "deepconf_bottom10_top90": ("bottom10", 0.9),
}


def token_confidence_from_top_logprobs(top_logprobs: Iterable[Sequence[float]]) -> np.ndarray:
    """[L] C_i = -mean(top_logprobs[i]) from each position's top-k log-probabilities (an OpenAI-style
    ``top_logprobs`` list, vLLM's per-position dict values). A position with no entries (an API returned none)
    is NaN; k may differ between positions (each is averaged over what it has)."""
    out = []
    for values in top_logprobs:
        values = list(values)
        out.append(-math.fsum(values) / len(values) if values else math.nan)
    return np.asarray(out, dtype=np.float64)


def trace_signals(token_confidence, *, window: int = DEFAULT_WINDOW, tail: int = DEFAULT_TAIL,
                  bottom_fraction: float = BOTTOM_FRACTION) -> np.ndarray:
    """[4] float64: (mean, tail, bottom10, min) of one trace's token confidences (formulas: the module docstring).

    Args:
        token_confidence: [L] C_i of the trace (any float dtype; summed in float64). NaN entries (positions an
            API gave no top log-probs for) are dropped first.
        window: w >= 1, tokens per sliding window; ``tail``: t >= 1, tokens of the tail.
        bottom_fraction: in (0, 1], the share of the lowest windows ``bottom10`` averages.

    Window means come from one cumulative sum (``(S[s+w] - S[s]) / w``), O(L) whatever w is; no [n_windows, w]
    array is built. An empty trace gives four NaN.
    """
    if window < 1 or tail < 1:
        raise ValueError(f"window and tail must be >= 1 tokens, got window={window}, tail={tail}")
    if not 0 < bottom_fraction <= 1:
        raise ValueError(f"bottom_fraction must lie in (0, 1], got {bottom_fraction}")
    c = np.asarray(token_confidence, dtype=np.float64).reshape(-1)
    if np.isnan(c).any():
        c = c[~np.isnan(c)]
    n = c.size
    if n == 0:
        return np.full(4, np.nan)
    scale = _overflow_scale(c)
    if scale != 1.0:  # sums of values near the float64 maximum would overflow: the same signals, in units of scale
        return scale * trace_signals(c / scale, window=window, tail=tail, bottom_fraction=bottom_fraction)
    mean = float(c.mean())
    tail_mean = float(c[-tail:].mean()) if n > tail else mean
    if n < window:
        return np.array([mean, tail_mean, mean, mean])
    cumulative = np.concatenate(([0.0], np.cumsum(c)))  # [L + 1]
    means = (cumulative[window:] - cumulative[:-window]) / window  # [L - w + 1] window means, stride 1
    lowest = max(1, int(means.size * bottom_fraction))
    bottom = float(means.min()) if lowest == 1 else float(np.partition(means, lowest - 1)[:lowest].mean())
    return np.array([mean, tail_mean, bottom, float(means.min())])


def _overflow_scale(values: np.ndarray) -> float:
    """1.0, or the largest |value| when summing ``values`` could overflow float64 (finite C_i near 1e308, which no
    log-probability gives but a file can hold): signals and votes are then computed in units of it, and are the
    same up to rounding (a vote's winner and shares do not depend on the unit)."""
    finite = values[np.isfinite(values)]
    largest = float(np.abs(finite).max()) if finite.size else 0.0
    return largest if largest * max(finite.size, 1) > 1e300 else 1.0


def filter_top_fraction(signal: np.ndarray, pidx: np.ndarray, n_prompts: int, keep_fraction: float) -> np.ndarray:
    """[N] bool: per prompt, the paths whose ``signal`` is >= ``np.percentile(prompt's signals, (1 - keep) * 100)``
    (numpy's default linear interpolation, the authors' threshold). NaN signals are neither counted nor kept.

    Prompts of equal size share one vectorised ``np.percentile`` over a [prompts, paths] matrix (the same
    interpolation as one call per prompt); the others take one call each.
    """
    if not 0 < keep_fraction <= 1:
        raise ValueError(f"keep_fraction must lie in (0, 1], got {keep_fraction}")
    q = (1 - keep_fraction) * 100  # written as the authors write it: 90.0 for 0.1, 9.999999999999998 for 0.9
    signal = np.asarray(signal, dtype=np.float64)
    has = ~np.isnan(signal)
    threshold = np.full(n_prompts, np.inf)
    order = np.lexsort((np.arange(signal.size), pidx))
    order = order[has[order]]  # paths with a signal, grouped by prompt
    sizes = np.bincount(pidx[order], minlength=n_prompts)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    for size in np.unique(sizes[sizes > 0]):
        prompts = np.flatnonzero(sizes == size)
        rows = order[starts[prompts][:, None] + np.arange(size)]  # [prompts, size]
        threshold[prompts] = np.percentile(signal[rows], q, axis=1)
    return has & (signal >= threshold[pidx])


def online_threshold(warmup_lowest, keep_fraction: float = 0.1) -> float:
    """DeepConf online's stopping threshold of one prompt: ``np.percentile(warm-up traces' lowest window
    confidences, (1 - keep_fraction) * 100)`` (the authors' ``deepconf-online.py``: percentile 90 keeps the top 10%,
    DeepConf-low; 10 keeps the top 90%, DeepConf-high). Traces without a signal (NaN) are left out; -inf (never
    stop) when none has one."""
    if not 0 < keep_fraction <= 1:
        raise ValueError(f"keep_fraction must lie in (0, 1], got {keep_fraction}")
    values = np.asarray(warmup_lowest, dtype=np.float64).reshape(-1)
    values = values[~np.isnan(values)]
    return float(np.percentile(values, (1 - keep_fraction) * 100)) if values.size else -math.inf


def deepconf_select(method: str, answer_ids, correct, prompt_ids, *, deepconf_signals=None,
                    **_: Any) -> SelectionResult:
    """DeepConf selection ``method`` (a key of :data:`SELECTIONS`): a vote where each path adds its signal to its
    answer's score, over every path (``deepconf_mean`` .. ``deepconf_min``) or over the paths a prompt keeps by
    :func:`filter_top_fraction` (``*_top10``, ``*_top90``).

    ``deepconf_signals``: [N, 4] float, each path's :func:`trace_signals` (columns :data:`SIGNALS`). The result's
    ``confidence`` is the winner's share of the counted paths' summed signal.
    """
    try:
        signal_name, keep_fraction = SELECTIONS[method]
    except KeyError:
        raise ValueError(f"unknown DeepConf selection {method!r}; choose one of {', '.join(SELECTIONS)}") from None
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    if deepconf_signals is None:
        raise ValueError(f"selection method {method!r} needs token confidences (a token_confidence array per path)")
    signals = np.asarray(deepconf_signals, dtype=np.float64)
    if signals.shape != (a.size, len(SIGNALS)):
        raise ValueError(f"deepconf_signals must be [{a.size}, {len(SIGNALS)}] (one row per path), got "
                         f"{list(signals.shape)}")
    weight = signals[:, SIGNALS.index(signal_name)]
    counted = ~np.isnan(weight)
    if keep_fraction is not None:
        counted = filter_top_fraction(weight, p, n, keep_fraction)
    weight = np.where(counted, weight, 0.0)
    return _vote(method, weight / _overflow_scale(weight), a, c, p, n, prompts)


def online_vote(answer_ids, correct, prompt_ids, *, deepconf_signals=None, voted=None, lowest=None,
                **_: Any) -> SelectionResult:
    """DeepConf online's answer (``calibrl generate --deepconf-online``): the paths that counted in the online vote
    (``voted`` [N] bool: their lowest window confidence at or above the threshold) each add that confidence to
    their answer's score: ``lowest`` [N] as the run computed it (its window, rounded as the authors round it;
    ``deepconf_lowest`` in the file) where given and defined, else column ``min`` of ``deepconf_signals``."""
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    if deepconf_signals is None or voted is None:
        raise ValueError("deepconf_online needs token confidences and each path's deepconf_voted")
    from_signals = np.asarray(deepconf_signals, dtype=np.float64)[:, SIGNALS.index("min")]
    if lowest is not None:
        lowest = np.asarray(lowest, dtype=np.float64)
        lowest = np.where(np.isnan(lowest), from_signals, lowest)
    else:
        lowest = from_signals
    counted = np.asarray(voted, dtype=bool) & ~np.isnan(lowest)
    weight = np.where(counted, lowest, 0.0)
    return _vote("deepconf_online", weight / _overflow_scale(weight), a, c, p, n, prompts)
