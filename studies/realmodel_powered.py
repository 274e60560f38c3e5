"""Analysis of the powered real-model study, written down before its first result
(docs/protocols/realmodel_powered.md; this file computes what that text says, nothing it does not).

Two jobs:

* ``--gather``: every FINISHED run under ``runs/realmodel_powered/`` (``seed<s>/<method>`` and
  ``slow/seed<s>/grpo``, as the protocol's commands lay them out) into the raw records, one file per run,
  ``docs/results/realmodel_powered/<arm>_seed<s>.json.gz``: per run its arm, method, seed, learning rate and
  every held-out evaluation (step, n_samples, accuracy, AUROC, ECE, decision-letter ECE and the per-sample
  arrays: prompt id, correctness, ``logprob_mean`` (the confidence is exp of it) and the decision probability).
  A run whose settings differ from the protocol's is refused (file: field). ``scripts/realmodel_powered_queue.sh``
  calls it after each run and commits the new files.
* the analysis (default): reads those files and writes ``docs/results/realmodel_powered.md`` and
  ``docs/results/realmodel_powered.png``:

  - per seed the matched pair: the method's final evaluation (step 60) and the reference's evaluation of the same
    seed (any of its six, the start included) of nearest held-out accuracy, ties to the later step (the rule of
    :func:`studies.realmodel_analysis.matched_accuracy_rows`); when the method's final accuracy exceeds every
    reference evaluation by more than 0.03, the reference's final evaluation and the method's evaluation of
    nearest accuracy to it instead (read on its own curve rather than dropped, the rule of commit f731ab5);
  - the primary endpoint Delta = mean over seeds of AUROC(CAPO + mask) - AUROC(GRPO) at those pairs, with the
    95% percentile interval of :func:`calibrl.metrics.paired.hierarchical_bootstrap_difference` (2,000
    replicates, seed 0, seeds and prompts resampled, one prompt draw shared by the drawn seeds), and the per-seed
    paired intervals (:func:`calibrl.metrics.paired.paired_bootstrap_difference`, same replicates and seed);
  - S1-S5 the same way, each with its bootstrap percentile p-value 2 x min(share of replicates <= 0, share >= 0)
    and Holm's step-down adjustment over the five;
  - the checks: every run's step-0 evaluation identical, GRPO's final accuracy within 0.03 of its start in most
    seeds ("the budget did not move the model"), slow GRPO slower than GRPO along accuracy;
  - the verdict by the protocol's table "What we will conclude", only when every seed's runs are in (seeds left
    out under the protocol's two-attempts rule are named with ``--left-out``); otherwise the report says what is
    missing and gives no verdict;
  - beside the primary interval, its sensitivity to the matched step (the mean difference with GRPO's every
    trained step paired instead) and the seed-level t-interval of the per-seed differences (amendment 6);
  - the (accuracy, AUROC) paths of every arm, one panel per seed.

Usage::

    python -m studies.realmodel_powered --gather                 # runs/realmodel_powered -> the records folder
    python -m studies.realmodel_powered                          # the records folder -> the report and figure
    python -m studies.realmodel_powered --left-out 3             # seed 3 failed twice (protocol, Commands)
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from studies.realmodel_analysis import EVALUATION_METRICS

ROOT = Path(__file__).resolve().parents[1]
RUNS = Path("runs/realmodel_powered")
RECORDS = ROOT / "docs" / "results" / "realmodel_powered"  # one <arm>_seed<s>.json.gz per finished run
REPORT = ROOT / "docs" / "results" / "realmodel_powered.md"
PROTOCOL = "docs/protocols/realmodel_powered.md"

SEEDS = (0, 1, 2, 3, 4)
FINAL_STEP = 60
EVAL_STEPS = (0, 12, 24, 36, 48, 60)
TOLERANCE = 0.03  # the fallback's margin above every reference evaluation
N_BOOT, BOOT_SEED, ALPHA = 2000, 0, 0.05
PLANNED_HALF_WIDTH = 0.05
DEVICE_WORDS = {"cpu": "the CPU", "cuda": "one GPU, amendment 5"}

# arm -> (studies/realmodel_study.py method, learning rate, label): the protocol's table "Arms"
ARMS: dict[str, tuple[str, float, str]] = {
    "grpo": ("grpo", 3e-4, "GRPO"),
    "capo_mask": ("capo_mask", 3e-4, "CAPO + frozen mask (tau 0.6)"),
    "slow_grpo": ("grpo", 1e-4, "GRPO slower (lr 1e-4)"),  # the slower control's style
    "grpo_decision": ("grpo_decision", 3e-4, "GRPO + decision CE (lambda 1)"),
}
# RealModelRunConfig fields every run of the study has (the protocol's COMMON settings and "Arms")
PROTOCOL_SETTINGS = {"model": "builtin:smollm2-135m-instruct", "steps": 60, "prompts_per_step": 4,
                     "num_generations": 8, "max_completion_length": 8, "levels": [1, 2], "train_prompts": 2000,
                     "eval_prompts": 500, "eval_k": 4, "eval_every": 12, "eval_split": "test",
                     "eval_batch_prompts": 50, "lora_r": 16, "threads": 1, "dtype": "float32"}


# ------------------------------------------------------------------------------------------------ endpoints


# (name, method arm, reference arm, metric, question): the protocol's primary and secondary endpoints
ENDPOINTS: tuple[tuple[str, str, str, str, str], ...] = (
    ("primary", "capo_mask", "grpo", "auroc", "CAPO + mask vs GRPO, AUROC at matched accuracy"),
    ("S1", "slow_grpo", "grpo", "auroc", "slow GRPO vs GRPO, AUROC (does moving slowly alone keep the AUROC?)"),
    ("S2", "capo_mask", "slow_grpo", "auroc",
     "CAPO + mask vs slow GRPO on slow GRPO's curve, AUROC (is a gain more than slowness?)"),
    ("S3", "grpo_decision", "grpo", "auroc", "GRPO + decision CE vs GRPO, AUROC"),
    ("S4", "capo_mask", "grpo", "ece", "CAPO + mask vs GRPO, ECE of exp(mean log-prob) (lower is better)"),
    ("S5", "grpo_decision", "grpo", "decision_ece",
     "GRPO + decision CE vs GRPO, decision-letter ECE (lower is better)"),
)
SECONDARY = ("S1", "S2", "S3", "S4", "S5")


def match_pair(method: Sequence[dict], reference: Sequence[dict], *,
               tolerance: float = TOLERANCE) -> tuple[dict, dict, bool]:
    """The matched pair of one seed: ``(method evaluation, reference evaluation, fallback)``.

    ``method`` and ``reference``: one run's evaluation records each (``step``, ``accuracy``), in step order. The
    method's final evaluation against the reference evaluation of nearest accuracy, ties to the later step
    (:func:`studies.realmodel_analysis.matched_accuracy_rows` with no tolerance, which picks it). If the final
    accuracy exceeds EVERY reference evaluation by more than ``tolerance``, the pair is instead the reference's
    final evaluation and the method's evaluation (any step) of nearest accuracy to it, ties to the later step, and
    ``fallback`` is True."""
    from studies.realmodel_analysis import matched_accuracy_rows

    def nearest(target: dict, curve: Sequence[dict]) -> dict:
        # matched_accuracy_rows reads every evaluation after the start: the target goes in as one of step > 0
        bare = lambda r: {"step": r["step"], "accuracy": r["accuracy"]}  # no samples: no bootstrap in there
        rows = matched_accuracy_rows({"target": [{**bare(target), "step": 1}], "curve": [bare(c) for c in curve]},
                                     reference="curve", tolerance=math.inf)
        return next(c for c in curve if c["step"] == rows[0]["reference_step"])

    if not method or not reference:
        raise ValueError("match_pair: each run needs at least one evaluation")
    final = method[-1]
    if final["accuracy"] - max(r["accuracy"] for r in reference) > tolerance:
        return nearest(reference[-1], method), reference[-1], True
    return final, nearest(final, reference), False


def bootstrap_p_value(replicates: np.ndarray) -> float:
    """Two-sided percentile p-value of a bootstrap difference: 2 x min(share of replicates <= 0, share >= 0),
    at most 1, over the finite replicates ``replicates`` [B] (nan when none is finite)."""
    r = np.asarray(replicates, dtype=float)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return math.nan
    return float(min(1.0, 2.0 * min(np.mean(r <= 0), np.mean(r >= 0))))


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values: with p_(1) <= ... <= p_(m) sorted, adjusted p_(i) =
    max_{j <= i} min(1, (m - j + 1) p_(j)); a hypothesis is rejected at level alpha iff its adjusted p <= alpha
    (the same decisions as comparing p_(i) with alpha / (m - i + 1) and stopping at the first that fails).
    ``p_values`` [m] -> [m] in the input order; nan stays nan and does not count in m."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    m = finite.size
    running = 0.0
    for rank, i in enumerate(finite[np.argsort(p[finite], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def endpoint(runs: dict[tuple[str, int], dict], *, arm: str, reference: str, metric: str, seeds: Sequence[int],
             n_boot: int = N_BOOT, seed: int = BOOT_SEED, progress: Callable[[str], None] | None = None) -> dict:
    """One endpoint over ``seeds``: per seed the matched pair (:func:`match_pair`), its metric difference
    ``arm - reference`` and paired interval; over seeds the hierarchical interval and its p-value.

    ``runs``: (arm, seed) -> run record (``evaluations``: records with ``samples``). Returns ``{"seeds": [{"seed",
    "step", "accuracy", "reference_step", "reference_accuracy", "value", "reference_value", "difference", "low",
    "high", "fallback"}], "difference", "low", "high", "p_value", "half_width", "between_seed_sd"}``."""
    from calibrl.metrics.paired import hierarchical_bootstrap_difference, paired_bootstrap_difference

    arrays, score, _, _ = EVALUATION_METRICS[metric]
    per_seed, a, b, ids_a, ids_b = [], [], [], [], []
    for s in seeds:
        mine, ref, fallback = match_pair(runs[(arm, s)]["evaluations"], runs[(reference, s)]["evaluations"])
        sa, sb = mine["samples"], ref["samples"]
        paired = paired_bootstrap_difference(score, arrays(sa), arrays(sb), prompt_ids_a=sa["prompt_id"],
                                             prompt_ids_b=sb["prompt_id"], n_boot=n_boot, seed=seed, alpha=ALPHA)
        per_seed.append({"seed": s, "step": mine["step"], "accuracy": mine["accuracy"],
                         "reference_step": ref["step"], "reference_accuracy": ref["accuracy"], "value": paired.a,
                         "reference_value": paired.b, "difference": paired.point, "low": paired.low,
                         "high": paired.high, "fallback": fallback})
        a.append(arrays(sa)), b.append(arrays(sb)), ids_a.append(sa["prompt_id"]), ids_b.append(sb["prompt_id"])
        if progress:
            progress(f"seed {s} paired")
    # crossed: the same 500 prompts in every seed, one prompt draw shared by the drawn seeds (refused otherwise)
    whole = hierarchical_bootstrap_difference(score, a, b, prompt_ids_a=ids_a, prompt_ids_b=ids_b, n_boot=n_boot,
                                              seed=seed, alpha=ALPHA, crossed=True)
    diffs = [r["difference"] for r in per_seed]
    return {"seeds": per_seed, "difference": whole.point, "low": whole.low, "high": whole.high,
            "p_value": bootstrap_p_value(whole.replicates), "half_width": (whole.high - whole.low) / 2,
            "between_seed_sd": float(np.std(diffs, ddof=1)) if len(diffs) > 1 else math.nan}


def metric_value(metric: str, samples: dict) -> float:
    """One evaluation's ``metric`` (a key of ``EVALUATION_METRICS``) on its per-sample arrays: the point value
    the endpoints' bootstraps start from."""
    arrays, score, _, _ = EVALUATION_METRICS[metric]
    if score == "auroc":
        from calibrl.metrics import auroc as score
    return float(score(**arrays(samples)))


