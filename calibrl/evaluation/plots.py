"""PNG figures for calibration reports: reliability diagram, precision-coverage, ROC, scaling and training curves.

Every function draws on a bare :class:`matplotlib.figure.Figure` (no pyplot, no global backend switch), so it is
safe in scripts, notebooks and worker processes alike, and writes one PNG to ``path``, returning it as a Path.

Several series can share one figure: pass a mapping ``{label: (confidence, correct)}`` (e.g. one entry per input
file, labelled by the file's stem); a bare ``(confidence, correct)`` tuple draws a single unlabelled series.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from matplotlib.text import Text

from calibrl.evaluation.styles import SELECTION_NAMES, series_style
from calibrl.metrics.registry import metric as _declared_metric

__all__ = [
    "metric_labels",
    "plot_precision_coverage",
    "plot_reliability",
    "plot_roc",
    "plot_scaling_curves",
    "plot_smooth_reliability",
    "plot_metric_paths",
    "plot_training_curves",
    "thin_curve",
]

_DPI = 110
THIN_BIN = 20  # reliability points from fewer samples are drawn hollow: a bin's accuracy is then +-0.2 or worse
_LINESTYLES = ("-", "--", ":", "-.")
# per series (calibrl.evaluation.styles): a marker and line style as well as a colour, so lines lying on top of
# each other stay visible, and the same ones for the same method in every figure

def metric_labels(key: str) -> tuple[str, str, bool | None]:
    """(panel title, y-axis label, higher is better? None: neither) of a declared metric (its name, an alias or a
    prefixed key: :func:`calibrl.metrics.metric`); the key itself and no direction for any other logged value."""
    try:
        m = _declared_metric(key)
    except KeyError:
        return key, key, None
    return m.title, m.axis, m.higher


def _series(data: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Normalise ``{label: (confidence, correct)}`` or a bare ``(confidence, correct)`` pair to a dict."""
    if isinstance(data, Mapping):
        items = data.items()
    else:
        items = [("", data)]
    out = {}
    for label, (confidence, correct) in items:
        out[str(label)] = (np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=bool))
    if not out:
        raise ValueError("nothing to plot: no series given")
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate (an undecodable file name byte) has no glyph


def _save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG. Every text is drawn as it is written: labels and titles carry users' file and
    benchmark names, where ``$`` or ``\\`` would otherwise start TeX math (``x$\\bad$`` cannot be parsed) and a lone
    surrogate cannot be drawn (it is shown as U+FFFD)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for text in fig.findobj(Text):
        text.set_usetex(False)
        text.set_parse_math(False)
        if _SURROGATE.search(text.get_text()):
            text.set_text(_SURROGATE.sub("\ufffd", text.get_text()))
    with rc_context({"text.usetex": False, "text.parse_math": False}):  # tick labels are made while drawing
        fig.savefig(path, dpi=_DPI, bbox_inches="tight")
    return path


def _legend(ax) -> None:
    """The axes' legend in a row below the figure (needs ``layout="constrained"``), where it covers no data."""
    handles, labels = ax.get_legend_handles_labels()
    if any(labels):
        ax.figure.legend(handles, labels, fontsize="small", loc="outside lower center",
                         ncols=2 if len(labels) > 4 else 1, frameon=False)


