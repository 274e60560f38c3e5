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
# KernelSmoother(ReflectedGaussianKernel(width)).predict on its 200-point mesh) with tests/relplot_reference.py
RELPLOT = {
    'small_calibrated': {"smooth_ece": 0.0918865466905682, "width": 0.0927734375, "smooth_ece_at_0.05": 0.11512113681700674,
        "curve": {0: 0.13434293582428483, 20: 0.21484006126480276, 60: 0.3751004588287369, 100: 0.4208645864076098, 140: 0.5726003466987741, 180: 0.9529309477783245, 199: 0.9906439926095731}},
    'overconfident': {"smooth_ece": 0.16981062894977034, "width": 0.169921875, "smooth_ece_at_0.05": 0.16966188115214695,
        "curve": {0: 0.015544164711654495, 20: 0.027259477541973873, 60: 0.12540051366413327, 100: 0.30896264046154415, 140: 0.5391135035201857, 180: 0.7057423542178298, 199: 0.7262004206854317}},
    'underconfident': {"smooth_ece": 0.138437695231426, "width": 0.138671875, "smooth_ece_at_0.05": 0.13834983919530847,
        "curve": {0: 0.24316501470309151, 20: 0.27384401792101754, 60: 0.4580602603647381, 100: 0.6600032832933209, 140: 0.840008656530261, 180: 0.9648529933088421, 199: 0.9804513003855838}},
    'large_nearly_calibrated': {"smooth_ece": 0.009374549914091566, "width": 0.009765625, "smooth_ece_at_0.05": 0.006397006546522071,
        "curve": {0: 0.0033085931674194545, 20: 0.08594899508365914, 60: 0.2862017515582415, 100: 0.49710068670158325, 140: 0.7197375163347232, 180: 0.8977712536474958, 199: 0.9769885399873078}},
    'ties_near_one': {"smooth_ece": 0.1583246027447797, "width": 0.1591796875, "smooth_ece_at_0.05": 0.15807124256964558,
        "curve": {0: 0.05506009299082112, 20: 0.09537942051330035, 60: 0.2215286058605879, 100: 0.39008847163755533, 140: 0.593984602596838, 180: 0.7528243543048081, 199: 0.7764928589787418}},
    'endpoints': {"smooth_ece": 0.149999702199315, "width": 0.150390625, "smooth_ece_at_0.05": 0.14999971012007238,
        "curve": {0: 0.1666664572372671, 20: 0.16666640483910206, 60: 0.1666651041825286, 100: 0.8570331199704327, 140: 0.857139634623454, 180: 0.8571422924811624, 199: 0.8571423955430328}},
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
    assert np.trapezoid(curve.density, curve.mesh) == pytest.approx(1.0)
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
