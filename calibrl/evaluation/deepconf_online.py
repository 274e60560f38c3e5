"""``calibrl generate --deepconf-online``: DeepConf's online sampling (Fu et al., arXiv 2508.15260, Algorithm 2) on
the local (transformers) backend.

For each problem, with a budget of ``n`` traces:

1. **Warm-up**: ``warmup`` traces are sampled in full. Their lowest window confidences (``min`` of
   :func:`calibrl.selection.deepconf.trace_signals`) set the problem's stopping threshold
   ``s = np.percentile(warm-up minima, (1 - keep_fraction) * 100)`` (:func:`calibrl.selection.deepconf.online_threshold`):
   ``keep_fraction`` 0.1 is the paper's DeepConf-low (the authors' ``CONFIDENCE_PERCENTILE = 90``), 0.9
   DeepConf-high.
2. **Sampling with early stop**, ``round_size`` traces per problem at a time: a trace stops as soon as the mean
   confidence of its last ``window`` tokens falls below ``s`` (checked from its ``window``-th token on,
   :meth:`calibrl.evaluation.backends._TransformersBackend.generate`). Stopped traces are kept in the file
   (``stop_reason = "deepconf_confidence"``) but do not vote.
3. **Consensus**: the vote counts the warm-up traces whose lowest window confidence is >= ``s`` and the traces
   that were not stopped, each with an extracted answer, weighted by its lowest window confidence (the authors'
   ``deepconf-online.py``); once the leading answer's share of the weight is >= ``consensus`` (the paper's
   tau = 0.95), the problem gets no more traces. Otherwise sampling goes on until the budget is spent.

The paper checks consensus after every trace; here it is checked after every round of ``round_size`` traces
(default 1: the paper's rule; larger rounds batch better and may overshoot by up to ``round_size - 1`` traces).

Each row says what happened to it: ``deepconf_phase`` ("warmup" / "final"), ``deepconf_threshold`` (s),
``stop_reason`` ("eos", "max_new_tokens" or "deepconf_confidence"), ``deepconf_voted`` (counted in the online vote),
``deepconf_traces`` (the problem's number of traces: resuming treats a problem with that many rows as done) and
``deepconf_consensus`` (the leading answer's final share).

vLLM cannot stop a single sequence on a running statistic of its own top-k log-probs without a patch to its
sampler or output processor (the authors patch vLLM: https://github.com/vllm-project/vllm/pull/23201, not merged);
``--deepconf-online`` therefore runs on the transformers backend only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from calibrl.selection.answers import normalize_answer
from calibrl.selection.deepconf import DEFAULT_WINDOW, online_threshold, trace_signals

__all__ = ["OnlineSettings", "sample_online"]


@dataclass(frozen=True)
class OnlineSettings:
    """DeepConf online's settings (the paper's defaults: 16 warm-up traces, DeepConf-low, tau = 0.95)."""

    warmup: int = 16
    keep_fraction: float = 0.1
    consensus: float = 0.95
    window: int = DEFAULT_WINDOW
    round_size: int = 1

    def check(self, n: int) -> None:
        if not 1 <= self.warmup <= n:
            raise ValueError(f"deepconf warm-up must be between 1 and n = {n} traces, got {self.warmup}")
        if not 0 < self.keep_fraction <= 1:
            raise ValueError(f"deepconf keep fraction must lie in (0, 1], got {self.keep_fraction}")
        if not 0 < self.consensus <= 1:
            raise ValueError(f"deepconf consensus must lie in (0, 1], got {self.consensus}")
        if self.window < 1 or self.round_size < 1:
            raise ValueError(f"deepconf window and round size must be >= 1, got {self.window}, {self.round_size}")


def _vote_share(votes: dict[str, float]) -> float:
    total = sum(votes.values())
    return max(votes.values()) / total if total > 0 else 0.0


def sample_online(backend, problems: Sequence[dict], *, n: int, seed: int, settings: OnlineSettings,
                  rows_of: Callable[[dict, list], list[dict]]) -> list[list[dict]]:
    """The rows of each of ``problems`` under DeepConf online (module docstring).

    ``backend``: a transformers backend recording token confidences; ``rows_of(problem, samples)``: the output rows
    of some samples of one problem (``answer`` among their fields), as ``calibrl generate`` writes them.
    """
    settings.check(n)
    prompts = [p["prompt"] for p in problems]
    rows: list[list[dict]] = [[] for _ in problems]
    votes: list[dict[str, float]] = [{} for _ in problems]
    thresholds: list[float] = []

    def add(i: int, samples: list, phase: str) -> None:
        for sample, row in zip(samples, rows_of(problems[i], samples)):
            lowest = float(trace_signals(sample.token_confidence or [], window=settings.window)[3])
            if phase == "warmup":
                stop = "eos" if sample.ended else "max_new_tokens"
                voted = lowest >= thresholds[i]
            else:
                stop = "deepconf_confidence" if sample.stopped_early else ("eos" if sample.ended else "max_new_tokens")
                voted = not sample.stopped_early
            voted = voted and row.get("answer") is not None and np.isfinite(lowest)
            if voted:
                key = normalize_answer(str(row["answer"]))
                votes[i][key] = votes[i].get(key, 0.0) + lowest
            row.update(deepconf_phase=phase, stop_reason=stop, deepconf_voted=bool(voted))
            rows[i].append(row)

    warm = backend.generate(prompts, settings.warmup, seed)
    for i, group in enumerate(warm):
        lows = [trace_signals(s.token_confidence or [], window=settings.window)[3] for s in group]
        thresholds.append(online_threshold(lows, settings.keep_fraction))
    for i, group in enumerate(warm):
        add(i, group, "warmup")
    done = settings.warmup
    round_index = 0
    while done < n:
        active = [i for i in range(len(problems)) if _vote_share(votes[i]) < settings.consensus]
        if not active:
            break
        size = min(settings.round_size, n - done)
        round_index += 1
        groups = backend.generate([prompts[i] for i in active], size, seed + round_index,
                                  stop_below=[thresholds[i] for i in active], window=settings.window)
        for i, group in zip(active, groups):
            add(i, group, "final")
        done += size
    for i, problem_rows in enumerate(rows):
        share = _vote_share(votes[i])
        for index, row in enumerate(problem_rows):
            row.update(sample_index=index, deepconf_threshold=thresholds[i], deepconf_traces=len(problem_rows),
                       deepconf_consensus=share)
    return rows