def plot_reliability(
    data: Any,
    path: str | Path,
    *,
    n_bins: int = 10,
    strategy: str = "uniform",
    title: str | None = None,
) -> Path:
    """Reliability diagram over a histogram of confidence.

    One series: accuracy per bin as bars, the gap to the bin's mean confidence shaded in red, the diagonal of
    perfect calibration, ECE in the legend. Several series: one line of (mean confidence, accuracy) points per
    series over its non-empty bins, and step histograms below, so files can be compared on one figure.
    Bins come from :func:`calibrl.metrics.reliability_bins` (same binning as the reported ECE).
    """
    from calibrl.metrics import ece, reliability_bins

    series = _series(data)
    fig = Figure(figsize=(5.2, 6.6), layout="constrained")
    ax, hist_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], color="0.5", linestyle="--", linewidth=1, label="perfect calibration")
    single = len(series) == 1
    for i, (label, (conf, correct)) in enumerate(series.items()):
        style = series_style(label, i)
        color = style.color
        bins = reliability_bins(conf, correct, n_bins=n_bins, strategy=strategy)
        edges = np.asarray(bins.edges, dtype=np.float64)
        counts = np.asarray(bins.counts)
        acc = np.asarray(bins.accuracy, dtype=np.float64)
        mean_conf = np.asarray(bins.mean_confidence, dtype=np.float64)
        filled = counts > 0
        value = ece(conf, correct, n_bins=n_bins, strategy=strategy)
        name = f"{label} (ECE {value:.3f})" if label else f"ECE {value:.3f}"
        if single:
            left, width = edges[:-1][filled], np.diff(edges)[filled]
            ax.bar(left, acc[filled], width=width, align="edge", color=color, alpha=0.75, edgecolor="white",
                   label=f"accuracy in the bin: {name}")
            gap_low = np.minimum(acc[filled], mean_conf[filled])
            ax.bar(left, np.abs(mean_conf[filled] - acc[filled]), bottom=gap_low, width=width, align="edge",
                   color="tab:red", alpha=0.35, hatch="//", edgecolor="tab:red", label="gap to mean confidence")
        else:
            ax.plot(mean_conf[filled], acc[filled], color=color, linestyle=style.linestyle, label=name)
            # a bin's accuracy is resolved to about +-0.2 with fewer than THIN_BIN samples: its point is hollow
            for thin in (False, True):
                keep = filled & ((counts < THIN_BIN) == thin)
                ax.plot(mean_conf[keep], acc[keep], linestyle="none", marker=style.marker, color=color,
                        markeredgewidth=1.3, markerfacecolor="none" if thin else color)
        hist_ax.hist(conf, bins=edges if strategy == "uniform" else np.linspace(0, 1, n_bins + 1),
                     histtype="stepfilled" if single else "step", color=color, alpha=0.6 if single else 1.0,
                     linewidth=1.5, linestyle="-" if single else style.linestyle)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy in the bin")
    note = "closer to the diagonal is better"
    if not single:
        note += f"; hollow: bins of fewer than {THIN_BIN} samples"
    ax.set_title((title or f"Reliability ({n_bins} {strategy} bins)") + f"\n({note})", fontsize="medium")
    ax.grid(alpha=0.3)
    _legend(ax)
    hist_ax.set_xlabel("confidence")
    hist_ax.set_ylabel("count")
    return _save(fig, path)


def plot_smooth_reliability(data: Any, path: str | Path, *, title: str | None = None) -> Path:
    """Smoothed reliability diagram (Blasiok & Nakkiran 2023; relplot's): per series the outcomes kernel-smoothed
    over confidence at the smooth-ECE bandwidth (:func:`calibrl.metrics.smooth_reliability`), drawn where the
    confidences have density, with the smooth ECE in the legend, and the density of the confidences below. The
    companion of :func:`plot_reliability`, with no bins to choose."""
    from calibrl.metrics import smooth_reliability

    series = _series(data)
    fig = Figure(figsize=(5.2, 6.6), layout="constrained")
    ax, dens_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], color="0.5", linestyle="--", linewidth=1, label="perfect calibration")
    for i, (label, (conf, correct)) in enumerate(series.items()):
        style = series_style(label, i)
        curve = smooth_reliability(conf, correct)
        name = f"smooth ECE {curve.smooth_ece:.3f}, bandwidth {curve.width:.3f}"
        # where almost no confidence lies the smoothed accuracy is an extrapolation: drawn faint
        seen = curve.density >= 0.02 * curve.density.max()
        ax.plot(curve.mesh, np.where(seen, curve.accuracy, np.nan), color=style.color, linestyle=style.linestyle,
                linewidth=2, label=f"{label} ({name})" if label else name)
        ax.plot(curve.mesh, curve.accuracy, color=style.color, linestyle=style.linestyle, linewidth=0.8, alpha=0.35)
        dens_ax.plot(curve.mesh, curve.density, color=style.color, linestyle=style.linestyle, linewidth=1.5)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy (kernel-smoothed)")
    ax.set_title((title or "Smoothed reliability") + "\n(closer to the diagonal is better; no bins; faint: "
                 "little data)", fontsize="medium")
    ax.grid(alpha=0.3)
    _legend(ax)
    dens_ax.set_xlabel("confidence")
    dens_ax.set_ylabel("density")
    dens_ax.set_ylim(bottom=0)
    return _save(fig, path)


