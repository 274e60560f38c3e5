"""L-BFGS-B for many small independent bound-constrained problems at once, following scipy's steps.

:func:`minimize_lbfgsb_batch` runs the algorithm of ``scipy.optimize.minimize(method="L-BFGS-B")`` (L-BFGS-B 3.0,
Byrd, Lu, Nocedal & Zhu 1995; Morales & Nocedal 2011; scipy's defaults m = 10, factr = 1e7, pgtol = 1e-5,
maxls = 20) on P problems of n variables in lockstep, each with its own iterate, memory, line search and
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
that scipy's code keeps, written out (n is small here). Results therefore agree with scipy's up to rounding; where
a problem's path is sensitive to rounding (a line-search comparison falling the other way) the two can end in
different local optima. :mod:`calibrl.selection.pruning` measures how often that happens.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["minimize_lbfgsb_batch"]

_EPS = float(np.finfo(float).eps)
_FTOL, _GTOL, _XTOL = 1e-3, 0.9, 0.1
_BIG = 1e10


def _projgr(x, g, lo, hi):
    """Infinity norm of the projected gradient, [P] (scipy's ``projgr``)."""
    gi = np.where((g < 0) & np.isfinite(hi), np.maximum(x - hi, g), g)
    gi = np.where((g >= 0) & np.isfinite(lo), np.minimum(x - lo, gi), gi)
    return np.abs(gi).max(axis=1)


def _bfgs_matrix(theta, S, Y, SY, col):
    """Dense L-BFGS matrix per problem: theta * I updated by the stored (s, y) pairs, oldest first.

    theta [A], S / Y [A, m, n] (slot 0 oldest), SY [A, m] the stored s'y, col [A] pairs held; returns [A, n, n].
    """
    a, m, n = S.shape
    B = theta[:, None, None] * np.eye(n)[None]
    for j in range(int(col.max(initial=0))):
        on = col > j  # problems holding a pair in slot j
        s, y = S[:, j], Y[:, j]
        bs = np.matmul(B, s[:, :, None])[:, :, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            cs = np.where(on, 1.0 / np.einsum("ai,ai->a", s, bs), 0.0)
            cy = np.where(on, 1.0 / SY[:, j], 0.0)
        B -= (bs * cs[:, None])[:, :, None] * bs[:, None, :]
        B += (y * cy[:, None])[:, :, None] * y[:, None, :]
    return B


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
    """MINPACK-2 ``dcsrch`` state for a batch of line searches (stpmin = 0)."""

    def __init__(self, f, g, stp, stpmax):
        self.stpmax = stpmax
        self.brackt = np.zeros(f.shape, dtype=bool)
        self.stage = np.ones(f.shape, dtype=np.int8)
        self.finit, self.ginit = f.copy(), g.copy()
        self.gtest = _FTOL * g
        self.width = stpmax - 0.0
        self.width1 = self.width / 0.5
        self.stx, self.fx, self.gx = np.zeros_like(f), f.copy(), g.copy()
        self.sty, self.fy, self.gy = np.zeros_like(f), f.copy(), g.copy()
        self.stmin = np.zeros_like(f)
        self.stmax = stp + 4.0 * stp

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
        upd = ~done
        for name, val in (("stage", stage), ("brackt", br), ("stx", stx), ("fx", fx), ("gx", gx), ("sty", sty),
                          ("fy", fy), ("gy", gy), ("width", width), ("width1", width1), ("stmin", stmin),
                          ("stmax", stmax)):
            arr = getattr(self, name)
            arr[i[upd]] = val[upd]
        self.stage[i[done]] = stage[done]
        return done, np.where(done, stp, nstp)


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
    S, Y = np.zeros((p, m, n)), np.zeros((p, m, n))
    SY = np.ones((p, m))
    col = np.zeros(p, dtype=np.int64)
    theta = np.ones(p)
    iters = np.zeros(p, dtype=np.int64)
    active = _projgr(x, g, lo, hi) > pgtol
    tol = factr * _EPS
    while active.any():
        A = np.flatnonzero(active)
        xa, ga = x[A], g[A]
        B = _bfgs_matrix(theta[A], S[A], Y[A], SY[A], col[A])
        broken = ~np.isfinite(B).all(axis=(1, 2))
        if broken.any():  # a failed factorisation in scipy's code: empty the memory, restart the iteration
            col[A[broken]], theta[A[broken]] = 0, 1.0
            B[broken] = np.eye(n)
        z, fixed = _cauchy(xa, ga, B, lo, hi)
        free = ~fixed
        sub = (col[A] > 0) & free.any(axis=1)
        restart = np.zeros(A.size, dtype=bool)
        if sub.any():
            j = np.flatnonzero(sub)
            z[j], restart[j] = _subspace(xa[j], ga[j], B[j], z[j], free[j], lo, hi)
        if restart.any():  # singular reduced matrix: the memory is emptied and the iteration restarted
            col[A[restart]], theta[A[restart]] = 0, 1.0
            keep_on = ~restart
            A, xa, ga, B, z = A[keep_on], xa[keep_on], ga[keep_on], B[keep_on], z[keep_on]
        d = z - xa
        dnorm = np.sqrt(np.einsum("ai,ai->a", d, d))
        # largest feasible step along d (the first iteration: 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            r_lo = np.where(lo - xa >= 0, 0.0, (lo - xa) / d)
            r_hi = np.where(hi - xa <= 0, 0.0, (hi - xa) / d)
        ratio = np.where((d < 0) & np.isfinite(lo), r_lo, np.where((d > 0) & np.isfinite(hi), r_hi, _BIG))
        stpmx = np.where(iters[A] == 0, 1.0, np.minimum(_BIG, ratio.min(axis=1)))
        with np.errstate(divide="ignore"):
            stp = np.where(iters[A] == 0, np.minimum(1.0 / dnorm, stpmx), 1.0)
        gd0 = np.einsum("ai,ai->a", ga, d)
        fold = f[A]
        ascent = ~(gd0 < 0)
        # line search, all problems of A whose direction descends
        L = np.flatnonzero(~ascent)
        ls = _LineSearch(fold, gd0, stp, stpmx)
        ok = np.zeros(A.size, dtype=bool)
        gd_last = gd0.copy()
        stp_cur = stp.copy()
        f_new, g_new, x_new = fold.copy(), ga.copy(), xa.copy()
        searching = L
        for _ in range(maxls):
            if not searching.size:
                break
            s_ = stp_cur[searching]
            xt = np.where((s_ == 1.0)[:, None], z[searching], s_[:, None] * d[searching] + xa[searching])
            ft, gt = fun_grad(xt, A[searching])
            gdt = np.einsum("ai,ai->a", gt, d[searching])
            f_new[searching], g_new[searching], x_new[searching], gd_last[searching] = ft, gt, xt, gdt
            done, nstp = ls.step(searching, s_, ft, gdt)
            ok[searching[done]] = True
            stp_cur[searching] = nstp
            searching = searching[~done]
        failed = ascent.copy()
        failed[searching] = True
        # failed search: back to the old point; reset the memory, or stop when it is empty
        fa = A[failed]
        stop = fa[col[fa] == 0]
        active[stop] = False
        reset = fa[col[fa] > 0]
        col[reset], theta[reset] = 0, 1.0
        # accepted steps
        k = np.flatnonzero(ok)
        Ak = A[k]
        y = g_new[k] - ga[k]
        x[Ak], f[Ak], g[Ak] = x_new[k], f_new[k], g_new[k]
        iters[Ak] += 1
        sk = stp_cur[k]
        converged = _projgr(x[Ak], g[Ak], lo, hi) <= pgtol
        fo, fn = fold[k], f_new[k]
        converged |= (fo - fn) <= tol * np.maximum(np.maximum(np.abs(fo), np.abs(fn)), 1.0)
        converged |= iters[Ak] >= maxiter
        active[Ak[converged]] = False
        one = sk == 1.0
        dr = np.where(one, gd_last[k] - gd0[k], (gd_last[k] - gd0[k]) * sk)
        s = np.where(one[:, None], d[k], sk[:, None] * d[k])
        ddum = np.where(one, -gd0[k], -gd0[k] * sk)
        upd = ~converged & ~(dr <= _EPS * ddum)
        u = Ak[upd]
        if u.size:
            full = u[col[u] == m]
            if full.size:
                S[full, :-1], Y[full, :-1], SY[full, :-1] = S[full, 1:], Y[full, 1:], SY[full, 1:]
            slot = np.minimum(col[u], m - 1)
            S[u, slot], Y[u, slot], SY[u, slot] = s[upd], y[upd], dr[upd]
            col[u] = np.minimum(col[u] + 1, m)
            theta[u] = np.einsum("ai,ai->a", y[upd], y[upd]) / dr[upd]
    return x