def matched_step_sensitivity(runs: dict[tuple[str, int], dict], seeds: Sequence[int], *, arm: str = "capo_mask",
                             reference: str = "grpo", metric: str = "auroc") -> dict:
    """How much the primary endpoint's mean hangs on which reference evaluation is paired.

    The matched reference step is chosen on held-out accuracies whose noise (standard error about 0.01-0.02 at
    500 prompts x 4) is as large as the spread of GRPO's trained evaluations' accuracies within a seed, so each of
    them is a plausible match. For every trained step k of the reference (EVAL_STEPS after 0): the mean over ``seeds`` of
    metric(``arm``'s final evaluation) - metric(``reference``'s evaluation at step k of the same seed). And the
    seed-level Student-t interval (4 degrees of freedom with 5 seeds) of the per-seed differences at the
    pre-registered pairs (:func:`match_pair`), the seeds as the unit (:func:`calibrl.testbed.report.paired_t_interval`).
    Returns ``{"by_step": {k: mean difference}, "low", "high" (the least and largest of them), "t_interval": (mean,
    low, high), "accuracy_se": (least, largest) standard error of the reference's trained evaluations' accuracy
    (:func:`accuracy_standard_error`), "accuracy_spread": (least, largest) over seeds of the range of those
    accuracies within a seed}``."""
    from calibrl.testbed.report import paired_t_interval

    trained = {s: [e for e in runs[(reference, s)]["evaluations"] if e["step"] > 0] for s in seeds}
    errors = [accuracy_standard_error(e["samples"]) for s in seeds for e in trained[s]]
    spreads = [max(e["accuracy"] for e in trained[s]) - min(e["accuracy"] for e in trained[s])
               for s in seeds if trained[s]]
    finals = {s: metric_value(metric, runs[(arm, s)]["evaluations"][-1]["samples"]) for s in seeds}
    by_step = {}
    for k in EVAL_STEPS[1:]:
        at_k = {s: next((e for e in runs[(reference, s)]["evaluations"] if e["step"] == k), None) for s in seeds}
        if None in at_k.values():  # a run not evaluated at step k (incomplete data): no such pairing
            continue
        by_step[k] = float(np.mean([finals[s] - metric_value(metric, at_k[s]["samples"]) for s in seeds]))
    paired = []
    for s in seeds:
        mine, ref, _ = match_pair(runs[(arm, s)]["evaluations"], runs[(reference, s)]["evaluations"])
        paired.append(metric_value(metric, mine["samples"]) - metric_value(metric, ref["samples"]))
    return {"by_step": by_step, "low": min(by_step.values(), default=math.nan),
            "high": max(by_step.values(), default=math.nan), "accuracy_se": (min(errors, default=math.nan),
                                                                              max(errors, default=math.nan)),
            "accuracy_spread": (min(spreads, default=math.nan), max(spreads, default=math.nan)),
            "t_interval": paired_t_interval(paired)}


