"""``calibrl generate --deepconf-online``: DeepConf's online sampling (Fu et al., arXiv 2508.15260) on the local
(transformers) backend, as the authors' code runs it (facebookresearch/deepconf: ``deepconf/wrapper.py``
``_deepthink_online`` and ``_perform_basic_voting``, ``deepconf/processors.py`` ``ConfPerReqLogitsProcessor``,
``deepconf/utils.py`` ``compute_confidence`` and ``compute_least_grouped``; the PyPI release ``deepconf 0.1.0``).

For each problem, with a budget of ``n`` traces:

1. **Warm-up**: ``warmup`` traces are sampled in full. Each trace's lowest window confidence (:func:`lowest_window`)
   sets the problem's stopping threshold ``s = np.percentile(warm-up lowest, (1 - keep_fraction) * 100)``
   (:func:`calibrl.selection.deepconf.online_threshold`): ``keep_fraction`` 0.1 is the paper's DeepConf-low, 0.9
   DeepConf-high.
2. **Sampling with early stop**, the other ``n - warmup`` traces: a trace stops as soon as the mean of its last
   ``window`` token confidences falls below ``s`` (from its ``window``-th token on; the confidence of the top k
   before each token is drawn, as the authors' logits processor reads it:
   :meth:`calibrl.evaluation.backends._TransformersBackend.generate`).
3. **The vote**: a trace, warm-up or not, counts when it has an extracted answer and its lowest window confidence
   is >= ``s``, weighted by that confidence (``_perform_basic_voting``: a stopped trace, and a finished trace whose
   lowest window, or, shorter than a window, whose mean, is below ``s``, do not count).

The lowest window confidence follows ``compute_least_grouped``: each C_i and each window mean rounded to
``round_decimals`` (3) decimals, a trace shorter than the window its (unrounded) mean of the rounded C_i.

Where the paper's Algorithm 2 and the released code differ, the default follows the code:

* the code gives every problem its whole budget; the paper stops sampling a problem once its leading answer holds a
  share ``tau`` of the vote. ``consensus=tau`` (``--deepconf-consensus 0.95``) is the paper's rule, checked after
  every round of ``round_size`` traces (1: after every trace, as the paper; larger rounds batch better and may
  overshoot by up to ``round_size - 1`` traces). Without it the ``n - warmup`` traces are sampled in one call, as
  the authors' code samples them.
* ``round_decimals=None`` keeps the exact window means (the paper's text does not round).

What differs on purpose, and why (docs/fidelity.md): the authors' processor replaces the stopping step's token
with EOS, here the trace ends after that token; a trace without tokens has no lowest confidence (the authors' 0)
and neither sets the threshold nor votes.

Each row says what happened to it: ``deepconf_phase`` ("warmup" / "final"), ``deepconf_threshold`` (s),
``deepconf_lowest`` (its lowest window confidence, the vote's weight), ``stop_reason`` ("eos", "max_new_tokens" or
"deepconf_confidence"), ``deepconf_voted`` (counted in the online vote), ``deepconf_traces`` (the problem's number
of traces: resuming treats a problem with that many rows as done) and ``deepconf_consensus`` (the leading answer's
final share).

vLLM cannot stop a single sequence on a running statistic of its own top-k log-probs without a patch to its
sampler or output processor (the authors register a logits processor through vLLM's ``AdapterLogitsProcessor``);
``--deepconf-online`` therefore runs on the transformers backend only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from calibrl.selection.answers import normalize_answer
from calibrl.selection.deepconf import DEFAULT_WINDOW, online_threshold

__all__ = ["OnlineSettings", "lowest_window", "sample_online"]


@dataclass(frozen=True)
class OnlineSettings:
    """DeepConf online's settings: the authors' defaults (16 warm-up traces, DeepConf-low, 2,048-token windows,
    window means rounded to 3 decimals, the whole budget spent); ``consensus`` set (the paper's tau = 0.95) stops a
    problem early as the paper's Algorithm 2 does."""

    warmup: int = 16
    keep_fraction: float = 0.1
    consensus: float | None = None
    window: int = DEFAULT_WINDOW
    round_size: int = 1
    round_decimals: int | None = 3

    def check(self, n: int) -> None:
        if not 1 <= self.warmup <= n:
            raise ValueError(f"deepconf warm-up must be between 1 and n = {n} traces, got {self.warmup}")
        if not 0 < self.keep_fraction <= 1:
            raise ValueError(f"deepconf keep fraction must lie in (0, 1], got {self.keep_fraction}")
        if self.consensus is not None and not 0 < self.consensus <= 1:
            raise ValueError(f"deepconf consensus must lie in (0, 1], got {self.consensus}")
        if self.window < 1 or self.round_size < 1:
            raise ValueError(f"deepconf window and round size must be >= 1, got {self.window}, {self.round_size}")
        if self.round_decimals is not None and self.round_decimals < 0:
            raise ValueError(f"deepconf round_decimals must be >= 0 or None, got {self.round_decimals}")


def lowest_window(token_confidence: Sequence[float], window: int, round_decimals: int | None = 3) -> float:
    """A trace's lowest window confidence as the authors' online code computes it (``compute_confidence`` and
    ``compute_least_grouped``): each C_i rounded to ``round_decimals`` decimals, then the minimum over every window
    of ``window`` consecutive tokens of the window's mean (its values summed left to right, divided by the
    window), itself rounded; a trace shorter than the window gives the mean of its C_i (not rounded). NaN for a
    trace without tokens. Rounding is Python's ``round`` (half to even on the exact binary value), as theirs.
    ``round_decimals=None``: no rounding (then equal to the ``min`` of
    :func:`calibrl.selection.deepconf.trace_signals`)."""
    c = np.asarray(token_confidence, dtype=np.float64).reshape(-1)
    c = c[~np.isnan(c)]
    if c.size == 0:
        return math.nan
    if round_decimals is not None:
        c = _python_round(c, round_decimals)
    if c.size < window:
        return float(sum(c.tolist()) / c.size)
    # each window's mean from one cumulative sum: O(L) whatever the window; where that could round otherwise than
    # the authors' own left-to-right sum of the window (a mean near a rounding boundary), that sum is taken
    cumulative = np.concatenate(([0.0], np.cumsum(c)))
    means = (cumulative[window:] - cumulative[:-window]) / window
    if round_decimals is None:
        return float(means.min())
    scaled = means * 10.0 ** round_decimals
    near = np.flatnonzero(np.abs(scaled - np.floor(scaled) - 0.5) < 1e-6)
    values = c.tolist()
    for i in near.tolist():
        means[i] = sum(values[i:i + window]) / window
    return float(_python_round(means, round_decimals).min())


def _python_round(values: np.ndarray, decimals: int) -> np.ndarray:
    """``round(v, decimals)`` of each value, as Python rounds (correctly rounded, half to even on the exact binary
    value): numpy's ``round`` scales first and can land on the other side of a half; only values whose scaled
    form lies near a half are rounded one by one."""
    out = np.round(values, decimals)
    scaled = values * 10.0 ** decimals
    for i in np.flatnonzero(np.abs(scaled - np.floor(scaled) - 0.5) < 1e-6).tolist():
        out[i] = round(float(values[i]), decimals)
    return out


def _vote_share(votes: dict[str, float]) -> float:
    total = sum(votes.values())
    return max(votes.values()) / total if total > 0 else 0.0


def sample_online(backend, problems: Sequence[dict], *, n: int, seed: int, settings: OnlineSettings,
                  rows_of: Callable[[dict, list], list[dict]], on_token: Callable[[int], None] | None = None,
                  on_traces: Callable[[int], None] | None = None) -> list[list[dict]]:
    """The rows of each of ``problems`` under DeepConf online (module docstring).

    ``backend``: a transformers backend recording token confidences; ``rows_of(problem, samples)``: the output rows
    of some samples of one problem (``answer`` among their fields), as ``calibrl generate`` writes them;
    ``on_token(k)``: called at every token step of every sampling call, ``on_traces(m)`` after each call with the
    ``m`` traces it sampled (progress).
    """
    progress = {"on_token": on_token} if on_token is not None else {}
    settings.check(n)
    prompts = [p["prompt"] for p in problems]
    rows: list[list[dict]] = [[] for _ in problems]
    votes: list[dict[str, float]] = [{} for _ in problems]

    def lowest(sample) -> float:
        return lowest_window(sample.token_confidence or [], settings.window, settings.round_decimals)

    warm = backend.generate(prompts, settings.warmup, seed, **progress)
    if on_traces is not None:
        on_traces(len(prompts) * settings.warmup)
    thresholds = [online_threshold([lowest(s) for s in group], settings.keep_fraction) for group in warm]

    def add(i: int, samples: list, phase: str) -> None:
        for sample, row in zip(samples, rows_of(problems[i], samples)):
            low = lowest(sample)
            stop = "deepconf_confidence" if sample.stopped_early else ("eos" if sample.ended else "max_new_tokens")
            voted = row.get("answer") is not None and np.isfinite(low) and low >= thresholds[i]
            if voted:
                key = normalize_answer(str(row["answer"]))
                votes[i][key] = votes[i].get(key, 0.0) + low
            row.update(deepconf_phase=phase, stop_reason=stop, deepconf_voted=bool(voted),
                       deepconf_lowest=low if np.isfinite(low) else None)
            rows[i].append(row)

    for i, group in enumerate(warm):
        add(i, group, "warmup")
    done = settings.warmup
    round_index = 0
    while done < n:
        active = [i for i in range(len(problems))
                  if settings.consensus is None or _vote_share(votes[i]) < settings.consensus]
        if not active:
            break
        # without the consensus rule nothing is decided between rounds: the rest in one call, as the authors'
        size = n - done if settings.consensus is None else min(settings.round_size, n - done)
        round_index += 1
        groups = backend.generate([prompts[i] for i in active], size, seed + round_index,
                                  stop_below=[thresholds[i] for i in active], window=settings.window, **progress)
        for i, group in zip(active, groups):
            add(i, group, "final")
        if on_traces is not None:
            on_traces(len(active) * size)
        done += size
    for i, problem_rows in enumerate(rows):
        share = _vote_share(votes[i]) if votes[i] else 0.0
        for index, row in enumerate(problem_rows):
            row.update(sample_index=index, deepconf_threshold=thresholds[i], deepconf_traces=len(problem_rows),
                       deepconf_consensus=share)
    return rows
