"""L-BFGS-B for many small independent bound-constrained problems, following scipy's steps: RPC's Weibull-mixture
fits, one compiled loop per problem.

:func:`fit_weibull_mixtures` minimises the negative log-likelihood of RPC's two-component Weibull mixture
(:func:`mixture_nll_grad`) for P problems (one prompt's path probabilities each) with the algorithm of
``scipy.optimize.minimize(method="L-BFGS-B")`` (L-BFGS-B 3.0, Byrd, Lu, Nocedal & Zhu 1995; Morales & Nocedal
2011; scipy's defaults m = 10, factr = 1e7, pgtol = 1e-5, maxls = 20), each problem with its own iterate, memory,
line search and convergence test. It takes the same steps as scipy's code:

- the generalized Cauchy point along the projected steepest-descent path (breakpoints visited in increasing order,
  f' and f'' of the quadratic model on each segment, f'' floored at eps * its first value);
- subspace minimisation over the variables free at that point, then the 3.0 projection, falling back to the
  truncated step from the Cauchy point when the projected point is not a descent direction;
- the Moré-Thuente line search (MINPACK-2 ``dcsrch`` / ``dcstep``, ftol 1e-3, gtol 0.9, xtol 0.1), its first step
  min(1 / ||d||, 1) on the first iteration and 1 afterwards, at most ``maxls`` evaluations, memory reset on a
  failed search (termination when the memory is already empty);
- stopping on a projected gradient <= pgtol or a relative decrease <= factr * eps; memory updates skipped when
  s'y <= eps * (-g'd * stp).

Differences of representation: the limited-memory matrix is held as the dense n x n matrix B = BFGS updates of
theta * I by the stored pairs (oldest first), which is the compact form theta * I - W M W' that scipy's code keeps,
written out (n = 5 here); the reduced system of the subspace step is solved by Gaussian elimination with partial
pivoting (LAPACK's ``dgesv``, which scipy calls, pivots the same way). Results therefore agree with scipy's up to
rounding; where a problem's path is sensitive to rounding (a line-search comparison falling the other way) the
two can end in different local optima. :mod:`calibrl.selection.pruning` measures how often that happens.

Each problem is fitted alone, in order, so a problem's numbers never depend on the others. About 30-55 us a problem
of 2-8 paths here (the prompts of ``bench/eval_scale.py``'s file, 40-50 iterations each, 2026-11-30), against about
250 us for the same steps as numpy passes over all problems at once (docs/eval.md).
"""

from __future__ import annotations

import numpy as np

from calibrl._compiled import compiled

__all__ = ["fit_weibull_mixtures", "mixture_nll_grad"]

_EPS = float(np.finfo(float).eps)
_FTOL, _GTOL, _XTOL = 1e-3, 0.9, 0.1
_BIG = 1e10
# the mixture's parameters (w, k1, lam1, k2, lam2): every vector and matrix of the solver has this length, a
# constant of the compiled code, so the compiler unrolls their loops (16-20% faster than lengths read from the
# arrays, the same bits: measured on 2026-11-30 on 6,000 prompts of 2, 4 and 8 paths)
_N = 5


