"""RPC: Reasoning Pruning (a Weibull mixture over path probabilities) + Perplexity Consistency.

Per prompt, fit a 2-component Weibull mixture to the path probabilities exp(logprob_mean) and drop a path whose
posterior favours the lower-mean component AND whose probability is below the prompt's mean probability; then PC
(:func:`calibrl.selection.voting.perplexity_consistency`'s vote) over the remaining paths.

RPC follows WNJXYK/RPC ``compute_rpc.py``: ``scipy.optimize.minimize`` (L-BFGS-B) of the mixture's negative
log-likelihood from the initial point (w1, k1, lam1, k2, lam2) = (0.5, 1.0, 1.0, 1.5, 2.0) with bounds
w1 in [0.2, 0.8] and every shape/scale >= 0.01; the component with the larger Weibull mean lam * Gamma(1 + 1/k) is
the "high" one; pruned paths keep their answer cluster in the vote with zero weight. Differences, on purpose:
the likelihood is computed in log space (logsumexp; the reference's plain pdf underflows to log(0) for far
outliers), the analytic gradient is passed to the optimiser (same optimum, ~5x fewer evaluations), and prompts whose
N path probabilities are all equal (e.g. N = 1) skip the fit (no path lies below the mean, so none is pruned).
Cost: one small fit per prompt; ``solver="batched"`` (the default) fits the prompts of a group size in one
compiled loop taking scipy's L-BFGS-B steps (:mod:`calibrl.selection._lbfgsb`): about 60-75 us per prompt of 4 to
16 paths, against about 0.3 ms for the same steps as numpy passes over all prompts at once and 1-2 ms for
scipy's own per-prompt calls (``bench/eval_scale.py --agreement``); the first fit on a machine compiles the loop
(about 13 s here, then read from numba's cache: :mod:`calibrl._compiled`). Still the slowest selection method.
Two things keep it affordable at a million samples: the
scaling curve and ``calibrl eval``'s selection figure, which read only the accuracy, fit only the prompts whose
accuracy pruning could change (``rpc(accuracy_only=True)``), and the fits are split by prompts over
``CALIBRL_WORKERS`` processes (default: every core this process may use).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import sys
import warnings
from typing import Any

import numpy as np

from calibrl.selection.voting import (
    SelectionResult,
    _answer_pairs,
    _dense,
    _first_occurrence,
    _need_logprob,
    _pair_correctness,
    _prepare,
    _text_ids,
    _vote,
)

__all__ = ["rpc", "rpc_keep_mask", "rpc_workers"]

_RPC_X0 = np.array([0.5, 1.0, 1.0, 1.5, 2.0])
_RPC_BOUNDS = [(0.2, 0.8), (0.01, None), (0.01, None), (0.01, None), (0.01, None)]


def _weibull_logpdf(x, k, lam, log_x=None):
    """log f(x; k, lam) = log k - log lam + (k - 1) z - exp(k z), z = log x - log lam; also z and exp(k z).
    ``log_x``: np.log(x) when the caller has it."""
    z = (np.log(x) if log_x is None else log_x) - np.log(lam)
    t = np.exp(k * z)
    return np.log(k) - np.log(lam) + (k - 1.0) * z - t, z, t


def _mixture_nll_grad(params: np.ndarray, x: np.ndarray) -> tuple[float, np.ndarray]:
    """Negative log-likelihood of one prompt's probabilities under the mixture, and its gradient
    (:func:`calibrl.selection._lbfgsb.mixture_nll_grad`, the objective of both solvers)."""
    from calibrl.selection._lbfgsb import mixture_nll_grad

    grad = np.empty(5)
    nll = mixture_nll_grad(np.asarray(params, dtype=np.float64), x, np.log(x), grad)
    return float(nll), grad


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


def _rpc_prune_batch(prob: np.ndarray) -> np.ndarray:
    """Keep-masks [P, n] of P prompts with n paths each (rows of ``prob``).

    The same fit as :func:`_rpc_prune_group` (scipy's L-BFGS-B from the reference's start, the same objective and
    bounds), run by :func:`calibrl.selection._lbfgsb.fit_weibull_mixtures`, which takes scipy's steps in one
    compiled loop over the prompts."""
    from calibrl.selection._lbfgsb import fit_weibull_mixtures

    keep = np.ones(prob.shape, dtype=bool)
    rows = np.flatnonzero((prob.shape[1] >= 2) & ~np.all(prob == prob[:, :1], axis=1))
    if not rows.size:
        return keep
    lower = np.array([b[0] for b in _RPC_BOUNDS], dtype=np.float64)
    upper = np.array([np.inf if b[1] is None else b[1] for b in _RPC_BOUNDS], dtype=np.float64)
    p = prob[rows]
    x = np.clip(p, 1e-300, None)
    params = fit_weibull_mixtures(x, _RPC_X0, lower, upper)
    with np.errstate(all="ignore"):
        low = _posterior_low(x, params[:, None, :])
    keep[rows] = ~(low & (p < p.mean(axis=1, keepdims=True)))
    return keep


_MIN_CHUNK = 4096  # prompts per process at least: below 2 x this, the fits run in this process alone


def rpc_workers() -> int:
    """Processes RPC's batched fits use: ``$CALIBRL_WORKERS`` if set (1: this process only), else the cores this
    process may run on."""
    value = os.environ.get("CALIBRL_WORKERS", "").strip()
    if value:
        try:
            workers = int(value)
        except ValueError:
            raise ValueError(f"CALIBRL_WORKERS must be a whole number of processes, got {value!r}") from None
        return max(1, workers)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_POOL: dict[int, Any] = {}  # workers -> a process pool kept for later calls (an eval prunes 5-6 times)


def _pool(processes: int):
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    if processes not in _POOL:
        for old in _POOL.values():
            old.shutdown(wait=False, cancel_futures=True)
        _POOL.clear()
        # fork: the workers need no import of the caller's main module (spawn would run a script that lacks a
        # __main__ guard again); they only run the compiled fits on the arrays they are sent
        _POOL[processes] = ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("fork"))
    return _POOL[processes]


@atexit.register
def _close_pool() -> None:
    for pool in _POOL.values():
        pool.shutdown(wait=False, cancel_futures=True)
    _POOL.clear()


def _prune_rows(prob: np.ndarray) -> np.ndarray:
    """:func:`_rpc_prune_batch` of ``prob`` [P, n], split by prompts over :func:`rpc_workers` processes (this one
    and a pool of the others) when there are at least 2 x ``_MIN_CHUNK`` prompts. A prompt's fit never depends on
    the other prompts of its batch (:mod:`calibrl.selection._lbfgsb`), so the masks are the same bits whatever the
    split. Where processes cannot be forked (not Linux / macOS, or inside a daemonic worker), or the pool breaks,
    everything runs here."""
    import multiprocessing

    parts = min(rpc_workers(), prob.shape[0] // _MIN_CHUNK)
    can_fork = "fork" in multiprocessing.get_all_start_methods() and sys.platform != "win32"
    if parts < 2 or not can_fork or multiprocessing.current_process().daemon:
        return _rpc_prune_batch(prob)
    chunks = np.array_split(prob, parts)
    # what a worker runs is imported here first: a forked child that imported it could wait forever on an import
    # lock another thread of this process held at the fork
    import scipy.special  # noqa: F401  (_weibull_mean)

    from calibrl.selection._lbfgsb import fit_weibull_mixtures

    # compiled (or read from numba's cache) here once, not in each worker forked below
    fit_weibull_mixtures(np.ones((0, 2)), _RPC_X0, np.zeros(5), np.full(5, np.inf))
    try:
        # python >= 3.12 warns on fork in a threaded process; the workers only run the compiled fits
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            futures = [_pool(parts - 1).submit(_rpc_prune_batch, chunk) for chunk in chunks[1:]]
        first = _rpc_prune_batch(chunks[0])  # this process takes the first part meanwhile
        return np.concatenate([first, *(f.result() for f in futures)])
    except (OSError, RuntimeError) as error:  # BrokenProcessPool is a RuntimeError
        warnings.warn(f"RPC's fits fall back to one process: {error}", RuntimeWarning, stacklevel=2)
        _close_pool()
        return _rpc_prune_batch(prob)


SOLVERS = ("batched", "scipy")


def rpc_keep_mask(prompt_ids, logprob_mean, *, solver: str = "batched") -> np.ndarray:
    """Paths RPC keeps: False where the Weibull-mixture posterior favours the low component and the path's
    probability exp(logprob_mean) is below its prompt's mean.

    ``solver="scipy"``: one ``scipy.optimize.minimize`` L-BFGS-B fit per prompt, as the reference code.
    ``solver="batched"`` (default): the same L-BFGS-B steps for all prompts of one group size in one compiled loop
    (:func:`calibrl.selection._lbfgsb.fit_weibull_mixtures`); the two agree up to rounding, which on random
    groups of 2 to 64 paths changes the keep-mask of a small fraction of prompts (measured by
    ``bench/eval_scale.py --agreement``; docs/eval.md).

    The mixture likelihood is unbounded (a component can collapse onto one point), so the fit is a local optimum
    reached from the reference's start. Other optimisers of the same likelihood (EM vectorised over prompts; one
    L-BFGS-B run over all prompts jointly) reach different optima and prune differently on 14-67% of prompts of
    random test groups, which is why the batched solver follows L-BFGS-B's own steps.
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    _, pidx = _dense(np.asarray(prompt_ids).reshape(-1))
    lpm = np.ascontiguousarray(np.asarray(logprob_mean, dtype=np.float64).reshape(-1))
    # the same paths are pruned again by a scaling curve's full-group point: remember the last few masks
    key = (solver, hashlib.blake2b(pidx.tobytes() + b"|" + lpm.tobytes(), digest_size=16).digest())
    if key in _KEEP_CACHE:
        return _KEEP_CACHE[key].copy()
    keep = _rpc_keep_mask(pidx, lpm, solver)
    _KEEP_CACHE[key] = keep.copy()
    while len(_KEEP_CACHE) > 16:  # a curve prunes 1 + 2 draws x its N values; masks are 1 byte a path
        _KEEP_CACHE.pop(next(iter(_KEEP_CACHE)))
    return keep


