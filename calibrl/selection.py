"""Inference-time scaling: pick one answer per prompt among N sampled reasoning paths.

Methods (all take flat arrays, one entry per sampled path, and a prompt id per path):

- ``majority``: self-consistency; the answer cluster with the most paths wins.
- ``weighted``: probability-weighted vote; score(y) = sum over paths with answer y of exp(logprob_mean).
- ``pc``: Perplexity Consistency (arXiv 2502.00511): like ``weighted`` but identical completion texts count once.
- ``rpc``: Reasoning Pruning + PC: per prompt, fit a 2-component Weibull mixture to the path probabilities
  exp(logprob_mean) and drop a path whose posterior favours the lower-mean component AND whose probability is below
  the prompt's mean probability; then PC over the remaining paths.
- ``best_of_n``: the single path with the highest confidence.

Ties follow the reference code (WNJXYK/RPC, compute_sc.py / compute_rpc.py): when k answers tie for the top score,
the prompt counts as (number of correct among them) / k, i.e. the expected accuracy of a uniform tie-break.

RPC follows WNJXYK/RPC ``compute_rpc.py``: ``scipy.optimize.minimize`` (L-BFGS-B) of the mixture's negative
log-likelihood from the initial point (w1, k1, lam1, k2, lam2) = (0.5, 1.0, 1.0, 1.5, 2.0) with bounds
w1 in [0.2, 0.8] and every shape/scale >= 0.01; the component with the larger Weibull mean lam * Gamma(1 + 1/k) is
the "high" one; pruned paths keep their answer cluster in the vote with zero weight. Differences, on purpose:
the likelihood is computed in log space (logsumexp; the reference's plain pdf underflows to log(0) for far
outliers), the analytic gradient is passed to the optimiser (same optimum, ~5x fewer evaluations), and prompts whose
N path probabilities are all equal (e.g. N = 1) skip the fit (no path lies below the mean, so none is pruned).
Cost: one small fit per prompt (about 9 ms here, bench/selection.py), the slowest method by far on scaling curves.

Answer equivalence: :func:`answer_clusters` maps answers to integer cluster ids, merging answers that math-verify
judges equal within a prompt; missing answers (None) form one "no answer" cluster per prompt, which can win a vote
(as ``[Invalid]`` does in the reference code) and then counts with its paths' correctness.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "METHODS",
    "ScalingCurve",
    "SelectionResult",
    "answer_clusters",
    "best_of_n",
    "maj_at_k",
    "majority_vote",
    "normalize_answer",
    "perplexity_consistency",
    "rpc",
    "rpc_keep_mask",
    "scaling_curve",
    "select",
    "weighted_vote",
]

METHODS = ("majority", "weighted", "pc", "rpc", "best_of_n")
_NEEDS_LOGPROB = {"weighted", "pc", "rpc"}


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

    def to_dict(self) -> dict[str, Any]:
        return {"ns": self.ns.tolist(), "accuracy": self.accuracy.tolist(), "std": self.std.tolist(),
                "n_draws": self.n_draws}


# ----------------------------------------------------------------------------------------------------------------
# answer equivalence


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{(.*)\}\s*$", re.S)
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")
_SPACES = re.compile(r"\s+|\\[ ,;:!]|\\(?:left|right)(?![a-zA-Z])|\\(?:dfrac|tfrac)")


def normalize_answer(answer: str | None) -> str | None:
    """Cheap canonical form used for exact matching: strip $...$ and \\boxed{}, spaces, \\left/\\right, spacing
    commands, a trailing period; \\dfrac/\\tfrac -> \\frac; numbers as Python floats print them (``0.50`` -> ``0.5``,
    ``1,000`` -> ``1000.0``, ``3`` -> ``3.0``); commas are dropped only as thousands separators
    (``-?\\d{1,3}(,\\d{3})+(\\.\\d+)?`` with no space after a comma), so ``2,3``, ``2, 3`` and ``2, 300`` stay
    distinct from ``23`` and ``2300``."""
    if answer is None:
        return None
    s = str(answer).strip()
    for _ in range(3):
        s = s.strip().strip("$").strip()
        m = _BOXED.match(s)
        if not m:
            break
        s = m.group(1)
    spaced_comma = re.search(r",\s", s) is not None
    s = _SPACES.sub(lambda m: "\\frac" if "frac" in m.group(0) else "", s).rstrip(".")
    if _THOUSANDS.match(s) and not spaced_comma:  # "1,000" -> 1000; "2, 3" stays a pair
        s = s.replace(",", "")
    try:
        return repr(float(s))
    except ValueError:
        return s.lower()


def _timeout_arg() -> int | None:
    # math-verify's timeouts use signal.alarm, which only works in the main thread
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=65536)
def _parse(answer: str):
    from math_verify import parse

    timeout = _timeout_arg()
    parsed = parse(answer, parsing_timeout=timeout)
    if not parsed and not answer.lstrip().startswith("$"):
        parsed = parse(f"${answer}$", parsing_timeout=timeout)
    return parsed


@functools.lru_cache(maxsize=262144)
def _math_equal(a: str, b: str) -> bool:
    """math-verify equivalence of two answers (cached; called with a <= b so the cache is symmetric)."""
    from math_verify import verify

    pa, pb = _parse(a), _parse(b)
    if not pa or not pb:
        return False
    try:
        return bool(verify(pa, pb, timeout_seconds=_timeout_arg()))
    except Exception:  # noqa: BLE001 - a failed comparison means "not shown equal"
        return False


def _math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def answer_clusters(
    answers: Sequence[str | None] | np.ndarray,
    prompt_ids: Sequence[Any] | np.ndarray,
    *,
    use_math_verify: bool = True,
    progress: bool | Callable[[Any, int], Any] = False,
) -> np.ndarray:
    """Integer cluster id per answer; equal ids <=> same prompt and equivalent answers.

    Answers are first grouped by :func:`normalize_answer` (exact match after normalisation). With math-verify
    installed and ``use_math_verify``, each prompt's distinct normalised answers are then merged greedily: an answer
    joins the first earlier cluster whose representative math-verify judges equal (``verify(parse(a), parse(b))``,
    both cached with ``functools.lru_cache``), so ``0.5`` and ``\\frac{1}{2}`` share an id. Missing answers (None)
    form one cluster per prompt. ``progress``: True for a rich progress bar over prompts, or a callable wrapping an
    iterable like ``rich.progress.track(iterable, total=...)``.
    """
    answers = np.asarray(answers, dtype=object)
    _, pidx = np.unique(np.asarray(prompt_ids), return_inverse=True)
    pidx = pidx.reshape(-1)
    if answers.shape != pidx.shape:
        raise ValueError(f"answers has {answers.shape[0]} entries, prompt_ids {pidx.shape[0]}")
    norm = np.array(["\x00none" if a is None else "\x01" + normalize_answer(a) for a in answers], dtype=object)
    # first stage: (prompt, normalised string) -> id
    keys = np.array([f"{p}\x02{n}" for p, n in zip(pidx.tolist(), norm)], dtype=str)
    uniq, first, ids = np.unique(keys, return_index=True, return_inverse=True)
    ids = ids.reshape(-1)
    if not use_math_verify or not _math_verify_available():
        return ids.astype(np.int64)

    # second stage: merge distinct strings of a prompt that math-verify judges equal
    parent = np.arange(len(uniq))
    u_prompt = pidx[first]
    u_text = [answers[i] for i in first]
    order = np.argsort(u_prompt, kind="stable")
    bounds = np.flatnonzero(np.diff(u_prompt[order])) + 1
    groups = [g for g in np.split(order, bounds) if len(g) > 1]
    if progress is True:
        from rich.progress import track

        def progress(it, total):
            return track(it, total=total, description="math-verify answer clustering", transient=True)

    iterable = progress(groups, len(groups)) if callable(progress) else groups
    for group in iterable:
        reps: list[int] = []
        for u in group:
            text = u_text[u]
            if text is None:
                continue
            for rep in reps:
                a, b = sorted((str(text), str(u_text[rep])))
                if _math_equal(a, b):
                    parent[u] = rep
                    break
            else:
                reps.append(u)
    return parent[ids].astype(np.int64)


# ----------------------------------------------------------------------------------------------------------------
# voting core


def _dense(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniq, inv = np.unique(np.asarray(values), return_inverse=True)
    return uniq, inv.reshape(-1).astype(np.int64)


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
    _, aidx = _dense(answer_ids)
    pair = pidx * (int(aidx.max()) + 1) + aidx
    _, pair_first, pair_idx = np.unique(pair, return_index=True, return_inverse=True)
    pair_idx = pair_idx.reshape(-1)
    n_pairs = len(pair_first)
    score = np.bincount(pair_idx, weights=weights, minlength=n_pairs)
    pair_correct = np.bincount(pair_idx, weights=correct.astype(np.float64), minlength=n_pairs) / np.bincount(
        pair_idx, minlength=n_pairs
    )
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


def _text_ids(completions, n: int) -> np.ndarray:
    """Integer id per completion text (equal texts share an id); all distinct when texts are unknown."""
    if completions is None:
        return np.arange(n)
    if isinstance(completions, np.ndarray) and completions.dtype.kind in "iu":
        return completions
    completions = np.asarray(completions, dtype=object)
    missing = np.array([c is None for c in completions])
    texts = np.where(missing, "", completions).astype(str)
    _, ids = np.unique(texts, return_inverse=True)
    ids = ids.reshape(-1).astype(np.int64)
    # a missing text never equals another path's
    ids[missing] = ids.max(initial=0) + 1 + np.flatnonzero(missing)
    return ids


def _first_occurrence(pidx, answer_ids, text_ids) -> np.ndarray:
    """Mask keeping the first path of each (prompt, answer, completion text): identical texts count once."""
    _, aidx = _dense(answer_ids)
    _, tidx = _dense(text_ids)
    key = (pidx * (int(aidx.max()) + 1) + aidx) * (int(tidx.max()) + 1) + tidx
    _, first = np.unique(key, return_index=True)
    keep = np.zeros(len(key), dtype=bool)
    keep[first] = True
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


# ----------------------------------------------------------------------------------------------------------------
# RPC: Weibull-mixture reasoning pruning


_RPC_X0 = np.array([0.5, 1.0, 1.0, 1.5, 2.0])
_RPC_BOUNDS = [(0.2, 0.8), (0.01, None), (0.01, None), (0.01, None), (0.01, None)]


def _weibull_logpdf(x, k, lam):
    z = np.log(x) - np.log(lam)
    t = np.exp(k * z)
    return np.log(k) - np.log(lam) + (k - 1.0) * z - t, z, t


def _mixture_terms(params: np.ndarray, x: np.ndarray):
    """Per-path log mixture density and its gradient wrt (w, k1, lam1, k2, lam2); params broadcast against x."""
    w, k1, l1, k2, l2 = (params[..., i] for i in range(5))
    lp1, z1, t1 = _weibull_logpdf(x, k1, l1)
    lp2, z2, t2 = _weibull_logpdf(x, k2, l2)
    a1, a2 = np.log(w) + lp1, np.log1p(-w) + lp2
    m = np.maximum(a1, a2)
    log_mix = m + np.log(np.exp(a1 - m) + np.exp(a2 - m))
    r1 = np.exp(a1 - log_mix)
    r2 = 1.0 - r1
    grad = np.stack([
        r1 / w - r2 / (1.0 - w),
        r1 * (1.0 / k1 + z1 * (1.0 - t1)),
        r1 * (k1 / l1) * (t1 - 1.0),
        r2 * (1.0 / k2 + z2 * (1.0 - t2)),
        r2 * (k2 / l2) * (t2 - 1.0),
    ], axis=-1)
    return log_mix, grad


def _mixture_nll_grad(params: np.ndarray, x: np.ndarray) -> tuple[float, np.ndarray]:
    """Negative log-likelihood of one prompt's probabilities under the mixture, and its gradient."""
    log_mix, grad = _mixture_terms(params, x)
    nll, g = -float(np.sum(log_mix)), -grad.sum(axis=0)
    if not np.isfinite(nll) or not np.all(np.isfinite(g)):
        return 1e300, np.zeros(5)
    return nll, g