def accuracy_standard_error(samples: dict) -> float:
    """Standard error of one evaluation's accuracy with its prompts as the clusters (the unit the bootstraps
    resample): sd over prompts of each prompt's share correct / sqrt(number of prompts)."""
    _, prompt, counts = np.unique(samples["prompt_id"], return_inverse=True, return_counts=True)
    shares = np.bincount(prompt, weights=np.asarray(samples["correct"], float)) / counts
    return float(shares.std(ddof=1) / math.sqrt(shares.size))


def final_range(runs: dict[tuple[str, int], dict], field: str) -> tuple[float, float]:
    """The least and largest ``field`` (``accuracy``, ``auroc``) over every run's final evaluation."""
    values = [run["evaluations"][-1][field] for run in runs.values()]
    return min(values), max(values)


# ------------------------------------------------------------------------------------------------ checks


def step0_mismatches(runs: dict[tuple[str, int], dict]) -> list[str]:
    """Runs whose step-0 evaluation differs from the first run's (per-sample prompt ids, correctness,
    ``logprob_mean`` and decision probability compared exactly): one phrase each, empty when all are identical."""
    keys = sorted(runs)
    out, first = [], None
    for key in keys:
        start = next((e for e in runs[key]["evaluations"] if e["step"] == 0), None)
        if start is None:
            out.append(f"{key[0]} seed {key[1]}: no step-0 evaluation")
            continue
        if first is None:
            first = (key, start["samples"])
            continue
        (arm0, seed0), ref = first
        for field in ("prompt_id", "correct", "logprob_mean", "decision_prob"):
            if list(start["samples"].get(field, [])) != list(ref.get(field, [])):
                detail = ""
                if field == "logprob_mean" and len(start["samples"][field]) == len(ref[field]):
                    gap = np.max(np.abs(np.asarray(start["samples"][field]) - np.asarray(ref[field])))
                    detail = f" (largest difference {gap:.3g})"
                out.append(f"{key[0]} seed {key[1]}: step-0 {field} differs from {arm0} seed {seed0}'s{detail}")
                break
    return out


