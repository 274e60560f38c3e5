"""Voting over one prompt's sampled paths, and best-of-N.

- ``majority``: self-consistency; the answer cluster with the most paths wins.
- ``weighted``: probability-weighted vote; score(y) = sum over paths with answer y of exp(logprob_mean).
- ``pc``: Perplexity Consistency (arXiv 2502.00511): like ``weighted`` but identical completion texts count once.
- ``confidence_weighted``: weighted majority by a per-path confidence in [0, 1] (e.g. the verbalized confidence of
  RLCR, arXiv 2507.16806): score(y) = sum over paths with answer y of their confidence.
- ``best_of_n``: the single path with the highest confidence.

Every method takes flat arrays (one entry per sampled path, answers as cluster ids from
:func:`calibrl.selection.answers.answer_clusters`) and a prompt id per path. Ties follow the reference code
(WNJXYK/RPC, compute_sc.py / compute_rpc.py): when k answers tie for the top score, the prompt counts as (number
of correct among them) / k, i.e. the expected accuracy of a uniform tie-break. The helpers (:func:`_prepare`,
:func:`_vote`, :func:`_first_occurrence`, ...) are shared with :mod:`calibrl.selection.pruning`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "SelectionResult", "best_of_n", "confidence_weighted_vote", "majority_vote", "perplexity_consistency",
    "weighted_vote",
]


@dataclass(frozen=True)
class SelectionResult:
    """Per-prompt outcome of a selection method.

    ``prompts``: the sorted unique prompt ids; ``correct``: expected correctness per prompt (fractional on ties);
    ``answer_ids``: the chosen answer cluster (the first of tied ones); ``confidence``: the winner's share of the
    prompt's total score (vote share, normalised probability mass; best_of_n: the path's own confidence).
    """

    method: str
    prompts: np.ndarray
    correct: np.ndarray
    answer_ids: np.ndarray
    confidence: np.ndarray

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.correct)) if self.correct.size else float("nan")


def _dense(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)``: the sorted distinct values and each value's index among them.
    Whole numbers from 0 to at most twice their count (prompt indices, answer clusters: every call of a scaling
    curve's draws) take a bincount of which values occur instead of a sort, the same result in linear time."""
    values = np.asarray(values).reshape(-1)
    if values.dtype.kind in "iu" and values.size and 0 <= values.min() and values.max() <= 2 * values.size:
        present = np.zeros(int(values.max()) + 1, dtype=bool)
        present[values] = True
        uniq = np.flatnonzero(present)
        return uniq.astype(values.dtype), (np.cumsum(present) - 1)[values].astype(np.int64)
    uniq, inv = np.unique(values, return_inverse=True)
    return uniq, inv.reshape(-1).astype(np.int64)


def _answer_pairs(pidx: np.ndarray, answer_ids) -> tuple[np.ndarray, np.ndarray]:
    """The (prompt, answer cluster) pairs of paths with dense prompt indices ``pidx`` [N]: the first path of each
    pair [pairs] (pairs sorted by prompt, then answer) and each path's pair index [N]."""
    _, aidx = _dense(answer_ids)
    pair = pidx.astype(np.int64) * (int(aidx.max(initial=0)) + 1) + aidx
    _, pair_first, pair_idx = np.unique(pair, return_index=True, return_inverse=True)
    return pair_first, pair_idx.reshape(-1)


def _pair_correctness(pair_idx: np.ndarray, correct: np.ndarray, n_pairs: int) -> np.ndarray:
    """[pairs] the share of correct paths in each (prompt, answer cluster) pair (fractional where the cluster's
    paths disagree): what the vote credits a top pair with."""
    return np.bincount(pair_idx, weights=correct.astype(np.float64), minlength=n_pairs) / np.bincount(
        pair_idx, minlength=n_pairs)


def _vote(
    method: str,
    weights: np.ndarray,
    answer_ids: np.ndarray,
    correct: np.ndarray,
    pidx: np.ndarray,
    n_prompts: int,
    prompts: np.ndarray,
) -> SelectionResult:
    """Sum ``weights`` per (prompt, answer); the top answer of each prompt wins, ties split fractionally."""
    pair_first, pair_idx = _answer_pairs(pidx, answer_ids)
    n_pairs = len(pair_first)
    score = np.bincount(pair_idx, weights=weights, minlength=n_pairs)
    pair_correct = _pair_correctness(pair_idx, correct, n_pairs)
    pair_prompt = pidx[pair_first]
    top = np.full(n_prompts, -np.inf)
    np.maximum.at(top, pair_prompt, score)
    is_top = score >= top[pair_prompt] - 1e-12 * np.abs(top[pair_prompt])
    n_top = np.bincount(pair_prompt, weights=is_top, minlength=n_prompts)
    acc = np.bincount(pair_prompt, weights=is_top * pair_correct, minlength=n_prompts) / n_top
    total = np.bincount(pair_prompt, weights=score, minlength=n_prompts)
    # first tied pair per prompt (pairs are sorted by prompt, so the smallest pair index among the top ones)
    winner = np.full(n_prompts, n_pairs, dtype=np.int64)
    np.minimum.at(winner, pair_prompt[is_top], np.flatnonzero(is_top))
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.where(total > 0, top / total, 1.0 / n_top)
    return SelectionResult(method, prompts, acc, np.asarray(answer_ids)[pair_first[winner]], conf)