@compiled(nogil=True, error_model="numpy")
def mixture_nll_grad(params, x, log_x, grad):
    """Negative log-likelihood of the path probabilities ``x`` [n] (``log_x`` = log x) under the mixture
    w Weibull(k1, lam1) + (1 - w) Weibull(k2, lam2), ``params`` = (w, k1, lam1, k2, lam2); its gradient is written
    into ``grad`` [5]. A non-finite value or gradient gives 1e300 and a zero gradient (the optimiser then steps
    back).

    Per path, in log space: log f(x; k, lam) = log k - log lam + (k - 1) z - exp(k z), z = log x - log lam;
    log mix = logsumexp(log w + log f1, log(1 - w) + log f2); with r1 = exp(log w + log f1 - log mix) and
    r2 = 1 - r1, d/dw = r1 / w - r2 / (1 - w), d/dk = r (1/k + z (1 - e^{kz})), d/dlam = r (k / lam)(e^{kz} - 1).
    """
    w, k1, l1, k2, l2 = params[0], params[1], params[2], params[3], params[4]
    log_w, log_1w = np.log(w), np.log1p(-w)
    log_k1, log_l1, log_k2, log_l2 = np.log(k1), np.log(l1), np.log(k2), np.log(l2)
    for j in range(_N):
        grad[j] = 0.0
    nll = 0.0
    for i in range(x.shape[0]):
        z1 = log_x[i] - log_l1
        t1 = np.exp(k1 * z1)
        z2 = log_x[i] - log_l2
        t2 = np.exp(k2 * z2)
        a1 = log_w + (log_k1 - log_l1 + (k1 - 1.0) * z1 - t1)
        a2 = log_1w + (log_k2 - log_l2 + (k2 - 1.0) * z2 - t2)
        m = a1 if a1 >= a2 else a2
        if a1 != a1 or a2 != a2:
            m = np.nan
        log_mix = m + np.log(np.exp(a1 - m) + np.exp(a2 - m))
        r1 = np.exp(a1 - log_mix)
        r2 = 1.0 - r1
        nll -= log_mix
        grad[0] -= r1 / w - r2 / (1.0 - w)
        grad[1] -= r1 * (1.0 / k1 + z1 * (1.0 - t1))
        grad[2] -= r1 * (k1 / l1) * (t1 - 1.0)
        grad[3] -= r2 * (1.0 / k2 + z2 * (1.0 - t2))
        grad[4] -= r2 * (k2 / l2) * (t2 - 1.0)
    finite = np.isfinite(nll)
    for j in range(_N):
        finite = finite and np.isfinite(grad[j])
    if not finite:
        for j in range(_N):
            grad[j] = 0.0
        return 1e300
    return nll


@compiled(nogil=True, error_model="numpy")
def _nan_max(a, b):
    """np.maximum of two floats (nan if either is)."""
    if a != a or b != b:
        return np.nan
    return a if a >= b else b


@compiled(nogil=True, error_model="numpy")
def _nan_min(a, b):
    """np.minimum of two floats (nan if either is)."""
    if a != a or b != b:
        return np.nan
    return a if a <= b else b


@compiled(nogil=True, error_model="numpy")
def _projgr(x, g, lo, hi):
    """Infinity norm of the projected gradient (scipy's ``projgr``)."""
    norm = 0.0
    for i in range(_N):
        gi = g[i]
        if gi < 0:
            if np.isfinite(hi[i]):
                gi = _nan_max(x[i] - hi[i], gi)
        elif np.isfinite(lo[i]):
            gi = _nan_min(x[i] - lo[i], gi)
        norm = _nan_max(norm, abs(gi))
    return norm


@compiled(nogil=True, error_model="numpy")
def _bfgs_matrix(theta, S, Y, SY, col, head, out, bs):
    """Dense L-BFGS matrix into ``out`` [n, n]: theta * I updated by the stored (s, y) pairs, oldest first. ``S`` /
    ``Y`` [n, m] and ``SY`` [m] (the stored s'y) hold the pairs in a ring buffer: ``col`` pairs in slots
    (head - col + j) mod m, j = 0 (oldest) .. col - 1. Pair j: B <- B - (B s)(B s)' / (s' B s) + y y' / (s'y), each
    sum taken in index order (division by a zero s'Bs or s'y gives inf, as numpy's)."""
    n, m = _N, S.shape[1]
    for i in range(n):
        for k in range(n):
            out[i, k] = 0.0
        out[i, i] = theta
    for j in range(col):
        slot = (head - col + j) % m
        for i in range(n):  # B s (B is symmetric)
            acc = out[i, 0] * S[0, slot]
            for k in range(1, n):
                acc += out[i, k] * S[k, slot]
            bs[i] = acc
        sbs = S[0, slot] * bs[0]
        for i in range(1, n):
            sbs += S[i, slot] * bs[i]
        cs = 1.0 / sbs
        cy = 1.0 / SY[slot]
        for i in range(n):
            for k in range(n):
                out[i, k] -= (bs[i] * cs) * bs[k]
        for i in range(n):
            for k in range(n):
                out[i, k] += (Y[i, slot] * cy) * Y[k, slot]


@compiled(nogil=True, error_model="numpy")
def _dot(a, b):
    acc = a[0] * b[0]
    for i in range(1, _N):
        acc += a[i] * b[i]
    return acc