def grpo_movement(runs: dict[tuple[str, int], dict], seeds: Sequence[int], *, arm: str = "grpo",
                  margin: float = TOLERANCE) -> dict:
    """Final minus start held-out accuracy of ``arm`` per seed, and ``not_moved``: True when it is within
    ``margin`` (|change| <= margin) in most seeds (more than half), the protocol's "the budget did not move the
    model"."""
    change = {s: runs[(arm, s)]["evaluations"][-1]["accuracy"] - runs[(arm, s)]["evaluations"][0]["accuracy"]
              for s in seeds if (arm, s) in runs}
    still = sum(abs(c) <= margin for c in change.values())
    return {"change": change, "within": still, "not_moved": bool(change) and still > len(change) / 2}


def slow_is_slower(runs: dict[tuple[str, int], dict], seeds: Sequence[int]) -> dict:
    """Whether slow GRPO moved more slowly along accuracy than GRPO: per seed the final accuracy gain over the
    start of each, and ``slower`` when slow GRPO's mean gain over the seeds is below GRPO's."""
    gains = {arm: {s: runs[(arm, s)]["evaluations"][-1]["accuracy"] - runs[(arm, s)]["evaluations"][0]["accuracy"]
                   for s in seeds if (arm, s) in runs} for arm in ("grpo", "slow_grpo")}
    both = [s for s in seeds if s in gains["grpo"] and s in gains["slow_grpo"]]
    slow = float(np.mean([gains["slow_grpo"][s] for s in both])) if both else math.nan
    fast = float(np.mean([gains["grpo"][s] for s in both])) if both else math.nan
    return {"gains": gains, "slow_mean": slow, "grpo_mean": fast, "slower": bool(both) and slow < fast}


def verdict(primary: dict, s2: dict, s2_adjusted: float, *, slower: bool) -> list[str]:
    """The conclusion of the protocol's table "What we will conclude" for the primary interval [low, high] (and,
    when it is above 0, S2's Holm-adjusted answer): sentences."""
    low, high, d = primary["low"], primary["high"], primary["difference"]
    interval = f"{d:+.3f} [{low:+.3f}, {high:+.3f}]"
    if low > 0:
        out = [f"On this model and task, CAPO + mask keeps the confidence ranking better than GRPO at matched "
               f"accuracy, by {interval} (AUROC)."]
        if not slower:
            out.append("Whether that is more than slowness is not answered: slow GRPO did not move more slowly "
                       "than GRPO along accuracy, so S2 does not answer its question.")
        elif s2_adjusted <= ALPHA and s2["difference"] > 0:
            out.append(f"S2 (Holm-adjusted p {s2_adjusted:.3f}) is above 0: the gain is more than slowness.")
        elif s2_adjusted <= ALPHA:
            out.append(f"S2 (Holm-adjusted p {s2_adjusted:.3f}) is below 0: CAPO + mask ranks worse than slow "
                       "GRPO at slow GRPO's accuracy, so the gain over GRPO is not more than slowness.")
        else:
            out.append(f"S2 contains 0 (Holm-adjusted p {s2_adjusted:.3f}): the gain is not separable from moving "
                       "slowly.")
        return out
    if high < 0:
        return [f"CAPO + mask ranks worse than GRPO at matched accuracy here ({interval}): the paper's claim does "
                "not transfer to this setting."]
    if low > -0.1 and high < 0.1:
        out = [f"No difference resolved ({interval}); with the pairs as pre-registered, gains of 0.1 or more (the "
               "smallest the papers report) are excluded at 95% here."]
        if low > -0.05 and high < 0.05:
            out.append("The interval lies inside (-0.05, +0.05): no difference larger than 0.05 either way.")
        return out
    return [f"Inconclusive ({interval}): the study did not reach its planned resolution (half-width "
            f"{primary['half_width']:.3f} against the planned {PLANNED_HALF_WIDTH}; between-seed sd of the "
            f"per-seed differences {primary['between_seed_sd']:.3f})."]


