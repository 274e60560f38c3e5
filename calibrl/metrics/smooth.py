"""Smooth ECE and the smoothed reliability diagram (Blasiok & Nakkiran 2023, "Smooth ECE: principled reliability
diagrams via kernel smoothing"), computed as the ``relplot`` package (1.0.3, its defaults) computes them.

For confidences f_i in [0, 1], outcomes y_i in {0, 1} and residuals r_i = f_i - y_i, with K_s the Gaussian kernel
of width s reflected at 0 and 1:

    r_hat_s(t) = sum_i K_s(t, f_i) r_i / (sum_i K_s(t, f_i) + 1e-4)      smoothed residual
    dens_s(t)  = sum_i K_s(t, f_i) + 1e-4                                 (unnormalised) density
    smECE_s    = sum_t |r_hat_s(t)| dens_s(t) / sum_t dens_s(t)           over ``max(round(10 / s), 200)`` points t

and ``smooth_ece`` is smECE at the bandwidth s* with s* = smECE_{s*} (the fixed point, which makes the measure
consistent and bin-free), found as relplot's ``search_param``: 10 bisection steps on [0, 1] keeping the smallest s
with s >= smECE_s (or s >= 0.001); its first test, s = 1 if 1 < smECE_1, never holds and is not computed
(:func:`_fixed_point_width`).

The sums over samples are not pairwise (no N x T matrix): each sample's mass is split linearly between the two
nearest of E = ``max(2000, round(20 / s)) // 2 + 1`` grid nodes on [0, 1] (E = 1001 for s >= 0.01), the grid is
reflected at both ends and convolved with the kernel sampled on the grid (FFT), and the result is interpolated
linearly at the points t. Cost: O(N) per grid, plus O(E log E) per bandwidth tried; the grid masses are computed
once per E, so a million samples cost a few bincounts. Values equal relplot's ``smECE`` up to float rounding (the
FFT and bincount's summation order), checked against values computed with relplot in tests/test_smooth_ece.py.

``smooth_reliability`` gives relplot's smoothed reliability curve (``KernelSmoother`` with the reflected kernel at
s*, no bagging) and density on a mesh of 200 points, for the diagram.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from calibrl.metrics._arrays import as_correct, as_prob, check_same_length

__all__ = ["SmoothECEReplicates", "SmoothReliability", "smooth_ece", "smooth_ece_at", "smooth_ece_replicates",
           "smooth_reliability"]

_EPS_DENSITY = 1e-4  # relplot's BaseKernelMixin.smooth
_MIN_WIDTH = 0.001  # relplot's smECE(eps=0.001)
_BISECTION_STEPS = 10  # relplot's search_param(refine=10)
_MESH = 200  # relplot.config.smECE_mesh_pts and plot_mesh_pts

Masses = Callable[[int], tuple[np.ndarray, np.ndarray]]  # E -> (grid mass of r, grid mass of 1), each [E]


def _grid_size(width: float) -> int:
    """Grid nodes E for kernel width ``width``: relplot's ``max(2000, round(20 / s)) // 2 + 1``."""
    return max(2000, round(20 / width)) // 2 + 1