def plot_precision_coverage(data: Any, path: str | Path, *, title: str | None = None,
                            certified: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    """Precision of the answers kept vs coverage when abstaining on the least confident (one line per series).

    ``certified``: ``{label: abstention dict}`` (the ``abstention`` entry of ``calibrl eval``'s metrics: threshold,
    target_precision, delta); each certified threshold t is marked with an x on its series' curve, at the coverage
    and precision of ``confidence >= t`` on the plotted samples, with its target as a dashed line."""
    from calibrl.metrics import aurc, precision_coverage

    series = _series(data)
    fig = Figure(figsize=(5.2, 4.6), layout="constrained")
    ax = fig.subplots()
    for i, (label, (conf, correct)) in enumerate(series.items()):
        coverage, precision = precision_coverage(conf, correct)
        name = f"{label} (AURC {aurc(conf, correct):.3f})" if label else f"AURC {aurc(conf, correct):.3f}"
        style = series_style(label, i)
        ax.plot(coverage, precision, color=style.color, linestyle=style.linestyle, label=name)
        ax.axhline(float(np.mean(correct)), color=style.color, linestyle=":", linewidth=0.8)
        a = (certified or {}).get(label)
        if a and a.get("threshold") is not None:
            kept = conf >= a["threshold"]
            if kept.any():
                ax.plot([kept.mean()], [correct[kept].mean()], marker="x", markersize=10, markeredgewidth=2,
                        color=style.color, linestyle="none",
                        label=f"{label + ': ' if label else ''}certified t = {a['threshold']:g} (precision >= "
                              f"{a['target_precision']:g} w.p. >= {1 - a['delta']:g})")
            ax.axhline(a["target_precision"], color=style.color, linestyle="--", linewidth=0.8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("coverage (fraction answered)")
    ax.set_ylabel("precision of answered")
    marked = any(a and a.get("threshold") is not None for a in (certified or {}).values())
    ax.set_title((title or "Precision vs coverage") + "\n(higher is better; dotted: accuracy at full coverage; "
                 + ("dashed: certified target; " if marked else "") + "AURC: lower is better)", fontsize="medium")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


_CURVE_STEP = 1e-3  # a drawn curve's vertices at least this far apart (|dx| + |dy|, axis units): under 0.5 px


def thin_curve(x: np.ndarray, y: np.ndarray, *, step: float = _CURVE_STEP) -> np.ndarray:
    """Indices of the vertices of the polyline (``x``, ``y``) [K] to draw: the first vertex after each ``step`` of
    path length (|dx| + |dy|) and the last one, so no dropped vertex lies more than ``step`` from the drawn line
    (a 200,000-sample ROC curve has ~100,000 vertices; drawing them all took seconds for no visible change)."""
    length = np.concatenate(([0.0], np.cumsum(np.abs(np.diff(x)) + np.abs(np.diff(y)))))
    _, first = np.unique(np.floor(length / step), return_index=True)
    return np.union1d(first, [len(x) - 1])


def plot_roc(data: Any, path: str | Path, *, title: str | None = None) -> Path:
    """ROC curve of confidence as a detector of correct answers (one line per series, AUROC in the legend)."""
    from calibrl.metrics import auroc, roc_curve

    series = _series(data)
    fig = Figure(figsize=(4.8, 5.0), layout="constrained")
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="0.5", linestyle="--", linewidth=1, label="chance (AUROC 0.5)")
    for i, (label, (conf, correct)) in enumerate(series.items()):
        if correct.all() or not correct.any():
            continue  # ROC undefined with one class
        fpr, tpr, _ = roc_curve(conf, correct)
        value = auroc(conf, correct)
        keep = thin_curve(fpr, tpr)
        ax.plot(fpr[keep], tpr[keep], color=series_style(label, i).color, linestyle=series_style(label, i).linestyle,
                label=f"{label} (AUROC {value:.3f})" if label else f"AUROC {value:.3f}")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("false positive rate (wrong answers accepted)")
    ax.set_ylabel("true positive rate (right answers accepted)")
    ax.set_title((title or "ROC of confidence vs correctness") + "\n(further above the diagonal is better)",
                 fontsize="medium")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def dodge_step(*, octaves: float, n_series: int) -> float:
    """Sideways offset between neighbouring series on a log2 N axis, in octaves (log2 units).

    ``step = min(0.015 * max(octaves, 1), 0.2 / (n_series - 1))``: about 1.5% of the axis width, so points of
    series with equal values sit side by side, and all series together within 0.2 octave (a factor 1.15 in N,
    well inside the gap to the next power of 2); 0 for a single series. Series ``i`` of ``n`` is drawn at
    ``N * 2 ** ((i - (n - 1) / 2) * step)``."""
    if n_series < 2:
        return 0.0
    return min(0.015 * max(float(octaves), 1.0), 0.2 / (n_series - 1))


def plot_scaling_curves(
    curves: Mapping[str, Mapping[str, Any]] | Mapping[str, Any],
    path: str | Path,
    *,
    title: str | None = None,
) -> Path:
    """Accuracy vs number of sampled paths N, one line per selection method.

    ``curves`` is ``{method: curve}`` for one input, or ``{label: {method: curve}}`` to overlay several inputs
    (colour = method, line style = input). A curve is a :class:`calibrl.selection.ScalingCurve` or any object or
    mapping with ``ns`` and ``accuracy`` (and optionally ``std``, shaded as +-1 std over random draws).
    """

    def fields(curve):
        get = curve.get if isinstance(curve, Mapping) else lambda k, d=None: getattr(curve, k, d)
        return np.asarray(get("ns")), np.asarray(get("accuracy"), dtype=np.float64), get("std", None)

    first = next(iter(curves.values()), None)
    nested = isinstance(first, Mapping) and not {"ns", "accuracy"} <= set(first)
    groups = curves if nested else {"": curves}
    fig = Figure(figsize=(5.6, 4.8), layout="constrained")
    ax = fig.subplots()
    methods: list[str] = []
    for group in groups.values():
        methods += [m for m in group if m not in methods]
    n_series = sum(len(group) for group in groups.values())
    all_ns = [float(n) for group in groups.values() for curve in group.values() for n in fields(curve)[0]]
    octaves = np.log2(max(all_ns) / min(all_ns)) if all_ns and min(all_ns) > 0 else 0.0
    step = dodge_step(octaves=octaves, n_series=n_series)
    banded = False
    for g, (label, group) in enumerate(groups.items()):
        for method, curve in group.items():
            ns, acc, std = fields(curve)
            style = series_style(method, methods.index(method))
            color = style.color
            readable = SELECTION_NAMES.get(method, method)
            name = f"{readable} [{label}]" if label else readable
            # methods often coincide (all at N = 1, votes that agree): each series sits a little to the side
            i = g * len(methods) + methods.index(method)
            xs = np.asarray(ns, dtype=np.float64) * 2.0 ** ((i - (n_series - 1) / 2) * step)
            # colour and marker = method, line style = method (one input) or input (several)
            ax.plot(xs, acc, marker=style.marker, markersize=5, markerfacecolor="none", color=color,
                    linestyle=style.linestyle if len(groups) == 1 else _LINESTYLES[g % len(_LINESTYLES)],
                    label=name)
            if std is not None and len(groups) == 1:
                std = np.asarray(std, dtype=np.float64)
                ax.fill_between(xs, acc - std, acc + std, color=color, alpha=0.12, linewidth=0)
                banded = banded or bool(np.any(std > 0))
    ax.set_xscale("log", base=2)
    # ticks at the Ns drawn, labelled as plain numbers: the log axis's default labels are TeX (2^{k}), which
    # _save draws as plain text
    ns_drawn = sorted({n for n in all_ns if n > 0})
    ax.xaxis.set_major_locator(FixedLocator(ns_drawn))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("N sampled paths per prompt" + (" (methods drawn slightly apart at each N)" if n_series > 1 else ""))
    ax.set_ylabel("accuracy of the selected answer")
    note = "higher is better; bands: ±1 std over random draws of N paths" if banded else "higher is better"
    ax.set_title((title or "Inference-time scaling") + f"\n({note})", fontsize="medium")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def plot_training_curves(
    history: Mapping[str, Sequence[Mapping[str, Any]]],
    metrics: Sequence[str] = ("auroc", "ece", "accuracy"),
    path: str | Path | None = None,
) -> Path:
    """Metrics over training steps, one panel per metric and one line per method.

    ``history`` maps a method name to a list of records ``{"step": int, "<metric>": float, ...}``. Records
    sharing a step (e.g. several seeds) are averaged and their min-max range shaded. Missing or None values
    are skipped; a metric no method reports is drawn as an empty panel with a note. A method with values at one
    step only (an evaluation-only baseline such as the warm start) is a marker at that step and a dotted
    horizontal reference line. Declared metrics (:func:`metric_labels`) get a readable title, a y label and which
    direction is better; each method has its own colour, marker and line style; one legend for all panels sits
    below them. A method whose every curve lies on an earlier method's (within 1.5% of each panel's range) is drawn a
    little to the side, and its legend entry says whose curves it lies on.
    """
    if path is None:
        raise TypeError("plot_training_curves() needs path= (where to write the PNG)")
    metrics = list(metrics)
    fig = Figure(figsize=(4.2 * len(metrics), 4.0), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(metrics)))
    handles: dict[str, Any] = {}

    def series(records, metric: str) -> dict[float, list[float]]:
        by_step: dict[float, list[float]] = {}
        for rec in records:
            value = rec.get(metric)
            if value is None or rec.get("step") is None:
                continue
            value = float(value)
            if np.isfinite(value):
                by_step.setdefault(float(rec["step"]), []).append(value)
        return by_step

    # a method whose every curve lies on an earlier method's (within 1.5% of a panel's range, a marker, at every step: GCPO
    # whose scale stays near 1, say) would hide it: it is drawn a little to the side and its legend says so
    same_as: dict[str, str] = {}
    curves = {m: [series(r, metric) for metric in metrics] for m, r in history.items()}
    ranges = []
    for k in range(len(metrics)):
        values = [np.mean(v) for c in curves.values() for v in c[k].values()]
        ranges.append(max(values) - min(values) if values else 0.0)

    def on_top(a: dict, b: dict, scale: float) -> bool:
        return a.keys() == b.keys() and all(abs(np.mean(a[s]) - np.mean(b[s])) <= 0.015 * scale for s in a)

    for j, method in enumerate(curves):
        for earlier in list(curves)[:j]:
            pairs = list(zip(curves[method], curves[earlier]))
            if earlier not in same_as and max(len(a) for a, _ in pairs) > 1 and all(
                    on_top(a, b, r) for (a, b), r in zip(pairs, ranges)):
                same_as[method] = earlier
                break
    all_steps = [k for c in curves.values() for by_step in c for k in by_step]
    span = (max(all_steps) - min(all_steps)) if all_steps else 0.0
    for ax, metric in zip(axes, metrics):
        drawn = False
        for i, (method, records) in enumerate(history.items()):
            by_step = curves[method][metrics.index(metric)]
            if not by_step:
                continue
            steps = np.array(sorted(by_step))
            vals = [np.asarray(by_step[s]) for s in steps]
            mean = np.array([v.mean() for v in vals])
            style = series_style(method, i)
            if method in same_as:
                steps = steps + 0.012 * span  # beside the curve it equals
            label = (f"{method} (on {same_as[method]}'s curves: drawn beside them)" if method in same_as else method)
            color, marker = style.color, style.marker
            if len(steps) == 1:
                # one evaluation (a baseline): a reference line across the panel, marked where it was measured
                ax.axhline(mean[0], color=color, linestyle=":", linewidth=1.2, zorder=1)
                (line,) = ax.plot(steps, mean, color=color, marker=marker, markersize=7, linestyle=":",
                                  label=label, zorder=3)
            else:
                (line,) = ax.plot(steps, mean, color=color, marker=marker if len(steps) < 30 else None,
                                  markersize=5, markerfacecolor="none", markeredgewidth=1.3,
                                  linestyle=style.linestyle, linewidth=1.6, label=label)
            handles.setdefault(label, line)
            if any(len(v) > 1 for v in vals):
                ax.fill_between(steps, [v.min() for v in vals], [v.max() for v in vals], color=color, alpha=0.15,
                                linewidth=0)
            drawn = True
        title, ylabel, higher = metric_labels(metric)
        if higher is not None:
            title += f"\n({'higher' if higher else 'lower'} is better)"
        ax.set_title(title, fontsize="medium")
        ax.set_ylabel(ylabel)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, f"no '{metric}' values", ha="center", va="center", transform=ax.transAxes)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncols=min(len(handles), 3 if max(map(len, handles)) > 24 else 5), fontsize="small",
                   frameon=False)  # long labels in fewer columns, so the legend is no wider than the panels
    return _save(fig, path)