# ------------------------------------------------------------------------------------------------ records


def _arm_of(method: str, lr: float) -> str | None:
    return next((arm for arm, (m, rate, _) in ARMS.items() if m == method and math.isclose(lr, rate)), None)


def run_record(folder: Path) -> dict | None:
    """One finished run folder (``trainer_log.json`` with ``finished``, ``calibration_eval.json``,
    ``evaluation_samples.json``) as a raw record, with the UTC start and end of the invocation that finished it;
    None when the run has not finished. A run
    whose settings differ from the protocol's raises ValueError naming the file and field."""
    from calibrl.testbed.realmodel import with_samples
    from calibrl.testbed.runner import run_times

    log_path = folder / "trainer_log.json"
    if not log_path.exists():
        return None
    log = json.loads(log_path.read_text())
    if not log.get("finished"):
        return None
    config = log["config"]
    for key, want in PROTOCOL_SETTINGS.items():
        have = list(config.get(key)) if isinstance(config.get(key), (list, tuple)) else config.get(key)
        if have != want:
            raise ValueError(f"{log_path}: config.{key} is {have!r}, the protocol's is {want!r}")
    arm = _arm_of(config["method"], float(config["learning_rate"]))
    if arm is None:
        raise ValueError(f"{log_path}: config.method {config['method']!r} at learning_rate "
                         f"{config['learning_rate']} is none of the protocol's arms")
    records = with_samples(json.loads((folder / "calibration_eval.json").read_text())["records"], folder)
    evaluations = []
    for r in records:
        if "samples" not in r:
            raise ValueError(f"{folder / 'evaluation_samples.json'}: no per-sample arrays for step {r['step']}")
        keep = {k: r.get(k) for k in ("step", "n_samples", "accuracy", "auroc", "ece", "decision_ece")}
        keep["n_samples"] = int(keep["n_samples"])
        evaluations.append({**keep, "samples": r["samples"]})
    return {"arm": arm, "method": config["method"], "label": ARMS[arm][2], "seed": int(config["seed"]),
            "lr": float(config["learning_rate"]), "steps": int(config["steps"]),
            "device": config.get("device", "cpu"),
            "seconds": log.get("seconds"), **run_times(log), "resumed_from": log.get("resumed_from"), "evaluations": evaluations}


def gather(runs_dir: Path, out: Path) -> list[dict]:
    """Every finished run under ``runs_dir`` (``seed<s>/<method>``, ``slow/seed<s>/grpo``) into the folder ``out``,
    one file per run, ``<arm>_seed<s>.json.gz``, written once (a file whose bytes would not change is left alone),
    so the study's history holds each run's records once (about 0.25 MB each) rather than a growing file
    recommitted after every run. Returns the run records, sorted by arm and seed."""
    from calibrl.testbed.realmodel import write_json_gz

    folders = sorted(runs_dir.glob("seed*/*")) + sorted(runs_dir.glob("slow/seed*/*"))
    runs = [r for r in (run_record(f) for f in folders if f.is_dir()) if r is not None]
    order = list(ARMS)
    runs.sort(key=lambda r: (order.index(r["arm"]), r["seed"]))
    seen = set()
    for r in runs:
        if (r["arm"], r["seed"]) in seen:
            raise ValueError(f"{runs_dir}: two finished runs of {r['arm']} seed {r['seed']}")
        seen.add((r["arm"], r["seed"]))
    for r in runs:
        write_json_gz(out / f"{r['arm']}_seed{r['seed']}.json.gz",
                      {"study": "powered real-model study", "protocol": PROTOCOL,
                       "note": "confidence = exp(logprob_mean); decision_prob null where a completion named no "
                               "letter", "run": r})
    return runs


def load_records(path: Path) -> dict[tuple[str, int], dict]:
    """The raw-records folder (:func:`gather`: one ``<arm>_seed<s>.json.gz`` per run) as ``(arm, seed) -> run
    record``."""
    runs = [json.loads(gzip.decompress(f.read_bytes()))["run"] for f in sorted(path.glob("*_seed*.json.gz"))]
    return {(r["arm"], int(r["seed"])): r for r in runs}


# ------------------------------------------------------------------------------------------------ report


def missing_runs(runs: dict[tuple[str, int], dict], seeds: Sequence[int]) -> list[str]:
    """The protocol's runs not in ``runs`` (or not evaluated at every step of EVAL_STEPS), one phrase each."""
    out = []
    for s in seeds:
        for arm in ARMS:
            run = runs.get((arm, s))
            if run is None:
                out.append(f"{ARMS[arm][2]} seed {s}")
            elif [e["step"] for e in run["evaluations"]] != list(EVAL_STEPS):
                out.append(f"{ARMS[arm][2]} seed {s} (evaluated at steps {[e['step'] for e in run['evaluations']]})")
    return out


