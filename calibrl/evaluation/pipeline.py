"""``calibrl eval`` from loaded samples to a report folder: every scope's metrics, the figures, metrics.json and
report.md.

A scope is the whole of an input ("overall") or one of its benchmarks (the ``benchmark`` field); each scope is
scored per input (:func:`calibrl.evaluation.scoring.evaluate_samples`) and its figures overlay all inputs, so
several files are compared side by side. An input of a single benchmark is scored once: that benchmark's scope
holds the very results of "overall" (metrics.json lists both; the report and the figures show it once). Answers
are clustered once per input (:func:`calibrl.selection.answer_clusters`) and the clusters are cut per benchmark.
The command line (:mod:`calibrl.cli.eval`) reads and validates the inputs, chooses the folder and shows progress;
this module only computes and writes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from calibrl.evaluation.plots import (
    plot_precision_coverage,
    plot_reliability,
    plot_roc,
    plot_scaling_curves,
    plot_smooth_reliability,
)
from calibrl.evaluation.report import render_eval_report
from calibrl.evaluation.samples import Samples
from calibrl.evaluation.scoring import ScopeResult, evaluate_samples
from calibrl.evaluation.settings import EvalSettings
from calibrl.selection import answer_clusters

__all__ = ["SCOPE_OVERALL", "write_eval_report"]

SCOPE_OVERALL = "overall"


_MAX_STEM = 64  # figure names stay far below file systems' 255-byte limit: stem + "_reliability_temperature.png"


def _safe(name: str) -> str:
    """A file-name stem for scope ``name``: runs of other characters than letters, digits, ``_ . -`` become ``_``;
    a stem longer than 64 characters is cut to its first 55 and a hash of the whole name (``<head>-<8 hex>``), so
    long benchmark names give short, still distinct names."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "scope"
    if len(stem) > _MAX_STEM:
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        stem = f"{stem[:_MAX_STEM - 9]}-{digest}"
    return stem


def _scope_name(bench: str) -> str:
    """The scope of benchmark ``bench`` ("overall" stays unique)."""
    return bench if bench != SCOPE_OVERALL else f"benchmark {bench}"


def _scope_parts(samples: Samples, ids) -> list[tuple[str, Samples, Any]]:
    """(scope, samples, answer clusters) of the whole input and of each of its benchmarks; an input of one
    benchmark has the overall part only (that benchmark's scope is the same samples, see :func:`_score_inputs`)."""
    parts = [(SCOPE_OVERALL, samples, ids)]
    if samples.benchmarks is not None:
        benches = sorted(set(samples.benchmarks.tolist()))
        for bench in benches if len(benches) > 1 else []:
            mask = samples.benchmarks == bench
            parts.append((_scope_name(bench), samples.subset(mask), None if ids is None else ids[mask]))
    return parts


def _single_benchmark(samples: Samples) -> str | None:
    """The scope of the input's one benchmark, or None (no ``benchmark`` field, or several values)."""
    if samples.benchmarks is None or len(samples.benchmarks) == 0:
        return None
    benches = set(samples.benchmarks.tolist())
    return _scope_name(benches.pop()) if len(benches) == 1 else None


def _score_inputs(loaded: Sequence[Samples], labels: Sequence[str], settings: EvalSettings, *, step,
                  track) -> dict[str, dict[str, ScopeResult]]:
    """``{scope: {label: ScopeResult}}`` of every input, scope "overall" first."""
    scoped: dict[str, dict[str, ScopeResult]] = {}
    for samples, label in zip(loaded, labels):
        ids = None
        if samples.answers is not None:  # selection and the answer-agreement confidences
            step(f"{label}: clustering answers" + (" (math-verify)" if settings.math_verify else ""))
            ids = answer_clusters(samples.answers, samples.prompt_index, use_math_verify=settings.math_verify,
                                  progress=track)
        for scope, part, part_ids in _scope_parts(samples, ids):
            step(f"{label}/{scope}: metrics")
            scoped.setdefault(scope, {})[label] = evaluate_samples(part, label=label, scope=scope, answer_ids=part_ids,
                                                                   settings=settings, step=step)
        single = _single_benchmark(samples)
        if single is not None:  # the benchmark's scope is every sample: the same figures, scored once
            scoped.setdefault(single, {})[label] = scoped[SCOPE_OVERALL][label]
    return scoped


def _repeats_overall(scoped: dict[str, dict[str, ScopeResult]]) -> list[str]:
    """The benchmark scopes that are "overall" itself: every input of the report is that one benchmark (one
    scope, the very results of "overall" for every input)."""
    overall = scoped.get(SCOPE_OVERALL, {})
    return [scope for scope, by_label in scoped.items() if scope != SCOPE_OVERALL and list(by_label) == list(overall)
            and all(by_label[lab] is overall[lab] for lab in overall)]


def _figure_base(scope: str, taken: set[str], n_scopes: int) -> str:
    """File-name stem of a scope's figures, unique (case-insensitively) among ``taken``, which it joins."""
    base = _safe(scope)
    if base.lower() in taken:  # "a/b" and "a b" both read a_b: keep every scope's figures
        base = next(f"{base}_{i}" for i in range(2, n_scopes + 2) if f"{base}_{i}".lower() not in taken)
    taken.add(base.lower())
    return base


