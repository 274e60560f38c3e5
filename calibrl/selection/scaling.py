"""Inference-time scaling curves: accuracy of a selection method vs the number N of sampled paths per prompt,
and maj@k (majority's point at N = k)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibrl.selection.registry import selection_method
from calibrl.selection.voting import _need_logprob, _prepare, _text_ids

__all__ = ["ScalingCurve", "maj_at_k", "scaling_curve"]


@dataclass(frozen=True)
class ScalingCurve:
    """Accuracy of a selection method vs the number N of paths per prompt, mean and std over random draws.

    ``n_draws`` is the largest number of random draws actually taken at any N (N = 1 and an N covering every
    prompt's whole group are exact, with 0 and 1 draws), so a curve of exact points reports 1, not the requested
    count.
    """

    method: str
    ns: np.ndarray
    accuracy: np.ndarray
    std: np.ndarray
    n_draws: int
    tokens: np.ndarray | None = None  # [len(ns)] tokens a prompt spends at each N, when the paths' lengths are known

    def to_dict(self) -> dict[str, Any]:
        out = {"ns": self.ns.tolist(), "accuracy": self.accuracy.tolist(), "std": self.std.tolist(),
               "n_draws": self.n_draws}
        if self.tokens is not None:
            out["tokens"] = self.tokens.tolist()
        return out


def _default_ns(min_group: int) -> list[int]:
    ns, n = [], 1
    while n <= min_group:
        ns.append(n)
        n *= 2
    if ns[-1] != min_group:
        ns.append(min_group)
    return ns


def scaling_curve(
    method: str,
    answer_ids,
    correct,
    prompt_ids,
    *,
    logprob_mean=None,
    completions=None,
    confidence=None,
    deepconf_signals=None,
    ns: Sequence[int] | None = None,
    n_draws: int = 20,
    seed: int = 0,
    progress: Callable[[str], Any] | None = None,
) -> ScalingCurve:
    """Accuracy of ``method`` with N paths per prompt, averaged over ``n_draws`` random subsets (without
    replacement, drawn independently per prompt).

    ``ns`` defaults to 1, 2, 4, ... up to the smallest group size (plus that size). A prompt with fewer than N
    paths uses all of its paths. N = 1 is exact: every method then returns the one path drawn, so the expected
    accuracy is the mean over prompts of the per-prompt accuracy (mean@k), with std 0. When N covers every
    prompt's whole group, a single draw is exact too. ``progress(description)`` is called before each draw.
    """
    a, c, p, n_prompts, _ = _prepare(answer_ids, correct, prompt_ids)
    spec = selection_method(method)
    sizes = np.bincount(p, minlength=n_prompts)
    ns = _default_ns(int(sizes.min())) if ns is None else [int(n) for n in ns]
    if any(n < 1 for n in ns):
        raise ValueError(f"ns must be >= 1, got {ns}")
    lpm = None if logprob_mean is None else np.asarray(logprob_mean, dtype=np.float64).reshape(-1)
    if "logprob_mean" in spec.needs:
        _need_logprob(method, lpm)
    conf = None if confidence is None else np.asarray(confidence, dtype=np.float64).reshape(-1)
    signals = None if deepconf_signals is None else np.asarray(deepconf_signals, dtype=np.float64)
    text_ids = _text_ids(completions, len(a))
    per_prompt_acc = np.bincount(p, weights=c, minlength=n_prompts) / sizes
    means, stds = [], []
    used = 1
    for n, masks in zip(ns, _subset_masks(p, sizes, ns, n_draws, seed)):
        if n == 1:
            means.append(float(per_prompt_acc.mean()))
            stds.append(0.0)
            continue
        used = max(used, len(masks))
        accs = []
        for d, packed in enumerate(masks):
            if progress is not None:
                progress(f"N = {n}, draw {d + 1} of {len(masks)}")
            m = np.flatnonzero(np.unpackbits(packed, count=len(a)))  # the kept paths, in order
            res = spec.fn(
                a[m], c[m], p[m],
                logprob_mean=None if lpm is None else lpm[m],
                completions=text_ids[m],
                confidence=None if conf is None else conf[m],
                deepconf_signals=None if signals is None else signals[m],
                # the curve reads the accuracy only: RPC fits only the prompts whose accuracy pruning could change
                # (the full group's draw finds the selection's fit made: the same paths)
                **({"accuracy_only": True} if method == "rpc" else {}),
            )
            accs.append(res.accuracy)
        means.append(float(np.mean(accs)))
        stds.append(float(np.std(accs)))
    return ScalingCurve(method, np.asarray(ns), np.asarray(means), np.asarray(stds), used)


_MASKS: dict[bytes, list[list[np.ndarray]]] = {}  # the last few curves' draws, kept for the other methods' curves


def _subset_masks(p: np.ndarray, sizes: np.ndarray, ns: list[int], n_draws: int, seed: int) -> list[list[np.ndarray]]:
    """The random path subsets of a curve: per N of ``ns``, the draws' masks [N paths] (np.packbits; N = 1 none,
    one draw where N covers every prompt's whole group, else ``n_draws``), each prompt's paths ranked by a random
    key and its first N kept. The draws depend only on the prompts ``p`` [paths] (dense), ``ns``, ``n_draws`` and
    ``seed``, not on the method, so the curves of several methods on one file share them: kept for the last four
    such requests (1 bit a path a draw: 2.6 MB for 21 draws of a million paths)."""
    key = hashlib.blake2b(p.tobytes() + repr((list(ns), n_draws, seed)).encode(), digest_size=16).digest()
    if key in _MASKS:
        return _MASKS[key]
    rng = np.random.default_rng(seed)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    by_prompt = np.argsort(p, kind="stable")  # [N] paths grouped by prompt, each group in path order
    equal = bool((sizes == sizes[0]).all())
    out: list[list[np.ndarray]] = []
    for n in ns:
        masks: list[np.ndarray] = []
        out.append(masks)
        if n == 1:  # exact: the mean of the per-prompt accuracies
            continue
        for _ in range(1 if n >= sizes.max() else n_draws):
            # rank paths within each prompt by a random key, keep the first n
            rand = rng.random(len(p))
            rank = np.empty(len(p), dtype=np.int64)
            if equal:  # the same ranks as the lexsort below, by one stable sort per prompt's row
                within = np.argsort(rand[by_prompt].reshape(-1, int(sizes[0])), axis=1, kind="stable")  # [G, k]
                rank[by_prompt[(start[:, None] + within).reshape(-1)]] = np.tile(np.arange(int(sizes[0])), len(sizes))
            else:
                order = np.lexsort((rand, p))
                rank[order] = np.arange(len(p)) - start[p[order]]
            masks.append(np.packbits(rank < n))
    _MASKS[key] = out
    while len(_MASKS) > 4:
        _MASKS.pop(next(iter(_MASKS)))
    return out


def maj_at_k(answer_ids, correct, prompt_ids, *, k: int, n_draws: int = 20, seed: int = 0) -> float:
    """maj@k: accuracy of a majority vote over k random paths per prompt, averaged over ``n_draws`` draws."""
    return float(scaling_curve("majority", answer_ids, correct, prompt_ids, ns=(k,), n_draws=n_draws,
                               seed=seed).accuracy[0])