def plot_paths(runs: dict[tuple[str, int], dict], path: Path, seeds: Sequence[int]) -> Path:
    """The (held-out accuracy, AUROC) path of every arm, one panel per seed, colours by
    :func:`calibrl.evaluation.styles.series_style`; the final evaluation (step 60) drawn larger."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from calibrl.evaluation.styles import series_style

    fig, axes = plt.subplots(1, len(seeds), figsize=(3.6 * len(seeds), 3.8), sharex=True, sharey=True,
                             squeeze=False)
    for ax, s in zip(axes[0], seeds):
        for arm, (_, _, label) in ARMS.items():
            run = runs.get((arm, s))
            if run is None:
                continue
            style = series_style(label)
            acc = [e["accuracy"] for e in run["evaluations"]]
            auc = [e["auroc"] if isinstance(e["auroc"], (int, float)) else np.nan for e in run["evaluations"]]
            ax.plot(acc, auc, label=label, **style.kwargs())
            ax.plot(acc[-1:], auc[-1:], marker=style.marker, markersize=10, color=style.color, linestyle="none")
        ax.set(title=f"seed {s}", xlabel="held-out accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("AUROC of mean token log-prob")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h), labels.append(l)
    fig.suptitle("SmolLM2-135M-Instruct, LoRA, multiple-choice: (accuracy, AUROC) every 12 steps; large marker: "
                 "step 60")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=4, frameon=False)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def sensitivity_sentence(sensitivity: dict) -> str:
    """The primary endpoint's dependence on the matched step (:func:`matched_step_sensitivity`), in words."""
    by_step = sensitivity["by_step"]
    if not by_step:
        return "Sensitivity to the matching: no step of GRPO is evaluated in every seed yet."
    low_step = min(by_step, key=by_step.get)
    high_step = max(by_step, key=by_step.get)
    mean, low, high = sensitivity["t_interval"]
    se, spread = sensitivity["accuracy_se"], sensitivity["accuracy_spread"]
    return ("Sensitivity to the matching (the primary interval holds given the pre-registered pairs only): GRPO's "
            f"matched step is chosen on held-out accuracies whose standard error (prompts as clusters) is "
            f"{se[0]:.3f}-{se[1]:.3f}, as large as the spread of GRPO's accuracies over its trained evaluations "
            f"within a seed ({spread[0]:.3f}-{spread[1]:.3f}), so any of them is a plausible match. Pairing CAPO + mask's final evaluation with GRPO's step "
            "k in every seed gives a mean difference of "
            + ", ".join(f"{d:+.3f} (k = {k})" for k, d in by_step.items())
            + f": from {by_step[low_step]:+.3f} to {by_step[high_step]:+.3f}. The seed-level Student-t interval of "
            f"the pre-registered pairs' differences (the seed as the unit) is {mean:+.3f} [{low:+.3f}, {high:+.3f}].")


RESUME_CHECK = RECORDS / "resume_check.json"  # studies/realmodel_resume_check.py's record


def resume_check_sentence() -> str:
    """What was checked of a resumed run's equality: the CPU resume check of the decision-CE settings
    (``resume_check.json``, :mod:`studies.realmodel_resume_check`) when it is in, and what was not."""
    if not RESUME_CHECK.is_file():
        return ("On the CPU a resumed run's records equal an uninterrupted run's for CAPO + mask on the tiny model "
                "(tests/test_realmodel_resume.py); the decision-CE settings and the GPU were not checked.")
    from studies.realmodel_resume_check import summary

    return summary(json.loads(RESUME_CHECK.read_text()))


def scope_sentence(runs: dict[tuple[str, int], dict]) -> str:
    """What the study speaks to: the model's level on the task (start and final accuracies, final AUROCs)."""
    if not runs:
        return "Scope: one 135M model, one synthetic task, 60 LoRA steps; not the papers' settings."
    start = next(iter(runs.values()))["evaluations"][0]["accuracy"]
    acc, auc = final_range(runs, "accuracy"), final_range(runs, "auroc")
    return (f"Scope: the model is near chance on this task (four options; held-out accuracy {start:.2f} untrained, "
            f"{acc[0]:.2f}-{acc[1]:.2f} after training) and every final AUROC is {auc[0]:.2f}-{auc[1]:.2f}: there was "
            "little ranking left to keep. The study speaks to a model at this level, not to one that solves the "
            "task; and to one 135M model, one synthetic task and 60 LoRA steps, not the papers' settings.")