@compiled(nogil=True, error_model="numpy")
def _matvec(B, v, out):
    for i in range(_N):
        acc = B[i, 0] * v[0]
        for k in range(1, _N):
            acc += B[i, k] * v[k]
        out[i] = acc


@compiled(nogil=True, error_model="numpy")
def _cauchy(x, g, B, lo, hi, xcp, fixed, d, tbrk, left, bd, zc):
    """Generalized Cauchy point into ``xcp`` [n] and the variables fixed at a bound there into ``fixed`` [n]
    (scipy's ``cauchy``); ``d``, ``tbrk``, ``left``, ``bd``, ``zc`` [n] are work space."""
    n = _N
    any_move = False
    unbounded_move = False
    any_break = False
    for i in range(n):
        has_lo, has_hi = np.isfinite(lo[i]), np.isfinite(hi[i])
        tl, tu = x[i] - lo[i], hi[i] - x[i]
        neg = -g[i]
        xlower = has_lo and tl <= 0
        xupper = has_hi and tu <= 0
        at_bound = (xlower and neg <= 0) or (not xlower and xupper and neg >= 0)
        zero_g = not xlower and not xupper and abs(neg) <= 0
        d[i] = 0.0 if (at_bound or zero_g) else neg
        moving = d[i] != 0
        brk_lo = moving and has_lo and neg < 0
        brk_hi = moving and not brk_lo and has_hi and neg > 0
        if brk_lo:
            tbrk[i] = tl / -neg
        elif brk_hi:
            tbrk[i] = tu / neg
        else:
            tbrk[i] = np.inf
        left[i] = np.isfinite(tbrk[i])
        any_break = any_break or left[i]
        unbounded_move = unbounded_move or (moving and not brk_lo and not brk_hi)
        any_move = any_move or moving
        fixed[i] = at_bound
        xcp[i] = x[i]
    bnded = not unbounded_move
    f1 = -_dot(d, d)
    _matvec(B, d, bd)
    f2 = _dot(d, bd)
    f2_org = f2
    dtm = -f1 / f2
    tsum = 0.0
    tj = 0.0
    going = any_move and any_break
    for _ in range(n):
        if not going:
            break
        ibp = 0
        tnext = np.inf
        for i in range(n):  # the first smallest breakpoint left (np.argmin)
            t = tbrk[i] if left[i] else np.inf
            if t < tnext:
                tnext, ibp = t, i
        dt = tnext - tj
        going = np.isfinite(tnext) and not (dtm < dt)
        if not going:
            break
        tj = tnext
        tsum += dt
        left[ibp] = False
        xcp[ibp] = hi[ibp] if d[ibp] > 0 else lo[ibp]
        d[ibp] = 0.0
        fixed[ibp] = True
        # f' and f'' of the model at the breakpoint along the new direction (scipy updates them in closed form)
        for i in range(n):
            zc[i] = (xcp[i] if fixed[i] else x[i] + tsum * d[i]) - x[i]
        _matvec(B, d, bd)
        nf1 = _dot(g, d) + _dot(zc, bd)
        nf2 = _nan_max(_EPS * f2_org, _dot(d, bd))
        nleft = 0
        for i in range(n):
            nleft += left[i]
        dtm = -nf1 / nf2 if (nleft > 0 or not bnded) else 0.0
        going = nleft > 0
    if dtm <= 0:
        dtm = 0.0
    if any_move:
        tsum = tsum + dtm
        for i in range(n):
            xcp[i] = xcp[i] + tsum * d[i]


@compiled(nogil=True, error_model="numpy")
def _solve(A, b):
    """Solve A u = b in place (``b`` becomes u) by Gaussian elimination with partial pivoting (the first largest
    pivot, as LAPACK's ``dgetrf``); False where a pivot is exactly 0 (singular; ``b`` is then garbage)."""
    n = _N
    for k in range(n):
        p = k
        big = abs(A[k, k])
        for i in range(k + 1, n):
            if abs(A[i, k]) > big:
                big, p = abs(A[i, k]), i
        if big == 0.0:
            return False
        if p != k:
            for j in range(n):
                A[k, j], A[p, j] = A[p, j], A[k, j]
            b[k], b[p] = b[p], b[k]
        for i in range(k + 1, n):
            f = A[i, k] / A[k, k]
            for j in range(k + 1, n):
                A[i, j] -= f * A[k, j]
            b[i] -= f * b[k]
    for k in range(n - 1, -1, -1):
        acc = b[k]
        for j in range(k + 1, n):
            acc -= A[k, j] * b[j]
        b[k] = acc / A[k, k]
    return True