def _weibull_mean(k, lam):
    from scipy.special import gamma

    return lam * gamma(1.0 + 1.0 / k)


def _posterior_low(x: np.ndarray, params: np.ndarray) -> np.ndarray:
    """True where the fitted mixture's posterior favours the lower-mean component (params [.., 5] per path)."""
    w, k1, l1, k2, l2 = (params[..., i] for i in range(5))
    a1 = np.log(w) + _weibull_logpdf(x, k1, l1)[0]
    a2 = np.log1p(-w) + _weibull_logpdf(x, k2, l2)[0]
    first_is_high = _weibull_mean(k1, l1) >= _weibull_mean(k2, l2)
    return np.where(first_is_high, a1 < a2, a2 < a1)


def _rpc_prune_group(prob: np.ndarray) -> np.ndarray:
    """Keep-mask for one prompt's path probabilities (WNJXYK/RPC wpc_evaluator's pruning step)."""
    if prob.size < 2 or np.all(prob == prob[0]):
        return np.ones(prob.size, dtype=bool)
    from scipy.optimize import minimize

    x = np.clip(prob, 1e-300, None)
    with np.errstate(all="ignore"):  # trial points far out overflow; the objective reports them as huge
        res = minimize(_mixture_nll_grad, _RPC_X0, args=(x,), jac=True, method="L-BFGS-B", bounds=_RPC_BOUNDS)
        low = _posterior_low(x, np.broadcast_to(res.x, (x.size, 5)))
    return ~(low & (prob < prob.mean()))