_KEEP_CACHE: dict[tuple[str, bytes], np.ndarray] = {}


def _rpc_keep_mask(pidx: np.ndarray, lpm: np.ndarray, solver: str) -> np.ndarray:
    """:func:`rpc_keep_mask` of dense prompt indices ``pidx`` [N] and ``lpm`` [N], uncached."""
    prob = np.exp(lpm)
    keep = np.ones(prob.size, dtype=bool)
    if not prob.size:
        return keep
    order = np.argsort(pidx, kind="stable")  # [N] paths grouped by prompt, in their order
    sizes = np.bincount(pidx)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    if solver == "scipy":
        for group in np.split(order, np.flatnonzero(np.diff(pidx[order])) + 1):
            keep[group] = _rpc_prune_group(prob[group])
        return keep
    for n in np.unique(sizes[sizes >= 2]):
        rows = order[starts[sizes == n][:, None] + np.arange(n)]  # [P_n, n] path indices of the prompts with n
        keep[rows] = _prune_rows(prob[rows])
    return keep


def rpc(answer_ids, correct, prompt_ids, *, logprob_mean=None, completions=None, accuracy_only: bool = False,
        **_: Any) -> SelectionResult:
    """RPC = Reasoning Pruning (Weibull mixture, see :func:`rpc_keep_mask`) + Perplexity Consistency.

    ``accuracy_only`` (the scaling curve's points and ``calibrl eval``'s figure, which read only the accuracy): the
    mixture is fitted only for the prompts whose accuracy pruning could change
    (:func:`_pruning_cannot_change_accuracy`); the other prompts' paths are all kept. The accuracy is exactly the
    full computation's; on the prompts not fitted, the result's ``confidence`` and chosen answer are PC's without
    pruning."""
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    lpm = _need_logprob("rpc", logprob_mean)
    prob = np.exp(lpm)
    keep = _first_occurrence(p, a, _text_ids(completions, len(a)))
    if not accuracy_only:
        keep &= rpc_keep_mask(p, lpm)
    else:
        fit = ~_pruning_cannot_change_accuracy(np.where(keep, prob, 0.0), prob, a, c, p, n)[p]  # [N] paths to fit
        if fit.any():
            keep[fit] &= rpc_keep_mask(p[fit], lpm[fit])
    return _vote("rpc", np.where(keep, prob, 0.0), a, c, p, n, prompts)