def _interval(d: dict) -> str:
    return f"{d['difference']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def analyse(runs: dict[tuple[str, int], dict], *, left_out: Sequence[int] = (), n_boot: int = N_BOOT,
            progress: Callable[[str], None] | None = None) -> dict:
    """Everything the report states, as numbers: ``missing``, ``seeds`` (those analysed), ``complete`` (every
    run of every seed not left out is in), ``step0`` mismatches, ``grpo_moved``, ``slow``, ``endpoints`` (name ->
    :func:`endpoint` with ``p_holm`` for S1-S5), ``sensitivity`` (:func:`matched_step_sensitivity` of the primary
    endpoint), ``verdict`` (sentences; None without complete data)."""
    kept = [s for s in SEEDS if s not in set(left_out)]
    missing = missing_runs(runs, kept)
    seeds = [s for s in kept if all((arm, s) in runs for arm in ARMS)]  # seeds with every arm in
    out = {"missing": missing, "seeds": seeds, "n_boot": n_boot, "left_out": list(left_out),
           "complete": not missing and bool(seeds),
           "step0": step0_mismatches(runs), "grpo_moved": grpo_movement(runs, seeds),
           "slow": slow_is_slower(runs, seeds), "endpoints": {}, "verdict": None}
    if not seeds:
        return out
    for name, arm, reference, metric, _ in ENDPOINTS:
        if progress:
            progress(f"{name}: bootstrap over {len(seeds)} seeds")
        out["endpoints"][name] = endpoint(runs, arm=arm, reference=reference, metric=metric, seeds=seeds,
                                          n_boot=n_boot)
    out["sensitivity"] = matched_step_sensitivity(runs, seeds)
    adjusted = holm_adjust([out["endpoints"][n]["p_value"] for n in SECONDARY])
    for n, p in zip(SECONDARY, adjusted):
        out["endpoints"][n]["p_holm"] = p
    if out["complete"] and not out["step0"]:
        out["verdict"] = verdict(out["endpoints"]["primary"], out["endpoints"]["S2"],
                                 out["endpoints"]["S2"]["p_holm"], slower=out["slow"]["slower"])
        if out["grpo_moved"]["not_moved"]:  # the protocol: whatever the outcome
            out["verdict"] = [f"GRPO's final accuracy is within {TOLERANCE} of its start in "
                              f"{out['grpo_moved']['within']} of {len(seeds)} seeds: the budget did not move the "
                              "model, and no statement about calibration under training is made. For the record, "
                              "the table's row for the primary interval reads:", *out["verdict"]]
    return out