def rpc_keep_mask(prompt_ids, logprob_mean) -> np.ndarray:
    """Paths RPC keeps: False where the Weibull-mixture posterior favours the low component and the path's
    probability exp(logprob_mean) is below its prompt's mean. One scipy L-BFGS-B fit per prompt, as the reference.

    The mixture likelihood is unbounded (a component can collapse onto one point), so the fit is a local optimum
    reached from the reference's start. Other optimisers of the same likelihood (EM vectorised over prompts; one
    L-BFGS-B run over all prompts jointly) reach different optima and prune differently on 14-67% of prompts of
    random test groups, so only the reference's fit is offered.
    """
    _, pidx = _dense(np.asarray(prompt_ids).reshape(-1))
    prob = np.exp(np.asarray(logprob_mean, dtype=np.float64).reshape(-1))
    keep = np.ones(prob.size, dtype=bool)
    order = np.argsort(pidx, kind="stable")
    for group in np.split(order, np.flatnonzero(np.diff(pidx[order])) + 1):
        keep[group] = _rpc_prune_group(prob[group])
    return keep


def rpc(answer_ids, correct, prompt_ids, *, logprob_mean=None, completions=None, **_: Any) -> SelectionResult:
    """RPC = Reasoning Pruning (Weibull mixture, see :func:`rpc_keep_mask`) + Perplexity Consistency."""
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    lpm = _need_logprob("rpc", logprob_mean)
    prob = np.exp(lpm)
    keep = _first_occurrence(p, a, _text_ids(completions, len(a))) & rpc_keep_mask(p, lpm)
    return _vote("rpc", np.where(keep, prob, 0.0), a, c, p, n, prompts)


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


