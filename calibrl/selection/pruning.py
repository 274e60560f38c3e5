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
Cost: one small fit per prompt; ``solver="batched"`` (the default) fits all prompts of a group size at once with
scipy's L-BFGS-B steps (:mod:`calibrl.selection._lbfgsb`): 4-6 ms per prompt for 120 prompts against 0.1-0.8 s
per prompt for the per-prompt scipy calls in the same run (``bench/eval_scale.py --agreement``, 2 shared cores
under heavy load), cheaper per prompt as more prompts share a batch (about 0.25 ms per prompt of 4 paths with
25,000 prompts); still the slowest selection method.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from calibrl.selection.voting import (
    SelectionResult,
    _dense,
    _first_occurrence,
    _need_logprob,
    _prepare,
    _text_ids,
    _vote,
)

__all__ = ["rpc", "rpc_keep_mask"]

_RPC_X0 = np.array([0.5, 1.0, 1.0, 1.5, 2.0])
_RPC_BOUNDS = [(0.2, 0.8), (0.01, None), (0.01, None), (0.01, None), (0.01, None)]


def _weibull_logpdf(x, k, lam, log_x=None):
    """log f(x; k, lam) = log k - log lam + (k - 1) z - exp(k z), z = log x - log lam; also z and exp(k z).
    ``log_x``: np.log(x) when the caller has it."""
    z = (np.log(x) if log_x is None else log_x) - np.log(lam)
    t = np.exp(k * z)
    return np.log(k) - np.log(lam) + (k - 1.0) * z - t, z, t


def _mixture_terms(params: np.ndarray, x: np.ndarray, log_x: np.ndarray | None = None):
    """Per-path log mixture density and its gradient wrt (w, k1, lam1, k2, lam2); params broadcast against x
    (``log_x``: np.log(x), when known)."""
    w, k1, l1, k2, l2 = (params[..., i] for i in range(5))
    if log_x is None:
        log_x = np.log(x)
    lp1, z1, t1 = _weibull_logpdf(x, k1, l1, log_x)
    lp2, z2, t2 = _weibull_logpdf(x, k2, l2, log_x)
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


def _batch_nll_grad(x: np.ndarray):
    """``fun_grad(params [Q, 5], rows [Q])`` of problems whose probabilities are the rows of ``x`` [P, n]: the
    negative log-likelihood [Q] and its gradient [Q, 5], each row as :func:`_mixture_nll_grad` computes it."""

    log_x = np.log(x)  # [P, n], once for every evaluation

    def fun_grad(params: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        log_mix, grad = _mixture_terms(params[:, None, :], x[rows], log_x[rows])  # [Q, n], [Q, n, 5]
        nll, g = -log_mix.sum(axis=1), -grad.sum(axis=1)
        bad = ~np.isfinite(nll) | ~np.isfinite(g).all(axis=1)
        nll[bad], g[bad] = 1e300, 0.0
        return nll, g

    return fun_grad


_BATCH = 32768  # problems fitted together (memory: about 2 kB each plus [batch, n, 5] gradients)


def _rpc_prune_batch(prob: np.ndarray) -> np.ndarray:
    """Keep-masks [P, n] of P prompts with n paths each (rows of ``prob``), all fitted at once.

    The same fit as :func:`_rpc_prune_group` (scipy's L-BFGS-B from the reference's start, the same objective and
    bounds), run by :func:`calibrl.selection._lbfgsb.minimize_lbfgsb_batch`, which takes scipy's steps for all
    prompts at once."""
    from calibrl.selection._lbfgsb import minimize_lbfgsb_batch

    keep = np.ones(prob.shape, dtype=bool)
    fit = np.flatnonzero((prob.shape[1] >= 2) & ~np.all(prob == prob[:, :1], axis=1))
    lower = np.array([b[0] for b in _RPC_BOUNDS], dtype=np.float64)
    upper = np.array([np.inf if b[1] is None else b[1] for b in _RPC_BOUNDS], dtype=np.float64)
    for start in range(0, fit.size, _BATCH):
        rows = fit[start:start + _BATCH]
        p = prob[rows]
        x = np.clip(p, 1e-300, None)
        with np.errstate(all="ignore"):
            params = minimize_lbfgsb_batch(_batch_nll_grad(x), np.broadcast_to(_RPC_X0, (rows.size, 5)), lower, upper)
            low = _posterior_low(x, params[:, None, :])
        keep[rows] = ~(low & (p < p.mean(axis=1, keepdims=True)))
    return keep


SOLVERS = ("batched", "scipy")


def rpc_keep_mask(prompt_ids, logprob_mean, *, solver: str = "batched") -> np.ndarray:
    """Paths RPC keeps: False where the Weibull-mixture posterior favours the low component and the path's
    probability exp(logprob_mean) is below its prompt's mean.

    ``solver="scipy"``: one ``scipy.optimize.minimize`` L-BFGS-B fit per prompt, as the reference code.
    ``solver="batched"`` (default): the same L-BFGS-B steps for all prompts of one group size at once
    (:func:`calibrl.selection._lbfgsb.minimize_lbfgsb_batch`); the two agree up to rounding, which on random
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
        keep[rows] = _rpc_prune_batch(prob[rows])
    return keep


def rpc(answer_ids, correct, prompt_ids, *, logprob_mean=None, completions=None, **_: Any) -> SelectionResult:
    """RPC = Reasoning Pruning (Weibull mixture, see :func:`rpc_keep_mask`) + Perplexity Consistency."""
    a, c, p, n, prompts = _prepare(answer_ids, correct, prompt_ids)
    lpm = _need_logprob("rpc", logprob_mean)
    prob = np.exp(lpm)
    keep = _first_occurrence(p, a, _text_ids(completions, len(a))) & rpc_keep_mask(p, lpm)
    return _vote("rpc", np.where(keep, prob, 0.0), a, c, p, n, prompts)
