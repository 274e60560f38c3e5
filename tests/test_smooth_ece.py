"""Smooth ECE and the smoothed reliability curve against relplot (values computed with relplot 1.0.3 by
tests/relplot_reference.py, stored here: relplot is not a dependency), and its bootstrap replicates
against the gathered rows."""

from __future__ import annotations

import numpy as np
import pytest
import relplot_reference as _ref  # tests/relplot_reference.py: the cases both sides read

from calibrl import metrics as M
from calibrl.metrics.smooth import smooth_ece_replicates

CASES = _ref.reference_cases()

# computed by relplot 1.0.3 (relplot.smECE(f, y, return_width=True), relplot.smECE_sigma(f, y, 0.05), and
# KernelSmoother(ReflectedGaussianKernel(width)).predict on its 200-point mesh, prepare_rel_diagram's density) with
# tests/relplot_reference.py
RELPLOT = {
    'small_calibrated': {"smooth_ece": 0.0918865466905682, "width": 0.0927734375, "smooth_ece_at_0.05": 0.11512113681700674,
        "curve": {0: 0.13434293582428483, 20: 0.21484006126480276, 60: 0.3751004588287369, 100: 0.4208645864076098, 140: 0.5726003466987741, 180: 0.9529309477783245, 199: 0.9906439926095731},
        "density": {0: 1.1119507089612344, 20: 1.2852295967149616, 60: 1.04625491766681, 100: 1.107707285826801, 140: 0.9483722248595727, 180: 0.6018974467368778, 199: 0.47952576301767824}},
    'overconfident': {"smooth_ece": 0.16981062894977034, "width": 0.169921875, "smooth_ece_at_0.05": 0.16966188115214695,
        "curve": {0: 0.015544164711654495, 20: 0.027259477541973873, 60: 0.12540051366413327, 100: 0.30896264046154415, 140: 0.5391135035201857, 180: 0.7057423542178298, 199: 0.7262004206854317},
        "density": {0: 0.8676867093541384, 20: 0.8870647371459779, 60: 0.9728262075993784, 100: 0.9823254403908828, 140: 1.0112432511329166, 180: 1.1301125099760898, 199: 1.1539224555153764}},
    'underconfident': {"smooth_ece": 0.138437695231426, "width": 0.138671875, "smooth_ece_at_0.05": 0.13834983919530847,
        "curve": {0: 0.24316501470309151, 20: 0.27384401792101754, 60: 0.4580602603647381, 100: 0.6600032832933209, 140: 0.840008656530261, 180: 0.9648529933088421, 199: 0.9804513003855838},
        "density": {0: 0.9900993992522716, 20: 0.9891452081367662, 60: 0.989119259627089, 100: 1.0337028722418782, 140: 1.0183036437924082, 180: 0.9649969145088029, 199: 0.9579188862239446}},
    'large_nearly_calibrated': {"smooth_ece": 0.009374549914091566, "width": 0.009765625, "smooth_ece_at_0.05": 0.006397006546522071,
        "curve": {0: 0.0033085931674194545, 20: 0.08594899508365914, 60: 0.2862017515582415, 100: 0.49710068670158325, 140: 0.7197375163347232, 180: 0.8977712536474958, 199: 0.9769885399873078},
        "density": {0: 0.9677278143062902, 20: 1.0293805654797636, 60: 1.0009368427600767, 100: 1.0285734501597485, 140: 0.994894101651605, 180: 1.0010963796260928, 199: 0.9348646116996068}},
    'ties_near_one': {"smooth_ece": 0.1583246027447797, "width": 0.1591796875, "smooth_ece_at_0.05": 0.15807124256964558,
        "curve": {0: 0.05506009299082112, 20: 0.09537942051330035, 60: 0.2215286058605879, 100: 0.39008847163755533, 140: 0.593984602596838, 180: 0.7528243543048081, 199: 0.7764928589787418},
        "density": {0: 0.018362526834407124, 20: 0.03502374546745243, 60: 0.2255704262578559, 100: 0.7965913622309077, 140: 1.682109974196168, 180: 2.2806313120414834, 199: 2.343348460299341}},
    'endpoints': {"smooth_ece": 0.149999702199315, "width": 0.150390625, "smooth_ece_at_0.05": 0.14999971012007238,
        "curve": {0: 0.1666664572372671, 20: 0.16666640483910206, 60: 0.1666651041825286, 100: 0.8570331199704327, 140: 0.857139634623454, 180: 0.8571422924811624, 199: 0.8571423955430328},
        "density": {0: 0.795812133372209, 20: 0.6365502620344, 60: 0.10666674951755024, 100: 0.007809870630302352, 140: 0.2659843207773632, 180: 1.5179749218680445, 199: 1.856894977868488}},
}


