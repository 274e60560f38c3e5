"""L-BFGS-B for many small independent bound-constrained problems at once, following scipy's steps.

:func:`minimize_lbfgsb_batch` runs the algorithm of ``scipy.optimize.minimize(method="L-BFGS-B")`` (L-BFGS-B 3.0,
Byrd, Lu, Nocedal & Zhu 1995; Morales & Nocedal 2011; scipy's defaults m = 10, factr = 1e7, pgtol = 1e-5,
maxls = 20) on P problems of n variables at once, each with its own iterate, memory, line search and
convergence test. It takes the same steps as scipy's code:

- the generalized Cauchy point along the projected steepest-descent path (breakpoints visited in increasing order,
  f' and f'' of the quadratic model on each segment, f'' floored at eps * its first value);
- subspace minimisation over the variables free at that point, then the 3.0 projection, falling back to the
  truncated step from the Cauchy point when the projected point is not a descent direction;
- the Moré-Thuente line search (MINPACK-2 ``dcsrch`` / ``dcstep``, ftol 1e-3, gtol 0.9, xtol 0.1), its first step
  min(1 / ||d||, 1) on the first iteration and 1 afterwards, at most ``maxls`` evaluations, memory reset on a
  failed search (termination when the memory is already empty);
- stopping on a projected gradient <= pgtol or a relative decrease <= factr * eps; memory updates skipped when
  s'y <= eps * (-g'd * stp).

One difference of representation: the limited-memory matrix is held as the dense n x n matrix
B = BFGS updates of theta * I by the stored pairs (oldest first), which is the compact form theta * I - W M W'
that scipy's code keeps, written out (n is small here); it is rebuilt each iteration from ring buffers of the pairs
with the problems on the last axis (contiguous elementwise passes, blocks that stay in cache). Results therefore
agree with scipy's up to rounding; where a problem's path is sensitive to rounding (a line-search comparison falling
the other way) the two can end in different local optima. :mod:`calibrl.selection.pruning` measures how often that
happens.

Schedule: each round gives every problem that is between iterations its search direction (Cauchy point, subspace
step) and every problem inside a line search one trial evaluation, so a round never waits for the longest search;
each problem's own sequence of steps is the same as when it is fitted alone (a problem's numbers never depend on
the others in the batch).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from calibrl._compiled import compiled

__all__ = ["minimize_lbfgsb_batch"]

_EPS = float(np.finfo(float).eps)
_FTOL, _GTOL, _XTOL = 1e-3, 0.9, 0.1
_BIG = 1e10


def _projgr(x, g, lo, hi):
    """Infinity norm of the projected gradient, [P] (scipy's ``projgr``)."""
    gi = np.where((g < 0) & np.isfinite(hi), np.maximum(x - hi, g), g)
    gi = np.where((g >= 0) & np.isfinite(lo), np.minimum(x - lo, gi), gi)
    return np.abs(gi).max(axis=1)


def _bfgs_matrix(theta, S, Y, SY, col, head, rows):
    """Dense L-BFGS matrix of problems ``rows`` [A]: theta * I updated by their stored (s, y) pairs, oldest first.

    theta [A]; S / Y [n, m, P] and SY [m, P] (the stored s'y) hold the pairs of all P problems in ring buffers:
    problem r's ``col[r]`` pairs sit in slots (head[r] - col[r] + j) mod m, j = 0 (oldest) .. col[r] - 1; col /
    head [P]. Returns [A, n, n]. Pair j: B <- B - (B s)(B s)' / (s' B s) + y y' / (s'y), each sum taken in index
    order. A compiled loop over the problems (:func:`_bfgs_matrix_into`): some 500 multiply-adds per problem, which
    as numpy passes over [n, n, problems] blocks cost more in the passes than in the arithmetic (about a third of
    a fit's time, docs/eval.md).
    """
    out = np.empty((rows.size, S.shape[0], S.shape[0]))
    # int64 and float64 already (the solver's own arrays): no copies on this per-round path
    _bfgs_matrix_into(np.ascontiguousarray(theta, dtype=np.float64), S, Y, SY, np.asarray(col, dtype=np.int64),
                      np.asarray(head, dtype=np.int64), np.asarray(rows, dtype=np.int64), out)
    return out


@compiled(nogil=True, error_model="numpy")
def _bfgs_matrix_into(theta, S, Y, SY, col, head, rows, out):
    """:func:`_bfgs_matrix` into ``out`` [A, n, n] (division by a zero s'Bs or s'y gives inf, as numpy's)."""
    n, m = S.shape[0], S.shape[1]
    bs = np.empty(n)
    for a in range(rows.size):
        r = rows[a]
        c = col[r]
        for i in range(n):
            for k in range(n):
                out[a, i, k] = 0.0
            out[a, i, i] = theta[a]
        for j in range(c):
            slot = (head[r] - c + j) % m
            for i in range(n):  # B s (B is symmetric)
                acc = out[a, i, 0] * S[0, slot, r]
                for k in range(1, n):
                    acc += out[a, i, k] * S[k, slot, r]
                bs[i] = acc
            sbs = S[0, slot, r] * bs[0]
            for i in range(1, n):
                sbs += S[i, slot, r] * bs[i]
            cs = 1.0 / sbs
            cy = 1.0 / SY[slot, r]
            for i in range(n):
                for k in range(n):
                    out[a, i, k] -= (bs[i] * cs) * bs[k]
            for i in range(n):
                for k in range(n):
                    out[a, i, k] += (Y[i, slot, r] * cy) * Y[k, slot, r]


def _cauchy(x, g, B, lo, hi):
    """Generalized Cauchy point and the variables fixed at a bound there (scipy's ``cauchy``); [A, n] each."""
    a, n = x.shape
    has_lo, has_hi = np.isfinite(lo)[None], np.isfinite(hi)[None]
    tl, tu = x - lo, hi - x
    neg = -g
    xlower = has_lo & (tl <= 0)
    xupper = has_hi & (tu <= 0)
    at_bound = (xlower & (neg <= 0)) | (~xlower & xupper & (neg >= 0))
    zero_g = ~xlower & ~xupper & (np.abs(neg) <= 0)
    d = np.where(at_bound | zero_g, 0.0, neg)
    moving = d != 0
    brk_lo = moving & has_lo & (neg < 0)
    brk_hi = moving & ~brk_lo & has_hi & (neg > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        tbrk = np.where(brk_lo, tl / -neg, np.where(brk_hi, tu / neg, np.inf))
    bnded = ~(moving & ~brk_lo & ~brk_hi).any(axis=1)
    xcp = x.copy()
    rows = np.arange(a)
    f1 = -np.einsum("ai,ai->a", d, d)
    bd = np.einsum("aij,aj->ai", B, d)
    f2 = np.einsum("ai,ai->a", d, bd)
    f2_org = f2.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        dtm = -f1 / f2
    tsum = np.zeros(a)
    tj = np.zeros(a)
    going = moving.any(axis=1) & np.isfinite(tbrk).any(axis=1)  # nbreak > 0
    left = np.isfinite(tbrk)
    fixed = at_bound.copy()
    for _ in range(n):
        if not going.any():
            break
        tb = np.where(left, tbrk, np.inf)
        ibp = np.argmin(tb, axis=1)
        tnext = tb[rows, ibp]
        dt = tnext - tj
        going &= np.isfinite(tnext) & ~(dtm < dt)
        idx = np.flatnonzero(going)
        if not idx.size:
            break
        b = ibp[idx]
        tj[idx] = tnext[idx]
        tsum[idx] += dt[idx]
        left[idx, b] = False
        dibp = d[idx, b]
        bound = np.where(dibp > 0, hi[b], lo[b])
        xcp[idx, b] = bound
        d[idx, b] = 0.0
        fixed[idx, b] = True
        # f' and f'' of the model at the breakpoint along the new direction (scipy updates them in closed form)
        zc = np.where(fixed[idx], xcp[idx], x[idx] + tsum[idx, None] * d[idx])
        bdi = np.einsum("aij,aj->ai", B[idx], d[idx])
        nf1 = np.einsum("ai,ai->a", g[idx], d[idx]) + np.einsum("ai,ai->a", zc - x[idx], bdi)
        nf2 = np.maximum(_EPS * f2_org[idx], np.einsum("ai,ai->a", d[idx], bdi))
        nleft = left[idx].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ndtm = np.where(nleft > 0, -nf1 / nf2, np.where(bnded[idx], 0.0, -nf1 / nf2))
        dtm[idx] = ndtm
        going[idx] = nleft > 0
    dtm = np.where(dtm <= 0, 0.0, dtm)
    any_move = moving.any(axis=1)
    tsum = tsum + np.where(any_move, dtm, 0.0)
    xcp = np.where(any_move[:, None], xcp + tsum[:, None] * d, xcp)
    return xcp, fixed


def _subspace(x, g, B, z, free, lo, hi):
    """Subspace minimisation from the Cauchy point ``z`` over the ``free`` variables, then the projection of
    L-BFGS-B 3.0 with its fallback (scipy's ``cmprlb`` + ``subsm``); returns the new point [A, n] and [A] True
    where the reduced matrix is singular (scipy then empties the memory and restarts the iteration)."""
    a, n = x.shape
    r = -(g + np.einsum("aij,aj->ai", B, z - x))
    eye = np.eye(n)[None]
    keep = free[:, :, None] & free[:, None, :]
    Bf = np.where(keep, B, eye)
    rhs = np.where(free, r, 0.0)[..., None]
    try:
        du = np.linalg.solve(Bf, rhs)[..., 0]
    except np.linalg.LinAlgError:  # some reduced matrix is singular: solve one by one, nan where singular
        du = np.full(x.shape, np.nan)
        for i in range(a):
            try:
                du[i] = np.linalg.solve(Bf[i], rhs[i])[:, 0]
            except np.linalg.LinAlgError:
                pass
    singular = ~np.isfinite(du).all(axis=1)
    du = np.where(free & ~singular[:, None], du, 0.0)
    has_lo, has_hi = np.isfinite(lo)[None], np.isfinite(hi)[None]
    xn = np.where(free, np.minimum(hi, np.maximum(lo, z + du)), z)
    iword = (free & ((has_lo & (xn == lo)) | (has_hi & (xn == hi)))).any(axis=1)
    ddp = np.einsum("ai,ai->a", xn - x, g)
    back = iword & (ddp > 0)
    if back.any():
        i = np.flatnonzero(back)
        zb, dk, fr = z[i], du[i], free[i]
        with np.errstate(divide="ignore", invalid="ignore"):
            t_lo = np.where(lo - zb >= 0, 0.0, (lo - zb) / dk)
            t_hi = np.where(hi - zb <= 0, 0.0, (hi - zb) / dk)
        ratio = np.where(fr & (dk < 0) & has_lo, t_lo, np.where(fr & (dk > 0) & has_hi, t_hi, np.inf))
        ibd = np.argmin(ratio, axis=1)
        alpha = np.minimum(1.0, ratio[np.arange(i.size), ibd])
        hit = alpha < 1.0
        rows = np.flatnonzero(hit)
        cols = ibd[hit]
        sign = dk[rows, cols]
        zb[rows, cols] = np.where(sign > 0, hi[cols], np.where(sign < 0, lo[cols], zb[rows, cols]))
        dk[rows, cols] = np.where(sign != 0, 0.0, dk[rows, cols])
        xn[i] = np.where(fr, zb + alpha[:, None] * dk, zb)
    return xn, singular


def _dcstep(stx, fx, dx, sty, fy, dy, stp, fp, dp, brackt, stpmin, stpmax):
    """MINPACK-2 ``dcstep`` elementwise over arrays (scipy.optimize._dcsrch.dcstep)."""
    sgnd = np.sign(dp) * np.sign(dx)
    with np.errstate(all="ignore"):
        # case 1: higher function value, the minimum is bracketed
        th = 3.0 * (fx - fp) / (stp - stx) + dx + dp
        s = np.maximum(np.maximum(np.abs(th), np.abs(dx)), np.abs(dp))
        gam = s * np.sqrt((th / s) ** 2 - (dx / s) * (dp / s))
        gam1 = np.where(stp < stx, -gam, gam)
        r = ((gam1 - dx) + th) / (((gam1 - dx) + gam1) + dp)
        stpc = stx + r * (stp - stx)
        stpq = stx + ((dx / ((fx - fp) / (stp - stx) + dx)) / 2.0) * (stp - stx)
        f_case1 = np.where(np.abs(stpc - stx) <= np.abs(stpq - stx), stpc, stpc + (stpq - stpc) / 2.0)
        # case 2: derivatives of opposite sign, bracketed
        gam2 = np.where(stp > stx, -gam, gam)
        r = ((gam2 - dp) + th) / (((gam2 - dp) + gam2) + dx)
        stpc2 = stp + r * (stx - stp)
        stpq2 = stp + (dp / (dp - dx)) * (stx - stp)
        f_case2 = np.where(np.abs(stpc2 - stp) > np.abs(stpq2 - stp), stpc2, stpq2)
        # case 3: derivative decreases in magnitude
        gam3 = s * np.sqrt(np.maximum(0.0, (th / s) ** 2 - (dx / s) * (dp / s)))
        gam3 = np.where(stp > stx, -gam3, gam3)
        r = ((gam3 - dp) + th) / ((gam3 + (dx - dp)) + gam3)
        stpc3 = np.where((r < 0) & (gam3 != 0), stp + r * (stx - stp), np.where(stp > stx, stpmax, stpmin))
        f3_b = np.where(np.abs(stpc3 - stp) < np.abs(stpq2 - stp), stpc3, stpq2)
        reach = stp + 0.66 * (sty - stp)
        f3_b = np.where(stp > stx, np.minimum(reach, f3_b), np.maximum(reach, f3_b))
        f3_u = np.clip(np.where(np.abs(stpc3 - stp) > np.abs(stpq2 - stp), stpc3, stpq2), stpmin, stpmax)
        f_case3 = np.where(brackt, f3_b, f3_u)
        # case 4: derivative does not decrease in magnitude
        th4 = 3.0 * (fp - fy) / (sty - stp) + dy + dp
        s4 = np.maximum(np.maximum(np.abs(th4), np.abs(dy)), np.abs(dp))
        gam4 = s4 * np.sqrt((th4 / s4) ** 2 - (dy / s4) * (dp / s4))
        gam4 = np.where(stp > sty, -gam4, gam4)
        r = ((gam4 - dp) + th4) / (((gam4 - dp) + gam4) + dy)
        f_case4 = np.where(brackt, stp + r * (sty - stp), np.where(stp > stx, stpmax, stpmin))
    c1 = fp > fx
    c2 = ~c1 & (sgnd < 0)
    c3 = ~c1 & ~c2 & (np.abs(dp) < np.abs(dx))
    stpf = np.where(c1, f_case1, np.where(c2, f_case2, np.where(c3, f_case3, f_case4)))
    brackt = brackt | c1 | c2
    move_y = c1 | (~c1 & (sgnd < 0))
    y_from_p = c1
    nsty = np.where(y_from_p, stp, np.where(move_y, stx, sty))
    nfy = np.where(y_from_p, fp, np.where(move_y, fx, fy))
    ndy = np.where(y_from_p, dp, np.where(move_y, dx, dy))
    nstx = np.where(c1, stx, stp)
    nfx = np.where(c1, fx, fp)
    ndx = np.where(c1, dx, dp)
    return nstx, nfx, ndx, nsty, nfy, ndy, stpf, brackt


class _LineSearch:
    """MINPACK-2 ``dcsrch`` state of the line searches of P problems (stpmin = 0), each started by :meth:`start`."""

    _FIELDS = ("stpmax", "finit", "ginit", "gtest", "width", "width1", "stx", "fx", "gx", "sty", "fy", "gy", "stmin",
               "stmax")

    def __init__(self, p):
        for name in self._FIELDS:
            setattr(self, name, np.zeros(p))
        self.brackt = np.zeros(p, dtype=bool)
        self.stage = np.ones(p, dtype=np.int8)

    def start(self, i, f, g, stp, stpmax):
        """New searches of problems ``i`` [k] from f, g = derivative along d, first step ``stp``, bound ``stpmax``."""
        self.stpmax[i] = stpmax
        self.brackt[i] = False
        self.stage[i] = 1
        self.finit[i], self.ginit[i] = f, g
        self.gtest[i] = _FTOL * g
        width = stpmax - 0.0
        self.width[i], self.width1[i] = width, width / 0.5
        self.stx[i], self.fx[i], self.gx[i] = 0.0, f, g
        self.sty[i], self.fy[i], self.gy[i] = 0.0, f, g
        self.stmin[i] = 0.0
        self.stmax[i] = stp + 4.0 * stp

    def step(self, i, stp, f, g):
        """Rows ``i`` evaluated at ``stp`` (f, g = derivative along d); returns (done [k], new stp [k])."""
        ftest = self.finit[i] + stp * self.gtest[i]
        stage = self.stage[i]
        stage = np.where((stage == 1) & (f <= ftest) & (g >= 0), 2, stage)
        br, stmin, stmax = self.brackt[i], self.stmin[i], self.stmax[i]
        done = br & ((stp <= stmin) | (stp >= stmax))
        done |= br & (stmax - stmin <= _XTOL * stmax)
        done |= (stp == self.stpmax[i]) & (f <= ftest) & (g <= self.gtest[i])
        done |= (stp == 0.0) & ((f > ftest) | (g >= self.gtest[i]))
        done |= (f <= ftest) & (np.abs(g) <= _GTOL * -self.ginit[i])
        self.stage[i[done]] = stage[done]
        go = ~done
        out = stp.copy()  # a finished search keeps its step
        if not go.any():
            return done, out
        # the searches going on: the next trial step (dcsrch's update), only for them
        i, stp, f, g, ftest, stage = i[go], stp[go], f[go], g[go], ftest[go], stage[go]
        br, stmin, stmax = br[go], stmin[go], stmax[go]
        gt = self.gtest[i]
        stx, fx, gx, sty, fy, gy = self.stx[i], self.fx[i], self.gx[i], self.sty[i], self.fy[i], self.gy[i]
        mod = (stage == 1) & (f <= fx) & (f > ftest)
        shift_f = np.where(mod, gt, 0.0)
        fxm, fym, fm = fx - stx * shift_f, fy - sty * shift_f, f - stp * shift_f
        gxm, gym, gm = gx - shift_f, gy - shift_f, g - shift_f
        stx, fxm, gxm, sty, fym, gym, nstp, br = _dcstep(stx, fxm, gxm, sty, fym, gym, stp, fm, gm, br, stmin, stmax)
        fx, fy = fxm + stx * shift_f, fym + sty * shift_f
        gx, gy = gxm + shift_f, gym + shift_f
        width, width1 = self.width[i], self.width1[i]
        halve = br & (np.abs(sty - stx) >= 0.66 * width1)
        nstp = np.where(halve, stx + 0.5 * (sty - stx), nstp)
        width1 = np.where(br, width, width1)
        width = np.where(br, np.abs(sty - stx), width)
        stmin = np.where(br, np.minimum(stx, sty), nstp + 1.1 * (nstp - stx))
        stmax = np.where(br, np.maximum(stx, sty), nstp + 4.0 * (nstp - stx))
        nstp = np.clip(nstp, 0.0, self.stpmax[i])
        back = (br & ((nstp <= stmin) | (nstp >= stmax))) | (br & (stmax - stmin <= _XTOL * stmax))
        nstp = np.where(back, stx, nstp)
        for name, val in (("stage", stage), ("brackt", br), ("stx", stx), ("fx", fx), ("gx", gx), ("sty", sty),
                          ("fy", fy), ("gy", gy), ("width", width), ("width1", width1), ("stmin", stmin),
                          ("stmax", stmax)):
            getattr(self, name)[i] = val
        out[go] = nstp
        return done, out


def minimize_lbfgsb_batch(
    fun_grad: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    x0: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    *,
    m: int = 10,
    factr: float = 1e7,
    pgtol: float = 1e-5,
    maxls: int = 20,
    maxiter: int = 15000,
) -> np.ndarray:
    """Minimise P independent problems with scipy's L-BFGS-B steps; returns the final points [P, n].

    ``fun_grad(x [Q, n], rows [Q])`` returns the objectives [Q] and gradients [Q, n] of problems ``rows`` at ``x``;
    ``x0`` [P, n] start points (clipped into the bounds), ``lower`` / ``upper`` [n] bounds (+-inf: none). As
    scipy's, a problem ends on a projected gradient <= ``pgtol``, a relative decrease <= ``factr`` * eps, a line
    search failing with an empty memory (the last accepted point is returned) or ``maxiter`` iterations.
    """
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    x = np.clip(np.asarray(x0, dtype=np.float64), lo, hi).copy()
    p, n = x.shape
    all_rows = np.arange(p)
    f, g = fun_grad(x, all_rows)
    f, g = np.asarray(f, dtype=np.float64).copy(), np.asarray(g, dtype=np.float64).copy()
    S, Y = np.zeros((n, m, p)), np.zeros((n, m, p))  # ring buffers of the (s, y) pairs, see _bfgs_matrix
    SY = np.ones((m, p))
    col = np.zeros(p, dtype=np.int64)
    head = np.zeros(p, dtype=np.int64)  # the slot the next pair goes to
    theta = np.ones(p)
    iters = np.zeros(p, dtype=np.int64)
    active = _projgr(x, g, lo, hi) > pgtol
    tol = factr * _EPS
    # every problem is either between iterations or inside a line search; each round gives the first a search
    # direction and every problem inside a search one evaluation, so no round waits for the longest search
    searching = np.zeros(p, dtype=bool)
    d, z = np.zeros((p, n)), np.zeros((p, n))  # search direction and the subspace point (the step of length 1)
    gd0, fold, stp_cur = np.zeros(p), np.zeros(p), np.zeros(p)
    nls = np.zeros(p, dtype=np.int64)  # evaluations of the current search
    x_new, f_new, g_new, gd_last = x.copy(), f.copy(), g.copy(), np.zeros(p)
    ls = _LineSearch(p)
    none = np.zeros(0, dtype=np.int64)
    while active.any():
        failed = none
        A = np.flatnonzero(active & ~searching)
        if A.size:
            xa, ga = x[A], g[A]
            B = _bfgs_matrix(theta[A], S, Y, SY, col, head, A)
            broken = ~np.isfinite(B).all(axis=(1, 2))
            if broken.any():  # a failed factorisation in scipy's code: empty the memory, restart the iteration
                col[A[broken]], theta[A[broken]] = 0, 1.0
                B[broken] = np.eye(n)
            za, fixed = _cauchy(xa, ga, B, lo, hi)
            free = ~fixed
            sub = (col[A] > 0) & free.any(axis=1)
            restart = np.zeros(A.size, dtype=bool)
            if sub.any():
                j = np.flatnonzero(sub)
                za[j], restart[j] = _subspace(xa[j], ga[j], B[j], za[j], free[j], lo, hi)
            if restart.any():  # singular reduced matrix: the memory is emptied and the iteration restarted
                col[A[restart]], theta[A[restart]] = 0, 1.0
                keep_on = ~restart
                A, xa, ga, za = A[keep_on], xa[keep_on], ga[keep_on], za[keep_on]
            da = za - xa
            dnorm = np.sqrt(np.einsum("ai,ai->a", da, da))
            # largest feasible step along d (the first iteration: 1)
            with np.errstate(divide="ignore", invalid="ignore"):
                r_lo = np.where(lo - xa >= 0, 0.0, (lo - xa) / da)
                r_hi = np.where(hi - xa <= 0, 0.0, (hi - xa) / da)
            ratio = np.where((da < 0) & np.isfinite(lo), r_lo, np.where((da > 0) & np.isfinite(hi), r_hi, _BIG))
            first = iters[A] == 0
            stpmx = np.where(first, 1.0, np.minimum(_BIG, ratio.min(axis=1)))
            with np.errstate(divide="ignore"):
                stp = np.where(first, np.minimum(1.0 / dnorm, stpmx), 1.0)
            gda = np.einsum("ai,ai->a", ga, da)
            descent = gda < 0
            failed = A[~descent]  # not a descent direction: a failed search
            go = A[descent]
            d[go], z[go], gd0[go], fold[go], stp_cur[go] = da[descent], za[descent], gda[descent], f[go], stp[descent]
            nls[go] = 0
            ls.start(go, f[go], gda[descent], stp[descent], stpmx[descent])
            searching[go] = True
        ok = none
        L = np.flatnonzero(searching)
        if L.size:  # one trial step of every search
            s_ = stp_cur[L]
            xt = np.where((s_ == 1.0)[:, None], z[L], s_[:, None] * d[L] + x[L])
            ft, gt = fun_grad(xt, L)
            gdt = np.einsum("ai,ai->a", gt, d[L])
            f_new[L], g_new[L], x_new[L], gd_last[L] = ft, gt, xt, gdt
            done, nstp = ls.step(L, s_, ft, gdt)
            stp_cur[L] = nstp
            nls[L] += 1
            ok = L[done]
            spent = L[~done & (nls[L] >= maxls)]
            searching[ok], searching[spent] = False, False
            failed = np.concatenate([failed, spent])
        # failed search: back to the old point; reset the memory, or stop when it is empty
        stop = failed[col[failed] == 0]
        active[stop] = False
        reset = failed[col[failed] > 0]
        col[reset], theta[reset] = 0, 1.0
        if not ok.size:
            continue
        # accepted steps
        Ak = ok
        y = g_new[Ak] - g[Ak]
        x[Ak], f[Ak], g[Ak] = x_new[Ak], f_new[Ak], g_new[Ak]
        iters[Ak] += 1
        sk = stp_cur[Ak]
        converged = _projgr(x[Ak], g[Ak], lo, hi) <= pgtol
        fo, fn = fold[Ak], f_new[Ak]
        converged |= (fo - fn) <= tol * np.maximum(np.maximum(np.abs(fo), np.abs(fn)), 1.0)
        converged |= iters[Ak] >= maxiter
        active[Ak[converged]] = False
        one = sk == 1.0
        g0, gl, dk = gd0[Ak], gd_last[Ak], d[Ak]
        dr = np.where(one, gl - g0, (gl - g0) * sk)
        s = np.where(one[:, None], dk, sk[:, None] * dk)
        ddum = np.where(one, -g0, -g0 * sk)
        upd = ~converged & ~(dr <= _EPS * ddum)
        u = Ak[upd]
        if u.size:
            h = head[u]
            S[:, h, u], Y[:, h, u], SY[h, u] = s[upd].T, y[upd].T, dr[upd]
            head[u] = (h + 1) % m
            col[u] = np.minimum(col[u] + 1, m)
            theta[u] = np.einsum("ai,ai->a", y[upd], y[upd]) / dr[upd]
    return x