_FUNCS: dict[str, Callable[..., SelectionResult]] = {
    "majority": majority_vote,
    "weighted": weighted_vote,
    "pc": perplexity_consistency,
    "rpc": rpc,
    "best_of_n": best_of_n,
}


def select(method: str, answer_ids, correct, prompt_ids, **kwargs: Any) -> SelectionResult:
    """Run selection ``method`` (one of :data:`METHODS`); kwargs: logprob_mean, completions, confidence."""
    try:
        fn = _FUNCS[method]
    except KeyError:
        raise ValueError(f"unknown selection method {method!r}; choose one of {', '.join(METHODS)}") from None
    return fn(answer_ids, correct, prompt_ids, **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# scaling curves


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
    ns: Sequence[int] | None = None,
    n_draws: int = 20,
    seed: int = 0,
) -> ScalingCurve:
    """Accuracy of ``method`` with N paths per prompt, averaged over ``n_draws`` random subsets (without
    replacement, drawn independently per prompt).

    ``ns`` defaults to 1, 2, 4, ... up to the smallest group size (plus that size). A prompt with fewer than N
    paths uses all of its paths. N = 1 is exact: every method then returns the one path drawn, so the expected
    accuracy is the mean over prompts of the per-prompt accuracy (mean@k), with std 0. When N covers every
    prompt's whole group, a single draw is exact too.
    """
    a, c, p, n_prompts, _ = _prepare(answer_ids, correct, prompt_ids)
    if method not in _FUNCS:
        raise ValueError(f"unknown selection method {method!r}; choose one of {', '.join(METHODS)}")
    sizes = np.bincount(p, minlength=n_prompts)
    ns = _default_ns(int(sizes.min())) if ns is None else [int(n) for n in ns]
    if any(n < 1 for n in ns):
        raise ValueError(f"ns must be >= 1, got {ns}")
    lpm = None if logprob_mean is None else np.asarray(logprob_mean, dtype=np.float64).reshape(-1)
    if method in _NEEDS_LOGPROB:
        _need_logprob(method, lpm)
    conf = None if confidence is None else np.asarray(confidence, dtype=np.float64).reshape(-1)
    text_ids = _text_ids(completions, len(a))
    rng = np.random.default_rng(seed)
    per_prompt_acc = np.bincount(p, weights=c, minlength=n_prompts) / sizes
    means, stds = [], []
    used = 1
    for n in ns:
        if n == 1:
            means.append(float(per_prompt_acc.mean()))
            stds.append(0.0)
            continue
        draws = 1 if n >= sizes.max() else n_draws
        used = max(used, draws)
        accs = []
        for _ in range(draws):
            # rank paths within each prompt by a random key, keep the first n
            order = np.lexsort((rng.random(len(a)), p))
            start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            rank = np.empty(len(a), dtype=np.int64)
            rank[order] = np.arange(len(a)) - start[p[order]]
            m = rank < n
            res = _FUNCS[method](
                a[m], c[m], p[m],
                logprob_mean=None if lpm is None else lpm[m],
                completions=text_ids[m],
                confidence=None if conf is None else conf[m],
            )
            accs.append(res.accuracy)
        means.append(float(np.mean(accs)))
        stds.append(float(np.std(accs)))
    return ScalingCurve(method, np.asarray(ns), np.asarray(means), np.asarray(stds), used)


def maj_at_k(answer_ids, correct, prompt_ids, *, k: int, n_draws: int = 20, seed: int = 0) -> float:
    """maj@k: accuracy of a majority vote over k random paths per prompt, averaged over ``n_draws`` draws."""
    return float(scaling_curve("majority", answer_ids, correct, prompt_ids, ns=(k,), n_draws=n_draws,
                               seed=seed).accuracy[0])