@compiled(nogil=True, error_model="numpy")
def _subspace(x, g, B, z, free, lo, hi, xn, Bf, du, work):
    """Subspace minimisation from the Cauchy point ``z`` over the ``free`` variables, then the projection of
    L-BFGS-B 3.0 with its fallback (scipy's ``cmprlb`` + ``subsm``), the new point into ``xn`` [n]; returns False
    where the reduced matrix is singular (scipy then empties the memory and restarts the iteration)."""
    n = _N
    for i in range(n):
        work[i] = z[i] - x[i]
    _matvec(B, work, du)
    for i in range(n):
        r = -(g[i] + du[i])
        du[i] = r if free[i] else 0.0
        for k in range(n):
            Bf[i, k] = B[i, k] if (free[i] and free[k]) else (1.0 if i == k else 0.0)
    if not _solve(Bf, du):
        return False
    for i in range(n):
        if not np.isfinite(du[i]):
            return False
    iword = False
    for i in range(n):
        if free[i]:
            xn[i] = _nan_min(hi[i], _nan_max(lo[i], z[i] + du[i]))
            iword = iword or (np.isfinite(lo[i]) and xn[i] == lo[i]) or (np.isfinite(hi[i]) and xn[i] == hi[i])
        else:
            xn[i] = z[i]
            du[i] = 0.0
    for i in range(n):
        work[i] = xn[i] - x[i]
    if not (iword and _dot(work, g) > 0):
        return True
    # the projected point is not a descent direction: the truncated step from the Cauchy point instead
    ibd = 0
    ratio_min = np.inf
    for i in range(n):
        ratio = np.inf
        if free[i] and du[i] < 0 and np.isfinite(lo[i]):
            ratio = 0.0 if lo[i] - z[i] >= 0 else (lo[i] - z[i]) / du[i]
        elif free[i] and du[i] > 0 and np.isfinite(hi[i]):
            ratio = 0.0 if hi[i] - z[i] <= 0 else (hi[i] - z[i]) / du[i]
        if ratio < ratio_min or (i == 0 and ratio != ratio):
            ratio_min, ibd = ratio, i
    alpha = _nan_min(1.0, ratio_min)
    for i in range(n):
        work[i] = z[i]
    if alpha < 1.0:
        if du[ibd] > 0:
            work[ibd] = hi[ibd]
            du[ibd] = 0.0
        elif du[ibd] < 0:
            work[ibd] = lo[ibd]
            du[ibd] = 0.0
    for i in range(n):
        xn[i] = work[i] + alpha * du[i] if free[i] else work[i]
    return True