def _prepare(answer_ids, correct, prompt_ids):
    answer_ids = np.asarray(answer_ids).reshape(-1)
    correct = np.asarray(correct).astype(bool).reshape(-1)
    prompts, pidx = _dense(np.asarray(prompt_ids).reshape(-1))
    if not (answer_ids.shape == correct.shape == pidx.shape):
        raise ValueError(
            f"answer_ids ({answer_ids.shape[0]}), correct ({correct.shape[0]}) and prompt_ids ({pidx.shape[0]}) "
            "need one entry per sampled path"
        )
    if pidx.size == 0:
        raise ValueError("no sampled paths")
    return answer_ids, correct, pidx, len(prompts), prompts


TEXT_DIGEST_BYTES = 16
_NO_DIGEST = bytes(TEXT_DIGEST_BYTES)


def text_digest(text: str) -> bytes:
    """The first 16 bytes of the SHA-256 digest of ``text`` (its UTF-8, lone surrogates kept as they are).

    Equal texts have equal digests; two distinct texts share one with probability 2^-128, so among n texts a
    collision has probability about n^2 / 2^129 (1e-27 for a million). What ``calibrl eval`` keeps of each
    completion instead of its text: PC and RPC only ask which texts are identical.
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:TEXT_DIGEST_BYTES]


def digest_ids(digests: bytes | bytearray | np.ndarray, missing: np.ndarray) -> np.ndarray:
    """Dense integer id per text from the texts' digests.

    ``digests``: N x 16 bytes (row i's :func:`text_digest`, anything where ``missing``), ``missing`` [N] bool: the
    rows without a text. Returns [N] int64: equal digests share an id (0 .. n_distinct - 1, in digest order); a
    missing text gets an id of its own above those (it never equals another path's).
    """
    missing = np.asarray(missing, dtype=bool).reshape(-1)
    words = np.frombuffer(digests, dtype=np.uint8).reshape(-1, TEXT_DIGEST_BYTES).view("<u8")  # [N, 2]
    if words.shape[0] != missing.shape[0]:
        raise ValueError(f"{words.shape[0]} digests for {missing.shape[0]} rows")
    ids = np.zeros(len(missing), dtype=np.int64)
    present = np.flatnonzero(~missing)
    if present.size:
        order = present[np.lexsort((words[present, 1], words[present, 0]))]
        new = np.ones(order.size, dtype=bool)  # [n_present] a digest differing from the previous in sorted order
        new[1:] = (words[order[1:]] != words[order[:-1]]).any(axis=1)
        ids[order] = np.cumsum(new) - 1
    ids[missing] = ids.max(initial=0) + 1 + np.flatnonzero(missing)
    return ids


def _text_ids(completions, n: int) -> np.ndarray:
    """Integer id per completion text (equal texts share an id); all distinct when texts are unknown.

    ``completions``: [N] texts (str, or None where unknown), or integer ids already (returned as they are, e.g.
    ``Samples.completion_ids``). Texts are compared through their :func:`text_digest`, so no array as wide as the
    longest text is built.
    """
    if completions is None:
        return np.arange(n)
    if isinstance(completions, np.ndarray) and completions.dtype.kind in "iu":
        return completions
    values = list(np.asarray(completions, dtype=object).reshape(-1))
    missing = np.fromiter((c is None for c in values), dtype=bool, count=len(values))
    digests = b"".join(_NO_DIGEST if c is None else text_digest(c if isinstance(c, str) else str(c)) for c in values)
    return digest_ids(digests, missing)


def _first_occurrence(pidx, answer_ids, text_ids) -> np.ndarray:
    """Mask keeping the first path of each (prompt, answer, completion text): identical texts count once.

    Paths are sorted by (prompt, answer, text, position), so no combined key can overflow however many there are.
    """
    pidx = np.asarray(pidx).reshape(-1)
    _, tidx = _dense(text_ids)
    if tidx.size and tidx.max() == tidx.size - 1:  # every text distinct (none known, say): every path is a first
        return np.ones(len(pidx), dtype=bool)
    _, aidx = _dense(answer_ids)
    keep = np.zeros(len(pidx), dtype=bool)
    if not len(pidx):
        return keep
    order = np.lexsort((np.arange(len(pidx)), tidx, aidx, pidx))  # [N] grouped, first position first
    new = np.ones(len(order), dtype=bool)
    new[1:] = (pidx[order[1:]] != pidx[order[:-1]]) | (aidx[order[1:]] != aidx[order[:-1]]) | (
        tidx[order[1:]] != tidx[order[:-1]])
    keep[order[new]] = True
    return keep


def _need_logprob(method: str, logprob_mean) -> np.ndarray:
    if logprob_mean is None:
        raise ValueError(f"selection method {method!r} needs logprob_mean (mean token log-prob of each path)")
    lpm = np.asarray(logprob_mean, dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(lpm)
    if bad.any():
        raise ValueError(
            f"selection method {method!r} needs a finite logprob_mean on every path; {int(bad.sum())} of {lpm.size} "
            f"are NaN or infinite (first at index {int(np.flatnonzero(bad)[0])})"
        )
    return lpm


def majority_vote(answer_ids, correct, prompt_ids, **_: Any) -> SelectionResult:
    """Self-consistency: the answer cluster with the most paths wins."""
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    return _vote("majority", np.ones(len(a)), a, c, p, n, prompts)


def weighted_vote(answer_ids, correct, prompt_ids, *, logprob_mean=None, **_: Any) -> SelectionResult:
    """Probability-weighted vote: score(y) = sum over paths with answer y of exp(logprob_mean)."""
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    return _vote("weighted", np.exp(_need_logprob("weighted", logprob_mean)), a, c, p, n, prompts)


def perplexity_consistency(answer_ids, correct, prompt_ids, *, logprob_mean=None, completions=None, **_: Any) -> SelectionResult:
    """PC: score(y) = sum over DISTINCT completion texts with answer y of exp(logprob_mean).

    Without ``completions`` every path counts as distinct (PC = weighted vote).
    """
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    prob = np.exp(_need_logprob("pc", logprob_mean))
    keep = _first_occurrence(p, a, _text_ids(completions, len(a)))
    return _vote("pc", np.where(keep, prob, 0.0), a, c, p, n, prompts)


def confidence_weighted_vote(answer_ids, correct, prompt_ids, *, confidence=None, **_: Any) -> SelectionResult:
    """Confidence-weighted majority: score(y) = sum over paths with answer y of ``confidence`` (RLCR's
    confidence-weighted voting, arXiv 2507.16806, with the model's verbalized confidence).

    ``confidence``: one value in [0, 1] per path; NaN (or None) where a path stated none, which then adds nothing
    to its answer's score (our reading: an unstated confidence is no evidence). A prompt whose paths all lack one
    is a tie of all its answers, scored as the expected accuracy of a uniform tie-break. Unlike ``best_of_n`` the
    scores add up, so several moderately confident paths can outvote one very confident path, and unlike
    ``majority`` many unconfident paths can lose to a few confident ones. The result's ``confidence`` is the
    winner's share of the prompt's summed confidence.
    """
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    if confidence is None:
        raise ValueError("selection method 'confidence_weighted' needs confidence (one value in [0, 1] per path)")
    conf = np.asarray([np.nan if v is None else v for v in np.asarray(confidence, dtype=object).reshape(-1)],
                      dtype=np.float64)
    if conf.shape != a.shape:
        raise ValueError(f"confidence has {conf.size} entries for {a.size} sampled paths")
    bad = np.isinf(conf) | (conf < 0) | (conf > 1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"confidence must be in [0, 1] (NaN: none stated); path {first} has {conf[first]}")
    return _vote("confidence_weighted", np.nan_to_num(conf, nan=0.0), a, c, p, n, prompts)


def best_of_n(answer_ids, correct, prompt_ids, *, confidence=None, logprob_mean=None, **_: Any) -> SelectionResult:
    """The path with the highest ``confidence`` (default exp(logprob_mean)); tied paths split fractionally."""
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    if confidence is None:
        confidence = np.exp(_need_logprob("best_of_n", logprob_mean))
    conf = np.asarray(confidence, dtype=np.float64).reshape(-1)
    top = np.full(n, -np.inf)
    np.maximum.at(top, p, conf)
    is_top = conf >= top[p]
    n_top = np.bincount(p, weights=is_top, minlength=n)
    acc = np.bincount(p, weights=is_top & c, minlength=n) / n_top
    winner = np.full(n, len(a), dtype=np.int64)
    np.minimum.at(winner, p[is_top], np.flatnonzero(is_top))
    return SelectionResult("best_of_n", prompts, acc, a[winner], top)
