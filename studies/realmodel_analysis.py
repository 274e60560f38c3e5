"""The real-model studies' shared analysis (docs/results/realmodel.md, docs/results/realmodel_powered.md): the
metrics of one held-out evaluation recomputed from its per-sample arrays (:data:`EVALUATION_METRICS`, for
:mod:`calibrl.metrics.paired`'s bootstraps), the matched-accuracy reading of one run against another's path
(:func:`matched_accuracy_rows`, :func:`matched_accuracy_table`) with the AUROC difference's interval, and the
training-log table. Moved out of :mod:`calibrl.testbed.realmodel`, which keeps the runs themselves
(:func:`calibrl.testbed.realmodel.train_real_model`) and the demo's report."""

from __future__ import annotations

from typing import Callable

from calibrl.testbed.realmodel import evaluation_auroc_standard_error


def sequence_ece(confidence, correct) -> float:
    """ECE of the sequence confidence, 10 equal-width bins (the records' ``ece``): ``confidence`` [N] is
    exp(mean token log-prob), ``correct`` [N] 0/1."""
    import numpy as np

    from calibrl import metrics as M

    return float(M.ece(np.asarray(confidence, float), np.asarray(correct, bool), n_bins=10, strategy="uniform"))


def decision_letter_ece(decision_prob, correct) -> float:
    """Decision-letter ECE (the records' ``decision_ece``: equal-count bins, samples that named no letter, nan,
    left out): ``decision_prob`` [N], ``correct`` [N] 0/1."""
    import numpy as np

    from calibrl.trl.telemetry import decision_metrics

    return decision_metrics(np.asarray(decision_prob, float), np.asarray(correct, bool), n_bins=10)["decision_ece"]


def _mean(values) -> float:
    import numpy as np

    return float(np.mean(values))


def _logprob_arrays(s: dict) -> dict:
    import numpy as np

    return {"confidence": np.asarray(s["logprob_mean"], float), "correct": np.asarray(s["correct"])}


def _confidence_arrays(s: dict) -> dict:
    import numpy as np

    return {"confidence": np.exp(np.asarray(s["logprob_mean"], float)), "correct": np.asarray(s["correct"])}


def _decision_arrays(s: dict) -> dict:
    import numpy as np

    return {"decision_prob": np.array([np.nan if p is None else p for p in s["decision_prob"]], dtype=float),
            "correct": np.asarray(s["correct"])}


# name -> (the arrays of one evaluation's samples (its record's "samples") that the metric reads, the metric for
# calibrl.metrics.paired's bootstraps, the record key it reproduces, its direction)
EVALUATION_METRICS: dict[str, tuple[Callable[[dict], dict], object, str, str]] = {
    "accuracy": (lambda s: {"values": _logprob_arrays(s)["correct"]}, _mean, "accuracy", "higher is better"),
    "auroc": (_logprob_arrays, "auroc", "auroc", "higher is better"),
    "ece": (_confidence_arrays, sequence_ece, "ece", "lower is better"),
    "confidence_mean": (lambda s: {"values": _confidence_arrays(s)["confidence"]}, _mean, "confidence_mean",
                        "closer to the accuracy is better"),
    "decision_ece": (_decision_arrays, decision_letter_ece, "decision_ece", "lower is better"),
}


def _number(value) -> float:
    """A record's metric as a float; nan where undefined (a record stores an undefined AUROC as None)."""
    return float(value) if isinstance(value, (int, float)) else float("nan")


PAIRED_INTERVAL = "paired prompt bootstrap"
HANLEY_MCNEIL_INTERVAL = "Hanley-McNeil, samples and evaluations as independent"


def auroc_difference_interval(record: dict, reference: dict, *, n_boot: int = 2000, seed: int = 0,
                              alpha: float = 0.05) -> dict:
    """The AUROC difference ``record - reference`` of two held-out evaluations with its 1 - ``alpha`` interval.

    Both with per-sample arrays (``"samples"``, :func:`with_samples`) on the same prompts: the paired prompt-level
    bootstrap (:func:`calibrl.metrics.paired.paired_bootstrap_difference`, ``n_boot`` replicates: each draws the
    prompts once and scores both evaluations on them). Otherwise (records of runs that kept no samples): the
    older figure, difference +- z * sqrt(SE_1^2 + SE_2^2) with each AUROC's Hanley-McNeil standard error, which
    treats the samples of a prompt and the two evaluations as independent (only a rough scale). Returns
    ``{"difference", "low", "high", "half_width" (Hanley-McNeil only, else nan), "interval"}`` (the method's
    name: :data:`PAIRED_INTERVAL` or :data:`HANLEY_MCNEIL_INTERVAL`); nan where an AUROC is undefined."""
    import math

    from scipy.stats import norm

    a, b = record.get("samples"), reference.get("samples")
    if a and b and set(a["prompt_id"]) == set(b["prompt_id"]):
        from calibrl.metrics.paired import paired_bootstrap_difference

        out = paired_bootstrap_difference("auroc", _logprob_arrays(a), _logprob_arrays(b), prompt_ids_a=a["prompt_id"],
                                          prompt_ids_b=b["prompt_id"], n_boot=n_boot, seed=seed, alpha=alpha)
        return {"difference": out.point, "low": out.low, "high": out.high, "half_width": math.nan,
                "interval": PAIRED_INTERVAL}
    auc, ref_auc = _number(record.get("auroc")), _number(reference.get("auroc"))
    ses = [evaluation_auroc_standard_error(x) for x in (record, reference)]
    z = 1.96 if alpha == 0.05 else float(norm.ppf(1 - alpha / 2))  # 1.96: the figure the documents quote
    half = z * math.sqrt(ses[0] ** 2 + ses[1] ** 2)
    return {"difference": auc - ref_auc, "low": auc - ref_auc - half, "high": auc - ref_auc + half,
            "half_width": half, "interval": HANLEY_MCNEIL_INTERVAL}