@compiled(nogil=True, error_model="numpy")
def _dcstep(stx, fx, dx, sty, fy, dy, stp, fp, dp, brackt, stpmin, stpmax):
    """MINPACK-2 ``dcstep`` (scipy.optimize._dcsrch.dcstep): the safeguarded step of the Moré-Thuente search;
    returns (stx, fx, dx, sty, fy, dy, stp, brackt)."""
    sgnd = np.sign(dp) * np.sign(dx)
    if fp > fx:  # case 1: higher function value, the minimum is bracketed
        th = 3.0 * (fx - fp) / (stp - stx) + dx + dp
        s = _nan_max(_nan_max(abs(th), abs(dx)), abs(dp))
        gam = s * np.sqrt((th / s) ** 2 - (dx / s) * (dp / s))
        if stp < stx:
            gam = -gam
        r = ((gam - dx) + th) / (((gam - dx) + gam) + dp)
        stpc = stx + r * (stp - stx)
        stpq = stx + ((dx / ((fx - fp) / (stp - stx) + dx)) / 2.0) * (stp - stx)
        stpf = stpc if abs(stpc - stx) <= abs(stpq - stx) else stpc + (stpq - stpc) / 2.0
        brackt = True
    elif sgnd < 0:  # case 2: derivatives of opposite sign, bracketed
        th = 3.0 * (fx - fp) / (stp - stx) + dx + dp
        s = _nan_max(_nan_max(abs(th), abs(dx)), abs(dp))
        gam = s * np.sqrt((th / s) ** 2 - (dx / s) * (dp / s))
        if stp > stx:
            gam = -gam
        r = ((gam - dp) + th) / (((gam - dp) + gam) + dx)
        stpc = stp + r * (stx - stp)
        stpq = stp + (dp / (dp - dx)) * (stx - stp)
        stpf = stpc if abs(stpc - stp) > abs(stpq - stp) else stpq
        brackt = True
    elif abs(dp) < abs(dx):  # case 3: the derivative decreases in magnitude
        th = 3.0 * (fx - fp) / (stp - stx) + dx + dp
        s = _nan_max(_nan_max(abs(th), abs(dx)), abs(dp))
        gam = s * np.sqrt(_nan_max(0.0, (th / s) ** 2 - (dx / s) * (dp / s)))
        if stp > stx:
            gam = -gam
        r = ((gam - dp) + th) / ((gam + (dx - dp)) + gam)
        if r < 0 and gam != 0:
            stpc = stp + r * (stx - stp)
        else:
            stpc = stpmax if stp > stx else stpmin
        stpq = stp + (dp / (dp - dx)) * (stx - stp)
        if brackt:
            stpf = stpc if abs(stpc - stp) < abs(stpq - stp) else stpq
            reach = stp + 0.66 * (sty - stp)
            stpf = _nan_min(reach, stpf) if stp > stx else _nan_max(reach, stpf)
        else:
            stpf = stpc if abs(stpc - stp) > abs(stpq - stp) else stpq
            stpf = _nan_min(_nan_max(stpf, stpmin), stpmax)
    else:  # case 4: the derivative does not decrease in magnitude
        if brackt:
            th = 3.0 * (fp - fy) / (sty - stp) + dy + dp
            s = _nan_max(_nan_max(abs(th), abs(dy)), abs(dp))
            gam = s * np.sqrt((th / s) ** 2 - (dy / s) * (dp / s))
            if stp > sty:
                gam = -gam
            r = ((gam - dp) + th) / (((gam - dp) + gam) + dy)
            stpf = stp + r * (sty - stp)
        else:
            stpf = stpmax if stp > stx else stpmin
    if fp > fx:
        sty, fy, dy = stp, fp, dp
    else:
        if sgnd < 0:
            sty, fy, dy = stx, fx, dx
        stx, fx, dx = stp, fp, dp
    return stx, fx, dx, sty, fy, dy, stpf, brackt


@compiled(nogil=True, error_model="numpy")
def _search_step(ls, stp, f, g):
    """One evaluation of a MINPACK-2 ``dcsrch`` search (stpmin = 0) at ``stp`` (f, g = the derivative along d),
    its state in ``ls`` [16] (:func:`_search_start`: stpmax, finit, ginit, gtest, width, width1, stx, fx, gx, sty,
    fy, gy, stmin, stmax, brackt, stage); returns (done, the next step: ``stp`` itself when done)."""
    stpmax, finit, ginit, gtest = ls[0], ls[1], ls[2], ls[3]
    width, width1 = ls[4], ls[5]
    stx, fx, gx, sty, fy, gy = ls[6], ls[7], ls[8], ls[9], ls[10], ls[11]
    stmin, stmax, brackt, stage = ls[12], ls[13], ls[14] > 0, ls[15]
    ftest = finit + stp * gtest
    if stage == 1 and f <= ftest and g >= 0:
        stage = 2.0
    ls[15] = stage
    if (brackt and (stp <= stmin or stp >= stmax)) or (brackt and stmax - stmin <= _XTOL * stmax) \
            or (stp == stpmax and f <= ftest and g <= gtest) or (stp == 0.0 and (f > ftest or g >= gtest)) \
            or (f <= ftest and abs(g) <= _GTOL * -ginit):
        return True, stp
    shift = gtest if (stage == 1 and f <= fx and f > ftest) else 0.0
    fxm, fym, fm = fx - stx * shift, fy - sty * shift, f - stp * shift
    gxm, gym, gm = gx - shift, gy - shift, g - shift
    stx, fxm, gxm, sty, fym, gym, nstp, brackt = _dcstep(stx, fxm, gxm, sty, fym, gym, stp, fm, gm, brackt,
                                                         stmin, stmax)
    fx, fy = fxm + stx * shift, fym + sty * shift
    gx, gy = gxm + shift, gym + shift
    if brackt and abs(sty - stx) >= 0.66 * width1:
        nstp = stx + 0.5 * (sty - stx)
    if brackt:
        width1 = width
        width = abs(sty - stx)
        stmin, stmax = _nan_min(stx, sty), _nan_max(stx, sty)
    else:
        stmin, stmax = nstp + 1.1 * (nstp - stx), nstp + 4.0 * (nstp - stx)
    nstp = _nan_min(_nan_max(nstp, 0.0), stpmax)
    if (brackt and (nstp <= stmin or nstp >= stmax)) or (brackt and stmax - stmin <= _XTOL * stmax):
        nstp = stx
    ls[4], ls[5] = width, width1
    ls[6], ls[7], ls[8], ls[9], ls[10], ls[11] = stx, fx, gx, sty, fy, gy
    ls[12], ls[13], ls[14] = stmin, stmax, 1.0 if brackt else 0.0
    return False, nstp


