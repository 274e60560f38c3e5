"""Reference values of smooth ECE and the smoothed reliability curve computed with relplot, for
tests/test_smooth_ece.py (which stores them: relplot is not a dependency of calibrl).

    python -m venv /tmp/relplot && /tmp/relplot/bin/pip install relplot==1.0.3 numpy
    /tmp/relplot/bin/python tests/relplot_reference.py

The inputs are rebuilt by ``reference_cases`` below, which the test imports, so both sides read the same arrays.
"""

from __future__ import annotations

import json

import numpy as np


def reference_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Named (confidence, correct) arrays: small and larger samples, over- and under-confident, ties, extremes."""
    rng = np.random.default_rng(20231)
    cases = {}
    for name, n, bias in [("small_calibrated", 40, 0.0), ("overconfident", 500, 0.2),
                          ("underconfident", 3000, -0.15), ("large_nearly_calibrated", 50000, 0.01)]:
        f = rng.uniform(0, 1, n)
        cases[name] = (f, (rng.uniform(0, 1, n) < np.clip(f - bias, 0, 1)).astype(float))
    f = np.round(rng.beta(5, 1.5, 2000), 2)  # ties and mass near 1, as rounded LM confidences
    cases["ties_near_one"] = (f, (rng.uniform(0, 1, f.size) < f ** 2).astype(float))
    f = np.concatenate([np.zeros(30), np.ones(70)])  # confidences at the ends of [0, 1]
    cases["endpoints"] = (f, np.concatenate([np.zeros(25), np.ones(5), np.ones(60), np.zeros(10)]))
    return cases


MESH_POINTS = [0, 20, 60, 100, 140, 180, 199]  # of relplot's 200-point mesh


def main() -> None:
    import relplot
    from relplot.diagrams import prepare_rel_diagram
    from relplot.estimators import KernelSmoother
    from relplot.kernels import ReflectedGaussianKernel

    out = {}
    for name, (f, y) in reference_cases().items():
        value, width = relplot.smECE(f, y, return_width=True)
        mesh = np.linspace(0, 1, 200)
        curve = KernelSmoother(ReflectedGaussianKernel(width)).fit(f.reshape(-1, 1), y).predict(mesh.reshape(-1, 1))
        density = prepare_rel_diagram(f, y, plot_confidence_band=False)["density"]
        out[name] = {"smooth_ece": float(value), "width": float(width),
                     "smooth_ece_at_0.05": float(relplot.smECE_sigma(f, y, 0.05)),
                     "curve": {str(i): float(curve[i]) for i in MESH_POINTS},
                     "density": {str(i): float(density[i]) for i in MESH_POINTS}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