def matched_accuracy_rows(runs: dict[str, list[dict]], *, reference: str, tolerance: float = 0.03) -> list[dict]:
    """Each run's evaluations read against the ``reference`` run's at matched held-out accuracy.

    For every evaluation of every other run after its start, the reference run's evaluation (any step, its start
    included) with the nearest accuracy, kept when the accuracies differ by at most ``tolerance``: a method that
    keeps more calibration only because it moved less far from the start then meets the reference at the same
    place of the reference's own path, and the AUROC difference shows it. The 95% interval of the difference is
    :func:`auroc_difference_interval`'s: the paired prompt-level bootstrap when both records carry their samples
    (the two evaluations share prompts and sampling seed), else the Hanley-McNeil figure of older runs, labelled
    so. Returns dicts with method, step, accuracy, reference_step, reference_accuracy, auroc, reference_auroc,
    difference, low, high, half_width (Hanley-McNeil rows; nan for paired ones), interval (nan where an AUROC is
    undefined)."""
    base = [r for r in runs.get(reference, []) if isinstance(r.get("accuracy"), (int, float))]
    rows = []
    for label, records in runs.items():
        if label == reference or not base:
            continue
        for r in records:
            if r.get("step", 0) == 0 or not isinstance(r.get("accuracy"), (int, float)):
                continue
            near = min(base, key=lambda b: (abs(b["accuracy"] - r["accuracy"]), -b["step"]))
            if abs(near["accuracy"] - r["accuracy"]) > tolerance:
                continue
            rows.append({"method": label, "step": r["step"], "accuracy": r["accuracy"],
                         "reference_step": near["step"], "reference_accuracy": near["accuracy"],
                         "auroc": _number(r.get("auroc")), "reference_auroc": _number(near.get("auroc")),
                         **auroc_difference_interval(r, near)})
    return rows


def matched_accuracy_table(runs: dict[str, list[dict]], *, reference: str, tolerance: float = 0.03) -> str:
    """Markdown of :func:`matched_accuracy_rows` (a sentence when no evaluation meets the reference's path); each
    interval names its method."""
    rows = matched_accuracy_rows(runs, reference=reference, tolerance=tolerance)
    if not rows:
        return (f"No evaluation of another method came within {tolerance} accuracy of any of {reference}'s "
                "evaluations: there is no matched-accuracy comparison to read.")
    lines = [f"| method | step | accuracy | {reference}: step | {reference}: accuracy | AUROC | {reference}: AUROC "
             "| difference (95% interval) |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["interval"] == PAIRED_INTERVAL:
            cell = f"{r['difference']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] ({PAIRED_INTERVAL})"
        else:
            cell = f"{r['difference']:+.3f} (±{r['half_width']:.3f}, {r['interval']})"
        lines.append(f"| {r['method']} | {r['step']} | {r['accuracy']:.3f} | {r['reference_step']} | "
                     f"{r['reference_accuracy']:.3f} | {r['auroc']:.3f} | {r['reference_auroc']:.3f} | {cell} |")
    return "\n".join(lines)


TRAINING_KEYS = (("reward", "rollout accuracy"), ("calibration/auroc", "rollout AUROC"), ("entropy", "entropy"),
                 ("completions/clipped_ratio", "cut at the length limit"),
                 ("calibration/estimator/mask_fraction", "masked fraction"))


def training_table(logs: dict[str, list[dict]], *, window: int = 6) -> str:
    """Markdown: per run, the means of the trainer's per-step logs over the first and the last ``window`` steps
    (``logs``: label -> log_history). Entropy is TRL's mean per-token entropy of the policy on its rollouts: the
    CAPO paper's mask ablation says it rises without the mask."""
    import numpy as np

    lines = ["| method | steps | " + " | ".join(f"{name}: first {window} -> last {window}" for _, name in
                                              TRAINING_KEYS) + " |", "|---|---:|" + "---|" * len(TRAINING_KEYS)]
    for label, history in logs.items():
        steps = [h for h in history if "reward" in h and "step" in h]
        if not steps:
            continue
        cells = []
        for key, _ in TRAINING_KEYS:
            values = np.array([float(h[key]) if isinstance(h.get(key), (int, float)) else np.nan for h in steps])
            first, last = values[:window], values[-window:]
            if np.isfinite(first).any() and np.isfinite(last).any():
                cells.append(f"{np.nanmean(first):.3f} -> {np.nanmean(last):.3f}")
            else:
                cells.append("")
        lines.append(f"| {label} | {len(steps)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