@compiled(nogil=True, error_model="numpy")
def _search_start(ls, f, g, stp, stpmax):
    """A new search from f, g = the derivative along d, first step ``stp``, bound ``stpmax``, into ``ls``."""
    ls[0], ls[1], ls[2], ls[3] = stpmax, f, g, _FTOL * g
    ls[4] = stpmax - 0.0
    ls[5] = ls[4] / 0.5
    ls[6], ls[7], ls[8], ls[9], ls[10], ls[11] = 0.0, f, g, 0.0, f, g
    ls[12], ls[13], ls[14], ls[15] = 0.0, stp + 4.0 * stp, 0.0, 1.0


@compiled(nogil=True, error_model="numpy")
def _minimize_one(x, log_x, x0, lo, hi, m, factr, pgtol, maxls, maxiter, out):
    """L-BFGS-B of :func:`mixture_nll_grad` on one problem's ``x`` / ``log_x`` [k] from ``x0`` [5]; the final point
    into ``out`` [5]."""
    n = _N
    xc = np.empty(n)
    for i in range(n):
        xc[i] = _nan_min(_nan_max(x0[i], lo[i]), hi[i])
    g = np.empty(n)
    f = mixture_nll_grad(xc, x, log_x, g)
    S, Y, SY = np.zeros((n, m)), np.zeros((n, m)), np.ones(m)
    col, head, theta, iters = 0, 0, 1.0, 0
    B, bs, Bf = np.empty((n, n)), np.empty(n), np.empty((n, n))
    z, fixed, free = np.empty(n), np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
    d, tbrk, left, w1, w2 = np.empty(n), np.empty(n), np.zeros(n, dtype=np.bool_), np.empty(n), np.empty(n)
    xn, du = np.empty(n), np.empty(n)
    xt, gt = np.empty(n), np.empty(n)
    ls = np.zeros(16)
    tol = factr * _EPS
    active = _projgr(xc, g, lo, hi) > pgtol
    while active:
        # the search direction: the Cauchy point, then the subspace step
        _bfgs_matrix(theta, S, Y, SY, col, head, B, bs)
        broken = False
        for i in range(n):
            for k in range(n):
                broken = broken or not np.isfinite(B[i, k])
        if broken:  # a failed factorisation in scipy's code: empty the memory, restart the iteration
            col, theta = 0, 1.0
            for i in range(n):
                for k in range(n):
                    B[i, k] = 1.0 if i == k else 0.0
        _cauchy(xc, g, B, lo, hi, z, fixed, d, tbrk, left, w1, w2)
        any_free = False
        for i in range(n):
            free[i] = not fixed[i]
            any_free = any_free or free[i]
        if col > 0 and any_free:
            if not _subspace(xc, g, B, z, free, lo, hi, xn, Bf, du, w1):
                col, theta = 0, 1.0  # singular reduced matrix: the memory is emptied and the iteration restarted
                continue
            for i in range(n):
                z[i] = xn[i]
        ratio_min = np.inf
        for i in range(n):
            d[i] = z[i] - xc[i]
        dnorm = np.sqrt(_dot(d, d))
        for i in range(n):  # the largest feasible step along d (the first iteration: 1)
            if d[i] < 0 and np.isfinite(lo[i]):
                ratio = 0.0 if lo[i] - xc[i] >= 0 else (lo[i] - xc[i]) / d[i]
            elif d[i] > 0 and np.isfinite(hi[i]):
                ratio = 0.0 if hi[i] - xc[i] <= 0 else (hi[i] - xc[i]) / d[i]
            else:
                ratio = _BIG
            ratio_min = _nan_min(ratio_min, ratio) if i else ratio
        if iters == 0:
            stpmx = 1.0
            stp = _nan_min(1.0 / dnorm, stpmx)
        else:
            stpmx = _nan_min(_BIG, ratio_min)
            stp = 1.0
        gd0 = _dot(g, d)
        ok = False
        if gd0 < 0:  # a descent direction: the line search
            fold = f
            _search_start(ls, f, gd0, stp, stpmx)
            for nls in range(maxls):
                for i in range(n):
                    xt[i] = z[i] if stp == 1.0 else stp * d[i] + xc[i]
                ft = mixture_nll_grad(xt, x, log_x, gt)
                gdt = _dot(gt, d)
                done, nstp = _search_step(ls, stp, ft, gdt)
                if done:
                    ok = True
                    break
                stp = nstp
        if not ok:  # a failed search: back to the old point; reset the memory, or stop when it is empty
            if col == 0:
                break
            col, theta = 0, 1.0
            continue
        # the accepted step
        for i in range(n):
            w1[i] = gt[i] - g[i]  # y
            xc[i], g[i] = xt[i], gt[i]
        f = ft
        iters += 1
        if _projgr(xc, g, lo, hi) <= pgtol or (fold - ft) <= tol * _nan_max(_nan_max(abs(fold), abs(ft)), 1.0) \
                or iters >= maxiter:
            break
        one = stp == 1.0
        dr = (gdt - gd0) if one else (gdt - gd0) * stp
        ddum = -gd0 if one else -gd0 * stp
        if not (dr <= _EPS * ddum):
            for i in range(n):
                S[i, head] = d[i] if one else stp * d[i]
                Y[i, head] = w1[i]
            SY[head] = dr
            head = (head + 1) % m
            col = min(col + 1, m)
            theta = _dot(w1, w1) / dr
    for i in range(n):
        out[i] = xc[i]