def _pruning_cannot_change_accuracy(weights: np.ndarray, prob: np.ndarray, answer_ids: np.ndarray,
                                    correct: np.ndarray, pidx: np.ndarray, n_prompts: int) -> np.ndarray:
    """[P] True where no keep-mask of RPC's pruning can change the prompt's accuracy in the vote, so the fit need
    not run when only the accuracy is read.

    Pruning only zeroes paths below their prompt's mean probability ("below" read with a 1e-12 margin the other
    way, so rounding in the mean only adds paths), so each answer cluster's weight lies between ``least`` (every
    such path of it zeroed) and ``full`` (none; ``weights`` [N] is PC's, duplicates zeroed). A cluster can be
    among the vote's top ones only if its ``full`` reaches the largest ``least`` of the prompt's other clusters
    (with a 1e-9 relative margin, far wider than the vote's 1e-12 tie tolerance, so borderline clusters count as
    possible winners). The vote's accuracy is the mean correctness of its top clusters, so it cannot change when
    every possible winner has the same correctness, 0 or 1 (the mean of equal 0s or 1s is exact; a single possible
    winner with a fractional correctness, a cluster whose paths disagree, is exact too). This holds for a prompt
    with one cluster, and where the unpruned winner keeps the lead with all its below-mean paths pruned (the only
    possible winner), and also where pruning could only swap one wrong answer for another."""
    sizes = np.bincount(pidx, minlength=n_prompts)
    mean = np.bincount(pidx, weights=prob, minlength=n_prompts) / np.maximum(sizes, 1)
    prunable = prob <= mean[pidx] * (1.0 + 1e-12)  # [N] a superset of the paths pruning may zero
    first, pair_idx = _answer_pairs(pidx, answer_ids)
    n_pairs = first.size
    full = np.bincount(pair_idx, weights=weights, minlength=n_pairs)  # [pairs] nothing pruned
    least = np.bincount(pair_idx, weights=np.where(prunable, 0.0, weights), minlength=n_pairs)  # all pruned
    pair_correct = _pair_correctness(pair_idx, correct, n_pairs)  # what the vote credits a top pair with
    pair_prompt = pidx[first]
    # the largest ``least`` among each pair's OTHER clusters: the prompt's best, or its second best for the best one
    best = np.full(n_prompts, -np.inf)
    np.maximum.at(best, pair_prompt, least)
    best_pair = np.full(n_prompts, n_pairs, dtype=np.int64)
    at_best = least >= best[pair_prompt]
    np.minimum.at(best_pair, pair_prompt[at_best], np.flatnonzero(at_best))
    others = least.copy()
    others[best_pair[best_pair < n_pairs]] = -np.inf
    second = np.full(n_prompts, -np.inf)
    np.maximum.at(second, pair_prompt, others)
    rival = np.where(np.arange(n_pairs) == best_pair[pair_prompt], second[pair_prompt], best[pair_prompt])
    possible = full * (1.0 + 1e-9) + 1e-300 >= rival  # [pairs] could be among the top ones under some pruning
    n_possible = np.bincount(pair_prompt, weights=possible, minlength=n_prompts)
    right = np.bincount(pair_prompt, weights=possible & (pair_correct == 1.0), minlength=n_prompts)
    wrong = np.bincount(pair_prompt, weights=possible & (pair_correct == 0.0), minlength=n_prompts)
    return (n_possible <= 1) | (right == n_possible) | (wrong == n_possible)