def report(result: dict, runs: dict[tuple[str, int], dict], *, figure: str | None) -> str:
    """Markdown of :func:`analyse`'s result."""
    seeds, n_boot = result["seeds"], result["n_boot"]

    lines = ["# Powered real-model study: results", "",
             "Data: `docs/results/realmodel_powered/` (one file per finished run; this page and its figure are "
             "rebuilt by `python -m studies.realmodel_powered`).", "",
             f"Protocol: [{PROTOCOL}](../protocols/realmodel_powered.md), committed before any run.", ""]
    # records gathered before the device was recorded ran on the CPU
    devices = Counter(run.get("device", "cpu") for run in runs.values())
    if devices:
        lines += ["Computed on: " + ", ".join(f"{DEVICE_WORDS.get(d, d)} ({n} run{'s' * (n != 1)})"
                                              for d, n in sorted(devices.items())) + ".", ""]
    resumed = sorted((run["label"], seed, run["resumed_from"]) for (_, seed), run in runs.items()
                     if run.get("resumed_from") is not None)
    if resumed:
        lines += [f"Runs interrupted and resumed from their newest checkpoint ({len(resumed)}): "
                  + "; ".join(f"{label} seed {seed} at step {step}" for label, seed, step in resumed)
                  + ". The protocol said such runs restart from step 0; its amendment 6 records the deviation. None "
                  "is a GRPO or CAPO + mask run, so the primary endpoint's runs are not affected; but every GRPO + "
                  "decision CE run is among them, so S5 (the decision-letter ECE) rests wholly on resumed runs. "
                  + resume_check_sentence(), ""]
    if runs and not any(run.get("started_utc") for run in runs.values()):
        lines += ["The records carry no UTC start and end (run records keep them from 2026-11-28 on): the order of "
                  "the runs against the protocol's commits is read from the commits alone.", ""]
    if result["left_out"]:
        lines += [f"Seeds left out (a GRPO or CAPO + mask run could not finish after two attempts): "
                  f"{', '.join(map(str, result['left_out']))}.", ""]
    lines += ["## Verdict", ""]
    if result["step0"]:
        lines += ["**No verdict: the step-0 evaluations differ** (the protocol stops the study until explained):", "",
                  *[f"- {m}" for m in result["step0"]], ""]
    elif not result["complete"]:
        lines += [f"**No verdict: the study is not complete.** Missing ({len(result['missing'])}):", "",
                  *[f"- {m}" for m in result["missing"]], "",
                  f"The figures below are of the {len(seeds)} seed(s) with every arm in "
                  f"({', '.join(map(str, seeds)) or 'none'}): interim, no conclusion is drawn from them.", ""]
    else:
        lines += [*result["verdict"], ""]
    if result.get("sensitivity"):
        lines += [sensitivity_sentence(result["sensitivity"]), ""]
    moved = result["grpo_moved"]
    if moved["change"]:
        changes = ", ".join(f"seed {s} {c:+.3f}" for s, c in moved["change"].items())
        lines += [f"GRPO's held-out accuracy from step 0 to step {FINAL_STEP}: {changes}. "
                  + ("Within 0.03 of the start in most seeds: **the budget did not move the model, and no statement "
                     "about calibration under training is made.**" if moved["not_moved"] else
                     f"Within 0.03 of the start in {moved['within']} of {len(moved['change'])} seeds: the budget "
                     "moved the model."), ""]
    slow = result["slow"]
    if np.isfinite(slow["slow_mean"]):
        lines += [f"Slow GRPO's mean accuracy gain {slow['slow_mean']:+.3f} against GRPO's {slow['grpo_mean']:+.3f}: "
                  + ("it moved more slowly, as the control is meant to." if slow["slower"] else
                     "it did NOT move more slowly, so S1 and S2 do not answer their questions."), ""]
    lines += ["## Scope", "", scope_sentence(runs), ""]
    if not result["endpoints"]:
        return "\n".join(lines + ["No seed has every arm in yet: nothing to compute.", ""])
    lines += ["## Endpoints", "",
              f"Mean over {len(seeds)} seeds of the per-seed difference (method - reference) at the matched pair, "
              f"95% hierarchical bootstrap interval ({n_boot:,} replicates, seed {BOOT_SEED}: seeds and prompts "
              "resampled, one prompt draw shared by the drawn seeds; the pairs fixed as chosen on the full data, so "
              "the matching's own uncertainty is not propagated). p: the bootstrap's two-sided percentile p-value "
              f"(0.000: no replicate on the other side of 0, p < {2 / n_boot:.2g} before adjustment); Holm over "
              "S1-S5 at 0.05.", "",
              "| endpoint | question | difference [95% interval] | half-width | between-seed sd | p | Holm p |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for name, _, _, _, question in ENDPOINTS:
        e = result["endpoints"][name]
        holm = f"{e['p_holm']:.3f}" if "p_holm" in e else "(primary)"
        lines.append(f"| {name} | {question} | {_interval(e)} | {e['half_width']:.3f} | {e['between_seed_sd']:.3f} "
                     f"| {e['p_value']:.3f} | {holm} |")
    primary = result["endpoints"]["primary"]
    lines += ["", f"The primary interval's half-width is {primary['half_width']:.3f} against the planned "
              f"{PLANNED_HALF_WIDTH} (studies/realmodel_power.py: 0.042 per seed, before the between-seed spread).",
              "",
              "## Matched pairs per seed", "",
              "Method's evaluation against the reference's of nearest held-out accuracy (ties: the later step); "
              "\"fallback\": the method's final accuracy exceeded every reference evaluation by more than 0.03, so "
              "the reference's final evaluation is read against the method's evaluation of nearest accuracy. "
              f"Interval: the paired prompt bootstrap ({n_boot:,} replicates, seed {BOOT_SEED}).", "",
              "| endpoint | seed | step | accuracy | reference step | reference accuracy | value | reference value "
              "| difference [95% interval] |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, *_ in ENDPOINTS:
        for r in result["endpoints"][name]["seeds"]:
            note = " (fallback)" if r["fallback"] else ""
            lines.append(f"| {name} | {r['seed']}{note} | {r['step']} | {r['accuracy']:.3f} | {r['reference_step']} | "
                         f"{r['reference_accuracy']:.3f} | {r['value']:.3f} | {r['reference_value']:.3f} | "
                         f"{_interval(r)} |")
    fallbacks = sorted({(n, r["seed"]) for n, e in result["endpoints"].items() for r in e["seeds"] if r["fallback"]})
    lines += ["", "Seeds read by the fallback rule: " + (", ".join(f"{n} seed {s}" for n, s in fallbacks) or "none")
              + ".", "", "## Every evaluation", "",
              "| arm | seed | step | accuracy | AUROC | ECE | decision-letter ECE |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for (arm, s), run in sorted(runs.items(), key=lambda kv: (list(ARMS).index(kv[0][0]), kv[0][1])):
        for e in run["evaluations"]:
            cells = [f"{e[k]:.3f}" if isinstance(e.get(k), (int, float)) else "" for k in
                     ("accuracy", "auroc", "ece", "decision_ece")]
            lines.append(f"| {ARMS[arm][2]} | {s} | {e['step']} | " + " | ".join(cells) + " |")
    if figure:
        lines += ["", f"![(accuracy, AUROC) paths]({figure})"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gather", action="store_true",
                        help="write each finished run's records into --records and stop")
    parser.add_argument("--runs", type=Path, default=RUNS, help="the study's run folder (default %(default)s)")
    parser.add_argument("--records", type=Path, default=RECORDS, help="the raw-records folder (default %(default)s)")
    parser.add_argument("--out", type=Path, default=REPORT, help="the report (default %(default)s)")
    parser.add_argument("--left-out", type=int, nargs="*", default=[],
                        help="seeds left out under the protocol's two-attempts rule")
    parser.add_argument("--n-boot", type=int, default=N_BOOT, help=argparse.SUPPRESS)  # tests only
    options = parser.parse_args(argv)
    if options.gather:
        runs = gather(options.runs, options.records)
        print(f"{len(runs)} finished run(s) -> {options.records}: "
              + ", ".join(f"{r['arm']} seed {r['seed']}" for r in runs))
        return 0
    if not any(options.records.glob("*_seed*.json.gz")):
        print(f"{options.records}: no raw records yet (run with --gather after a run finishes)", file=sys.stderr)
        return 2
    runs = load_records(options.records)
    start = time.perf_counter()
    result = analyse(runs, left_out=options.left_out, n_boot=options.n_boot,
                     progress=lambda m: print(f"[{time.perf_counter() - start:5.0f} s] {m}", file=sys.stderr,
                                              flush=True))
    figure = None
    options.out.parent.mkdir(parents=True, exist_ok=True)
    if runs:
        figure_path = options.out.with_suffix(".png")
        plot_paths(runs, figure_path, SEEDS)
        figure = figure_path.name
    options.out.write_text(report(result, runs, figure=figure))
    print(f"{options.out}: {'verdict' if result['verdict'] else 'no verdict'}; "
          f"{len(result['missing'])} run(s) missing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