def _grid_split(f: np.ndarray, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower node [N] and the share [N] of each value's mass that goes to the next node (linear split)."""
    node = (f * (n_nodes - 1)).astype(int).clip(0, n_nodes - 2)
    return node, f * (n_nodes - 1) - node


def _grid_mass(f: np.ndarray, values: np.ndarray, n_nodes: int) -> np.ndarray:
    """``values`` [N] placed on ``n_nodes`` nodes of [0, 1], each split linearly between its two nearest nodes."""
    node, frac = _grid_split(f, n_nodes)
    return (np.bincount(node, weights=(1 - frac) * values, minlength=n_nodes)
            + np.bincount(node + 1, weights=frac * values, minlength=n_nodes))


def _kernel(width: float, n_nodes: int) -> np.ndarray:
    """The Gaussian density of sd ``width`` sampled at ``linspace(0, 1, n_nodes) - 0.5`` (relplot's kernel_ev)."""
    t = np.linspace(0, 1, n_nodes)
    return np.exp(-(t - 0.5) * (t - 0.5) / (2 * width ** 2)) / (np.sqrt(2 * np.pi) * width)


def _fft_length(n: int) -> int:
    """FFT length of :func:`_reflected_convolve` for a grid of ``n`` nodes: the shortest length L of small prime
    factors holding the n outputs kept, which end at index 2n - 1 + n // 2 of the linear convolution of the
    reflected masses (3n - 2) with the kernel (n). With the masses cut to L and the product of the transforms a
    circular convolution, an output j >= n - 1 reads masses j - n + 1 .. j only, none cut and none wrapped round, so
    the kept outputs are the linear convolution's, to rounding (2,560 for the usual grid of 1,001 nodes, where the
    whole linear convolution's 4n - 3 took 4,050; lengths of small prime factors rather than the next power of two,
    which took 3-4x as long per convolution, measured on 2026-11-29)."""
    from scipy import fft

    return fft.next_fast_len(2 * n - 1 + n // 2, real=True)


def _mass_spectrum(mass: np.ndarray) -> np.ndarray:
    """The real FFT [..., F] of grid masses [..., E] reflected at 0 and 1, cut to (or padded to) the length
    :func:`_fft_length`: the half of :func:`_reflected_convolve` that does not depend on the kernel."""
    from scipy import fft

    n = mass.shape[-1]
    ext = np.concatenate([np.flip(mass, -1)[..., :-1], mass, np.flip(mass, -1)[..., 1:]], axis=-1)
    return fft.rfft(ext, _fft_length(n))


def _kernel_spectrum(kernel: np.ndarray) -> np.ndarray:
    """The real FFT [..., F] of ``kernel`` [..., E] at the length :func:`_fft_length`."""
    from scipy import fft

    return fft.rfft(kernel, _fft_length(kernel.shape[-1]))


def _convolve_spectra(spectrum: np.ndarray, kernel_spectrum: np.ndarray, n: int) -> np.ndarray:
    """Masses and kernel given by their transforms [..., F] (:func:`_mass_spectrum`, :func:`_kernel_spectrum`;
    broadcast), convolved and cut to the ``n`` nodes: relplot's ``np.convolve(reflected, kernel, "valid")``
    centred."""
    from scipy import fft

    n_fft = _fft_length(n)
    full = fft.irfft(spectrum * kernel_spectrum, n_fft)
    return full[..., n - 1 + n // 2: n - 1 + n // 2 + n]  # "valid" starts at n - 1


def _reflected_convolve(mass: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Grid masses [..., E] reflected at 0 and 1 and convolved with ``kernel`` [..., E] (broadcast against the
    masses: one per row, or one for all), by FFT: relplot's ``np.convolve(reflected, kernel, "valid")`` cut to the
    E nodes."""
    return _convolve_spectra(_mass_spectrum(mass), _kernel_spectrum(kernel), kernel.shape[-1])


def _reflected_smooth(mass: np.ndarray, width: float) -> np.ndarray:
    """Grid masses [..., E] convolved with the kernel, reflected at 0 and 1 (relplot's ReflectedGaussianKernel)."""
    return _reflected_convolve(mass, _kernel(width, mass.shape[-1]))


def _interpolate(t: np.ndarray, grid_values: np.ndarray) -> np.ndarray:
    """Linear interpolation at ``t`` of the function with values ``grid_values`` [E] at i / (E - 1)."""
    n = grid_values.shape[-1]
    idx = (t * (n - 1)).astype(int).clip(0, n - 2)
    bucket = 1 / (n - 1)
    frac = (t - idx * bucket) / bucket
    return grid_values[..., idx] * (1 - frac) + grid_values[..., idx + 1] * frac


def _smooth_ece_from(masses: Masses, width: float) -> float:
    """smECE at kernel width ``width`` from the grid masses (``masses(E)``) of the residuals and of the samples."""
    n_nodes = _grid_size(width)
    mass_r, mass_1 = masses(n_nodes)
    t = np.linspace(0, 1, max(round(10 / width), _MESH))
    smooth = _reflected_smooth(np.stack([mass_r, mass_1]), width)  # [2, E]: one kernel transform for both
    num = _interpolate(t, smooth[0])
    dens = _interpolate(t, smooth[1]) + _EPS_DENSITY
    return float(np.sum(np.abs(num / dens) * dens) / np.sum(dens))


# relplot's search_param first tests 1 < smECE_1 and returns 1 if it holds. It never does: |r_hat_s(t)| < 1 at every t
# (its denominator is the kernel mass of residuals in [-1, 1] plus 1e-4; the FFT's rounding, about 1e-15 of the
# mass, stays far below that 1e-4 under about 10^11 samples), so smECE_1 < 1; the test is not computed, and the
# bisection always runs (its result is the same)


def _fixed_point_width(masses: Masses) -> float:
    """relplot's ``search_param`` (its first test, 1 < smECE_1, never holds: above): the bisection's last width s with
    s >= smECE_s."""
    def small_enough(width: float) -> bool:
        return width < _MIN_WIDTH or width < _smooth_ece_from(masses, width)

    high, low = 1.0, 0.0
    for _ in range(_BISECTION_STEPS):
        mid = (high + low) / 2
        if small_enough(mid):
            low = mid
        else:
            high = mid
    return high


def _sample_masses(f: np.ndarray, y: np.ndarray) -> Masses:
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    residual, ones = f - y, 1.0

    def masses(n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
        if n_nodes not in cache:
            node, frac = _grid_split(f, n_nodes)
            cache[n_nodes] = tuple(np.bincount(node, weights=(1 - frac) * v, minlength=n_nodes)
                                   + np.bincount(node + 1, weights=frac * v, minlength=n_nodes)
                                   for v in (residual, ones))
        return cache[n_nodes]

    return masses


def _inputs(confidence: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    f = as_prob(confidence)
    y = as_correct(correct)
    check_same_length(confidence=f, correct=y)
    return f, y.astype(np.float64)


def smooth_ece(confidence: Any, correct: Any, *, return_width: bool = False):
    """Smooth ECE (module docstring) of probabilities ``confidence`` [N] against ``correct`` [N]: a value in
    [0, 1], 0 = calibrated, lower is better; with ``return_width=True`` also the kernel width s* it used.
    Equals ``relplot.smECE(confidence, correct)`` up to float rounding."""
    f, y = _inputs(confidence, correct)
    masses = _sample_masses(f, y)
    width = _fixed_point_width(masses)
    value = _smooth_ece_from(masses, width)
    return (value, width) if return_width else value


def smooth_ece_at(confidence: Any, correct: Any, width: float) -> float:
    """smECE at a fixed kernel width (relplot's ``smECE_sigma``)."""
    if not width > 0:
        raise ValueError(f"width must be positive, got {width!r}")
    f, y = _inputs(confidence, correct)
    return _smooth_ece_from(_sample_masses(f, y), float(width))


class SmoothReliability(NamedTuple):
    """The smoothed reliability diagram: ``accuracy`` [200] (kernel-smoothed fraction correct) and ``density``
    [200] (kernel density of the confidences, integrating to 1 over [0, 1]) on ``mesh`` [200]; the kernel
    ``width`` s* and the ``smooth_ece`` at it."""

    mesh: np.ndarray
    accuracy: np.ndarray
    density: np.ndarray
    width: float
    smooth_ece: float


def smooth_reliability(confidence: Any, correct: Any) -> SmoothReliability:
    """relplot's smoothed reliability curve (``prepare_rel_diagram`` without its bootstrap band): the outcomes
    kernel-smoothed at the smooth-ECE width, ``sum_i K(t, f_i) y_i / (sum_i K(t, f_i) + 1e-4)``, and the kernel
    density of the confidences, ``(1/n) sum_i K(t, f_i)`` (relplot's ``kde``: it integrates to about 1, not
    renormalised), on 200 points of [0, 1]."""
    f, y = _inputs(confidence, correct)
    masses = _sample_masses(f, y)
    width = _fixed_point_width(masses)
    n_nodes = _grid_size(width)
    mesh = np.linspace(0, 1, _MESH)
    count = _interpolate(mesh, _reflected_smooth(_grid_mass(f, np.ones_like(f), n_nodes), width))
    right = _interpolate(mesh, _reflected_smooth(_grid_mass(f, y, n_nodes), width))
    accuracy = right / (count + _EPS_DENSITY)
    density = count / f.size  # relplot's kde: the kernel density of the confidences, weights 1 / n
    return SmoothReliability(mesh, accuracy, density, width, _smooth_ece_from(masses, width))


class SmoothECEReplicates:
    """Smooth ECE of bootstrap replicates given as group counts, for many chunks of replicates of one data set.

    ``confidence``, ``correct``, ``group`` [N] (dense group index), ``n_groups``. Calling it with ``counts``
    [b, G] (replicate r holds the samples of group g ``counts[r, g]`` times) returns [b]: what
    :func:`smooth_ece` gives on each replicate's gathered rows (up to float rounding). The grid masses are linear in
    the sample weights, so each grid size's masses of every replicate come from one sparse product, (per-(node,
    group) masses [2E, G], built once per E) @ counts.T; the replicates then search their widths together (the
    bisection steps of :func:`smooth_ece`, batched FFT convolutions per grid size). A replicate's reflected masses
    are transformed once per grid size and reused by every step of its search that reads that grid, so a step
    transforms only its kernel (and back): 1.3-2x faster on small files, the same bits.
    """

    def __init__(self, confidence: np.ndarray, correct: np.ndarray, group: np.ndarray, n_groups: int):
        self.f = np.asarray(confidence, dtype=np.float64)
        self.residual = self.f - np.asarray(correct, dtype=np.float64)
        self.group, self.n_groups = np.asarray(group), int(n_groups)
        self._node_group: dict[int, Any] = {}
        self._kernels: dict[tuple[float, int], np.ndarray] = {}

    def _kernel_spectrum(self, width: float, n_nodes: int) -> np.ndarray:
        """:func:`_kernel_spectrum` of the kernel of ``width`` on ``n_nodes``, kept for the later replicates (at
        most 256 kept: 5 MB on the usual grid of 1,001 nodes, 52 MB at the finest, 10,001, which widths below 0.002
        alone use)."""
        key = (float(width), n_nodes)
        if key not in self._kernels:
            if len(self._kernels) >= 256:
                self._kernels.clear()
            self._kernels[key] = _kernel_spectrum(_kernel(width, n_nodes))
        return self._kernels[key]

    def _matrix(self, n_nodes: int):
        from scipy.sparse import csc_matrix

        if n_nodes not in self._node_group:
            node, frac = _grid_split(self.f, n_nodes)
            rows = np.concatenate([node, node + 1, n_nodes + node, n_nodes + node + 1])
            data = np.concatenate([(1 - frac) * self.residual, frac * self.residual, 1 - frac, frac])
            # by columns (prompts): the product then reads the replicates' counts prompt after prompt and adds into
            # the few nodes' rows, which stay in cache (3.2x faster than by rows at 200,000 samples; each node's
            # sum is taken in the same prompt order either way, so the same bits)
            self._node_group[n_nodes] = csc_matrix((data, (rows, np.tile(self.group, 4))),
                                                   shape=(2 * n_nodes, self.n_groups))
        return self._node_group[n_nodes]

    def __call__(self, counts: np.ndarray) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.float64)
        spectra: dict[int, np.ndarray] = {}  # E -> [2, b, F] of this chunk, columns filled as replicates need them
        filled: dict[int, np.ndarray] = {}  # E -> [b] bool

        def spectra_of(n_nodes: int, rows: np.ndarray) -> np.ndarray:
            """Reflected grid masses' spectra [2, len(rows), F] (residuals, then counts) of replicates ``rows``:
            computed the first time one of the replicate's widths needs this grid, then reused by every later
            step of its bandwidth search at that grid (only the kernel's transform is new)."""
            if n_nodes not in spectra:
                spectra[n_nodes] = np.empty((2, len(counts), _fft_length(n_nodes) // 2 + 1), dtype=np.complex128)
                filled[n_nodes] = np.zeros(len(counts), dtype=bool)
            every = rows.size == len(counts)  # all the chunk's replicates (the usual case): views, not copies
            todo = rows[~filled[n_nodes][rows]]
            if todo.size:
                # [t, 2E]; all the chunk's replicates: their counts as they are, not a gathered copy
                m = np.asarray(self._matrix(n_nodes) @ (counts.T if todo.size == len(counts) else counts[todo].T)).T
                if every and todo.size == rows.size:
                    spectra[n_nodes][:] = _mass_spectrum(np.stack([m[:, :n_nodes], m[:, n_nodes:]]))
                else:
                    spectra[n_nodes][:, todo] = _mass_spectrum(np.stack([m[:, :n_nodes], m[:, n_nodes:]]))
                filled[n_nodes][todo] = True
            return spectra[n_nodes] if every else spectra[n_nodes][:, rows]

        def values(widths: np.ndarray, replicates: np.ndarray | None = None) -> np.ndarray:
            """smECE [k] of replicates ``replicates`` [k] (default: every one) at their own widths [k]."""
            out = np.empty(len(widths))
            sizes = np.array([_grid_size(w) for w in widths])
            for n_nodes in np.unique(sizes):
                rows = np.flatnonzero(sizes == n_nodes)
                # [g, F]: each width's kernel transformed once for both channels, and once for all the replicates
                # and chunks that try it (bisection widths are dyadic: replicates share them)
                ker = np.stack([self._kernel_spectrum(w, n_nodes) for w in widths[rows]])
                smooth = _convolve_spectra(spectra_of(n_nodes, rows if replicates is None else replicates[rows]), ker,
                                           n_nodes)  # [2, g, E]
                mesh = np.array([max(round(10 / w), _MESH) for w in widths[rows]])
                for n_mesh in np.unique(mesh):  # the rows read at the same points, interpolated together
                    at = np.flatnonzero(mesh == n_mesh)
                    t = np.linspace(0, 1, n_mesh)
                    num = _interpolate(t, smooth[0, at])
                    dens = _interpolate(t, smooth[1, at]) + _EPS_DENSITY
                    out[rows[at]] = np.sum(np.abs(num / dens) * dens, axis=-1) / np.sum(dens, axis=-1)
            return out

        high, low = np.ones(len(counts)), np.zeros(len(counts))  # relplot's first test never holds (above)
        at_high = np.empty(len(counts))  # smECE at ``high``, where a step computed it
        known = np.zeros(len(counts), dtype=bool)
        for _ in range(_BISECTION_STEPS):
            mid = (high + low) / 2
            value = values(mid)
            ok = (mid < _MIN_WIDTH) | (mid < value)
            low, high = np.where(ok, mid, low), np.where(ok, high, mid)
            at_high, known = np.where(ok, at_high, value), known | ~ok
        # the answer, smECE at the last high, was computed by the step that chose that high (a replicate's value
        # does not depend on the replicates computed beside it: the same bits); only replicates whose every step
        # kept its width (high still 1) are computed here: one smECE in eleven saved, 5-6% of the replicates' time
        # at 200,000 samples (measured on 2026-11-30)
        if not known.all():
            again = np.flatnonzero(~known)
            at_high[again] = values(high[again], again)
        at_high[~counts.any(axis=1)] = np.nan
        return at_high


def smooth_ece_replicates(confidence: np.ndarray, correct: np.ndarray, group: np.ndarray,
                          counts: np.ndarray) -> np.ndarray:
    """Smooth ECE of bootstrap replicates [b] given as group counts ``counts`` [b, G]
    (:class:`SmoothECEReplicates`, for one chunk)."""
    return SmoothECEReplicates(confidence, correct, group, counts.shape[1])(counts)