def _scope_figures(scope: str, by_label: dict[str, ScopeResult], folder: Path, base: str, *, n_bins: int,
                   posthoc: str | None) -> list[str]:
    """Draw one scope's figures into ``folder``; returns their file names."""
    names: list[str] = []
    series = {lab: (r.confidence, r.target) for lab, r in by_label.items() if r.confidence is not None}
    if series:  # inputs without a confidence have no confidence figures
        names += [f"{base}_reliability.png", f"{base}_reliability_smooth.png", f"{base}_roc.png",
                  f"{base}_precision_coverage.png"]
        plot_reliability(series, folder / names[0], n_bins=n_bins, title=f"Reliability: {scope}")
        plot_smooth_reliability(series, folder / names[1], title=f"Smoothed reliability: {scope}")
        plot_roc(series, folder / names[2], title=f"ROC: {scope}")
        certified = {lab: r.metrics["abstention"] for lab, r in by_label.items() if "abstention" in r.metrics}
        plot_precision_coverage(series, folder / names[3], title=f"Precision vs coverage: {scope}",
                                certified=certified or None)
    if posthoc and any(r.posthoc_confidence is not None for r in by_label.values()):
        names.append(f"{base}_reliability_{posthoc}.png")
        plot_reliability({lab: (r.posthoc_confidence, r.target) for lab, r in by_label.items()
                          if r.posthoc_confidence is not None}, folder / names[-1], n_bins=n_bins,
                         title=f"Reliability after {posthoc} (out-of-fold): {scope}")
    if any(len(r.sources) > 1 for r in by_label.values()):  # several confidence sources: one curve per source
        several_inputs = len(by_label) > 1
        names.append(f"{base}_reliability_sources.png")
        plot_reliability({(f"{lab}: {kind}" if several_inputs else kind): arrays for lab, r in by_label.items()
                          for kind, arrays in r.sources.items()}, folder / names[-1], n_bins=n_bins,
                         title=f"Reliability per confidence source: {scope}")
    curves = {lab: r.curves for lab, r in by_label.items() if r.curves}
    if curves:
        names.append(f"{base}_scaling.png")
        plot_scaling_curves(curves if len(curves) > 1 else next(iter(curves.values())), folder / names[-1],
                            title=f"Accuracy vs N: {scope}")
    return names


def write_eval_report(
    folder: Path,
    loaded: Sequence[Samples],
    *,
    labels: Sequence[str],
    files: Sequence[Path],
    settings: EvalSettings,
    step: Callable[[str], Any] | None = None,
    track: Callable[[Iterable, int], Iterable] | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Score every input (``loaded``, labelled ``labels``, read from ``files``) per scope under ``settings`` and
    write the PNG figures, ``metrics.json`` and ``report.md`` into the existing ``folder``; returns
    ``{scope: {label: metrics}}``.

    ``step(description)`` is called before each slow stage and ``track(iterable, total)`` wraps answer
    clustering's loop over prompts (progress reporting; both optional). ``settings`` are written as they are to
    metrics.json and listed in report.md.
    """
    from threadpoolctl import threadpool_limits

    step = step or (lambda _desc: None)
    # one BLAS thread while scoring: its matrix products are small (a chunk of bootstrap replicates by the prompts)
    # and OpenBLAS's threads spin between them; with two, 200,000 samples took as long alone (and 2.6 s more CPU)
    # and 8.5-9.3 s against 7.3-7.6 s beside another busy process (2026-11-30, 2 cores). The products' last digits
    # no longer follow the number of cores (split between threads they did; OpenBLAS's kernels, picked by the
    # processor's kind, still set them)
    with threadpool_limits(limits=1, user_api="blas"):
        scoped = _score_inputs(loaded, labels, settings, step=step, track=track or False)
    figures: dict[str, list[str]] = {}
    taken: set[str] = set()
    repeats = _repeats_overall(scoped)
    for scope, by_label in scoped.items():
        if scope in repeats:  # the same samples as "overall": its figures are overall's
            figures[scope] = figures[SCOPE_OVERALL]
            continue
        if not settings.figures:
            figures[scope] = []
            continue
        step(f"{scope}: figures")
        base = _figure_base(scope, taken, len(scoped))
        shown = f"{scope} (= {', '.join(repeats)})" if scope == SCOPE_OVERALL and repeats else scope
        figures[scope] = _scope_figures(shown, by_label, folder, base, n_bins=settings.n_bins,
                                        posthoc=settings.posthoc)

    metrics = {scope: {lab: r.metrics for lab, r in by_label.items()} for scope, by_label in scoped.items()}
    inputs = [{"label": lab, "file": str(f), "rows": len(s), "prompts": s.n_prompts,
               "confidence": s.confidence_kind, "confidence_sources": s.confidence_sources(), "format": s.format,
               "notes": list(s.notes), "skipped": dict(s.skipped)}
              for s, lab, f in zip(loaded, labels, files)]
    payload = {"inputs": inputs, "settings": settings.to_dict(), "results": metrics, "figures": figures}
    (folder / "metrics.json").write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    # a lone surrogate in a label (an undecodable byte of a file name) is written as its escape, \udcff
    (folder / "report.md").write_text(render_eval_report(metrics, figures, inputs=inputs,
                                                                          settings=settings.to_dict()),
                                      encoding="utf-8", errors="backslashreplace")
    return metrics