def plot_metric_paths(
    history: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    x: str,
    y: str | Sequence[str],
    path: str | Path,
    references: Mapping[str, tuple[Sequence[float], Sequence[float], str]] | None = None,
    title: str | None = None,
) -> Path:
    """Each method's path over training in the plane of two metrics (e.g. accuracy and AUROC), one panel per ``y``.

    ``history`` as :func:`plot_training_curves` (``{method: records}``, records with ``step``; records sharing a
    step, e.g. several seeds, are averaged); each method is one line through its evaluations in step order, its
    last evaluation circled. ``references``: ``{y_key: (xs, ys, label)}``, a reference curve drawn dashed in the
    panel of ``y_key`` (e.g. the ideal sampler's frontier). Reading: at equal ``x``, the better ``y`` is the better
    trade-off, whatever step each method stopped at.
    """
    ys = [y] if isinstance(y, str) else list(y)
    fig = Figure(figsize=(5.2 * len(ys), 4.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(ys)))
    handles: dict[str, Any] = {}
    for ax, key in zip(axes, ys):
        for i, (method, records) in enumerate(history.items()):
            by_step: dict[float, list[tuple[float, float]]] = {}
            for rec in records:
                if rec.get("step") is None or rec.get(x) is None or rec.get(key) is None:
                    continue
                point = (float(rec[x]), float(rec[key]))
                if all(np.isfinite(point)):
                    by_step.setdefault(float(rec["step"]), []).append(point)
            if not by_step:
                continue
            pts = np.array([np.mean(by_step[s], axis=0) for s in sorted(by_step)])
            style = series_style(method, i)
            color = style.color
            (line,) = ax.plot(pts[:, 0], pts[:, 1], markersize=4, markerfacecolor="none", label=method,
                              **style.kwargs())
            ax.plot(pts[-1:, 0], pts[-1:, 1], "o", color=color, markersize=9, markerfacecolor="none")
            handles.setdefault(method, line)
        if references and key in references:
            ref_x, ref_y, label = references[key]
            (line,) = ax.plot(ref_x, ref_y, color="black", linestyle="--", linewidth=1.2, label=label)
            handles.setdefault(label, line)
        x_title = metric_labels(x)[0]
        y_title, y_label, higher = metric_labels(key)
        x_short = x_title.split(" (")[0].lower()
        hint = "" if higher is None else f"\n({'higher' if higher else 'lower'} is better at equal {x_short})"
        ax.set_title(f"{y_title} against {x_title.lower()}{hint}", fontsize="medium")
        ax.set_xlabel(x_title)
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    if handles:
        from matplotlib.lines import Line2D

        handles["each method's last evaluation"] = Line2D([], [], marker="o", color="black", markersize=9,
                                                          markerfacecolor="none", linestyle="none")
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(len(handles), 3),
                   fontsize="small", frameon=False)
    return _save(fig, path)