@compiled(nogil=True, error_model="numpy")
def _minimize_all(x, log_x, x0, lo, hi, m, factr, pgtol, maxls, maxiter, out):
    for p in range(x.shape[0]):
        _minimize_one(x[p], log_x[p], x0, lo, hi, m, factr, pgtol, maxls, maxiter, out[p])


def fit_weibull_mixtures(x: np.ndarray, x0: np.ndarray, lower: np.ndarray, upper: np.ndarray, *, m: int = 10,
                         factr: float = 1e7, pgtol: float = 1e-5, maxls: int = 20, maxiter: int = 15000) -> np.ndarray:
    """Minimise :func:`mixture_nll_grad` for P problems with scipy's L-BFGS-B steps; returns the final points
    [P, 5].

    ``x`` [P, k] each problem's path probabilities (> 0); ``x0`` [5] the start point (clipped into the bounds),
    ``lower`` / ``upper`` [5] bounds (+-inf: none). As scipy's, a problem ends on a projected gradient <= ``pgtol``,
    a relative decrease <= ``factr`` * eps, a line search failing with an empty memory (the last accepted point is
    returned) or ``maxiter`` iterations.
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"x must be [problems, paths], got shape {x.shape}")
    for name, vector in (("x0", x0), ("lower", lower), ("upper", upper)):
        if np.shape(vector) != (_N,):
            raise ValueError(f"{name} must hold the mixture's {_N} parameters, got shape {np.shape(vector)}")
    out = np.empty((x.shape[0], _N))
    with np.errstate(all="ignore"):
        log_x = np.log(x)
    _minimize_all(x, log_x, np.asarray(x0, dtype=np.float64), np.asarray(lower, dtype=np.float64),
                  np.asarray(upper, dtype=np.float64), int(m), float(factr), float(pgtol), int(maxls), int(maxiter),
                  out)
    return out