@pytest.mark.parametrize("name", sorted(RELPLOT))
def test_smooth_ece_equals_relplot(name):
    f, y = CASES[name]
    value, width = M.smooth_ece(f, y, return_width=True)
    assert width == RELPLOT[name]["width"]  # the same bisection path: the same dyadic width
    assert value == pytest.approx(RELPLOT[name]["smooth_ece"], rel=1e-9, abs=1e-12)
    assert M.smooth_ece_at(f, y, 0.05) == pytest.approx(RELPLOT[name]["smooth_ece_at_0.05"], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", sorted(RELPLOT))
def test_smooth_reliability_curve_equals_relplot(name):
    f, y = CASES[name]
    curve = M.smooth_reliability(f, y)
    for i, expected in RELPLOT[name]["curve"].items():
        assert curve.accuracy[i] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    for i, expected in RELPLOT[name]["density"].items():  # relplot's kde: weights 1 / n, not renormalised
        assert curve.density[i] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert curve.smooth_ece == pytest.approx(RELPLOT[name]["smooth_ece"], rel=1e-9, abs=1e-12)


def test_smooth_ece_properties():
    rng = np.random.default_rng(3)
    f = rng.uniform(0, 1, 4000)
    calibrated = rng.uniform(0, 1, f.size) < f
    # outcomes drawn at the stated probability: small; the same confidences against the opposite outcomes: large
    assert M.smooth_ece(f, calibrated) < 0.05
    assert M.smooth_ece(f, ~calibrated) > 0.3
    # a constant over-statement of 0.2 is measured as about 0.2 (the residual is smooth)
    g = np.full(4000, 0.8)
    y = np.arange(4000) % 5 < 3  # 60% right
    assert M.smooth_ece(g, y) == pytest.approx(0.2, abs=1e-3)
    with pytest.raises(ValueError, match="confidence must lie in"):
        M.smooth_ece(np.log(f), calibrated)


def test_smooth_ece_replicates_equal_gathered_rows():
    rng = np.random.default_rng(5)
    n_groups = 40
    group = rng.integers(0, n_groups, 600)
    f = np.round(rng.uniform(0, 1, 600), 3)
    y = rng.uniform(0, 1, 600) < f ** 1.5
    counts = np.stack([np.bincount(rng.integers(0, n_groups, n_groups), minlength=n_groups)
                       for _ in range(4)]).astype(np.float64)
    reps = smooth_ece_replicates(f, y, group, counts)
    for r in range(4):
        idx = np.concatenate([np.flatnonzero(group == g) for g in range(n_groups) for _ in range(int(counts[r, g]))])
        assert reps[r] == pytest.approx(M.smooth_ece(f[idx], y[idx]), rel=1e-9)


def test_smooth_ece_replicates_whose_width_search_keeps_every_width():
    """A replicate of samples all wrong at confidence 1 keeps every width its search tries (smECE_s > s up to
    s = 1 - 2^-10), so its answer, smECE at width 1, is the one value the search did not compute; beside it a
    replicate whose search ends lower (its answer computed by the search) and an empty one (nan)."""
    f = np.r_[np.ones(8), np.linspace(0.3, 0.7, 8)]
    y = np.r_[np.zeros(8, dtype=bool), np.arange(8) % 2 == 0]
    group = np.repeat([0, 1, 2, 3], 4)  # prompts 0, 1: wrong at 1; 2, 3: mixed
    counts = np.array([[2, 1, 0, 0], [1, 0, 1, 2], [0, 0, 0, 0], [0, 3, 0, 0]])
    reps = smooth_ece_replicates(f, y, group, counts)
    widths = []
    for r in (0, 1, 3):
        idx = np.repeat(np.arange(16), counts[r, group])
        value, width = M.smooth_ece(f[idx], y[idx], return_width=True)
        assert reps[r] == pytest.approx(value, rel=1e-12)
        widths.append(width)
    assert widths[0] == widths[2] == 1.0 and widths[1] < 1.0 and np.isnan(reps[2])


@pytest.mark.parametrize("n", [4, 5, 37, 1001])
def test_reflected_convolution_by_fft_equals_numpys_direct_one(n):
    """The FFT is about 2.5n long, shorter than the reflected masses (3n - 2): the n outputs kept must still equal
    relplot's np.convolve(reflected, kernel, "valid") cut to the grid, nothing cut from them or wrapped onto them."""
    from calibrl.metrics.smooth import _kernel, _reflected_convolve

    rng = np.random.default_rng(n)
    mass = rng.random(n)
    kernel = _kernel(0.4, n)  # wide: the kernel reaches the ends, so a wrap-around would show
    reflected = np.concatenate([mass[::-1][:-1], mass, mass[::-1][1:]])  # [3n - 2]
    valid = np.convolve(reflected, kernel, "valid")  # [2n - 1]
    want = valid[n // 2: n // 2 + n]
    np.testing.assert_allclose(_reflected_convolve(mass, kernel), want, rtol=1e-12, atol=1e-12 * want.max())


@pytest.mark.parametrize("n", [1, 7, 1_000_000])
def test_relplot_s_first_test_never_holds_even_for_the_worst_confidence(n):
    """relplot's search first tests 1 < smECE_1 (then s* = 1); the code skips it as never true. The largest
    smECE_1 there is: every sample wrong at confidence 1 (or right at 0), residuals all +-1, where the 1e-4 in the
    smoothed residual's denominator is what keeps it below 1, also with a million samples on one point."""
    from calibrl.metrics.smooth import _sample_masses, _smooth_ece_from

    for f, y in ((np.ones(n), np.zeros(n)), (np.zeros(n), np.ones(n)),
                 (np.r_[np.ones(n - n // 2), np.zeros(n // 2)], np.r_[np.zeros(n - n // 2), np.ones(n // 2)])):
        value = _smooth_ece_from(_sample_masses(f, y.astype(float)), 1.0)
        assert 0.99 < value < 1.0
