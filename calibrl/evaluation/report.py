"""Markdown report for ``calibrl eval``: inputs, then per scope (overall, each benchmark) tables with one column per
input file (side by side) and the figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["markdown_table", "render_eval_report"]

# (key in the metrics dict, row label)
_ROWS = [
    ("n_samples", "samples"),
    ("n_prompts", "prompts"),
    ("confidence", "confidence input"),
    ("accuracy", "accuracy (mean@k)"),
    ("pass@1", "pass@1"),
    ("auroc", "AUROC (pooled)"),
    ("per_prompt_auroc", "AUROC (mean per prompt)"),
    ("ece", "ECE (uniform bins)"),
    ("ece_quantile", "ECE (equal-count bins)"),
    ("mce", "MCE"),
    ("brier", "Brier"),
    ("nll", "NLL"),
    ("aurc", "AURC (lower is better)"),
    ("mean_confidence", "mean confidence"),
]
_POSTHOC_ROWS = ["auroc", "ece", "ece_quantile", "brier", "nll", "aurc"]


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, Mapping) and "mean" in value:
        return f"{_fmt(value['mean'])} ({value['n_prompts']} prompts)"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; cells are formatted with 4 decimals for floats."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(c if isinstance(c, str) else _fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _with_ci(metrics: Mapping[str, Any], key: str) -> str:
    text = _fmt(metrics.get(key))
    ci = metrics.get("bootstrap", {}).get(key)
    if ci and None not in ci:
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


def _sources_section(by_label: Mapping[str, Mapping[str, Any]], labels: Sequence[str]) -> list[str]:
    """The confidence sources of each input side by side, when some input has more than one."""
    if not any(len(by_label[l].get("confidence_sources") or {}) > 1 for l in labels):
        return []
    rows = []
    for l in labels:
        for kind, m in (by_label[l].get("confidence_sources") or {}).items():
            main = " (main)" if kind == by_label[l].get("confidence") else ""
            rows.append([l, f"`{kind}`{main}", f"{m['n']} ({m['n_excluded']} excluded)", _fmt(m.get("auroc")),
                         _fmt(m.get("ece")), _fmt(m.get("brier")), _fmt(m.get("aurc"))])
    return ["", "Confidence sources side by side, each on the rows that have it (rows without it are excluded):", "",
            markdown_table(["input", "source", "rows", "AUROC", "ECE", "Brier", "AURC"], rows), "",
            "`logprob_mean` is scored as exp(logprob_mean) (AUROC ranks logprob_mean itself); `class_probs` as the "
            "top class probability against whether the top class is the label; the others against `correct`."]


def _abstention_section(by_label: Mapping[str, Mapping[str, Any]], labels: Sequence[str]) -> list[str]:
    """The certified abstention threshold of each input, and a plain sentence when none qualifies."""
    found = [l for l in labels if "abstention" in by_label[l]]
    if not found:
        return []
    first = by_label[found[0]]["abstention"]
    target, delta = first["target_precision"], first["delta"]
    keys = [("confidence", "confidence source"), ("threshold", "threshold (answer when confidence >= it)"),
            ("coverage", "coverage (held-out)"),
            ("precision_heldout", "precision (held-out)"),
            ("calibration_lower_bound", "precision lower bound (calibration)"),
            ("n_calibration_prompts", "calibration prompts"), ("n_heldout_prompts", "held-out prompts")]
    out = ["", f"Abstention: answer only when confidence >= t, with t certified for precision >= {target:g} with "
           f"probability >= {1 - delta:g} (Clopper-Pearson, Bonferroni over a fixed grid of {first.get('grid_size')} "
           "thresholds, one sample per calibration prompt; half of the prompts calibrate, the other half are held "
           "out):", ""]
    out.append(markdown_table(["figure"] + found, [[name] + [_fmt(by_label[l]["abstention"].get(k)) for l in found]
                                                    for k, name in keys]))
    for l in found:
        a = by_label[l]["abstention"]
        if a.get("threshold") is None:
            out += ["", f"**{l}: no threshold satisfies the target.** {a.get('note') or ''}".rstrip()]
        elif a.get("note"):
            out += ["", f"{l}: {a['note']}."]
    return out


def render_eval_report(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]],
    figures: Mapping[str, Sequence[str]],
    *,
    inputs: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
) -> str:
    """Render the report.

    ``results``: ``{scope: {label: metrics dict}}`` (scope "overall" first, then benchmarks);
    ``figures``: ``{scope: [png file names]}``; ``inputs``: one dict per file (label, file, rows, prompts,
    confidence); ``settings``: the command's options, listed at the top.
    """
    out = ["# calibrl eval report", ""]
    out.append("Settings: " + ", ".join(f"`{k}={v}`" for k, v in settings.items()))
    out.append("")
    out.append(markdown_table(["label", "file", "samples", "prompts", "confidence"],
                              [[i["label"], f"`{i['file']}`", i["rows"], i["prompts"], i["confidence"]]
                               for i in inputs]))
    for i in inputs:  # how another tool's file was read (which field gave correctness, ...)
        fmt = i.get("format", "calibrl")
        for note in i.get("notes") or []:
            out += ["", f"{i['label']} ({fmt}): {note}"]
    out.append("")
    for scope, by_label in results.items():
        labels = list(by_label)
        out += [f"## {scope}", ""]
        rows = []
        for key, name in _ROWS:
            if key in ("accuracy", "auroc", "ece"):
                rows.append([name] + [_with_ci(by_label[l], key) for l in labels])
            else:
                rows.append([name] + [_fmt(by_label[l].get(key)) for l in labels])
        passk = sorted({k for l in labels for k in by_label[l] if k.startswith("pass@") and k != "pass@1"})
        rows += [[k] + [_fmt(by_label[l].get(k)) for l in labels] for k in passk]
        out.append(markdown_table(["metric"] + labels, rows))
        if any("bootstrap" in by_label[l] for l in labels):
            b = next(by_label[l]["bootstrap"] for l in labels if "bootstrap" in by_label[l])
            out.append("")
            out.append(f"Brackets: {100 * (1 - b['alpha']):.0f}% prompt-level bootstrap intervals "
                       f"({b['n_boot']} resamples of prompts).")
        if any("precision_at_coverage" in by_label[l] for l in labels):  # inputs with a confidence
            cov_rows = []
            for c in ("0.1", "0.2", "0.5", "0.8", "1.0"):
                cov_rows.append([c] + [_fmt(by_label[l].get("precision_at_coverage", {}).get(c)) for l in labels])
            out += ["", "Precision when answering only the most confident fraction (coverage):", ""]
            out.append(markdown_table(["coverage"] + labels, cov_rows))
        out += _sources_section(by_label, labels)
        out += _abstention_section(by_label, labels)
        if any("posthoc" in by_label[l] for l in labels):
            method = next(by_label[l]["posthoc"]["method"] for l in labels if "posthoc" in by_label[l])
            out += ["", f"Post-hoc `{method}` calibration, cross-validated out-of-fold (folds split by prompt):", ""]
            out.append(markdown_table(["metric"] + labels, [
                [k] + [_fmt(by_label[l].get("posthoc", {}).get(k)) for l in labels] for k in _POSTHOC_ROWS
            ]))
            out += ["", "The post-hoc AUROC pools out-of-fold values from maps fit on different folds, so it can differ "
                    "from the uncalibrated AUROC even for monotone maps (temperature, Platt); compare discrimination "
                    "with the AUROC above."]
        if any("selection" in by_label[l] for l in labels):
            methods = []
            for l in labels:
                methods += [m for m in by_label[l].get("selection", {}) if m not in methods]
            out += ["", "Answer selection with all N paths per prompt (accuracy; ties split evenly):", ""]
            if methods:
                out.append(markdown_table(["method"] + labels, [
                    [m] + [_fmt(by_label[l].get("selection", {}).get(m)) for l in labels] for m in methods
                ]))
            for l in labels:
                if by_label[l].get("scaling_note"):
                    out += ["", f"Note for {l}: {by_label[l]['scaling_note']}."]
                skipped = by_label[l].get("selection_skipped") or {}
                for why in dict.fromkeys(skipped.values()):
                    names = ", ".join(m for m, w in skipped.items() if w == why)
                    out += ["", f"Not run for {l}: {names} ({why}; these methods need it on every path)."]
        if figures.get(scope):
            out.append("")
            out += [f"![{name}]({name})" for name in figures[scope]]
        out.append("")
    return "\n".join(out)
