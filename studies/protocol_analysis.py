"""The pre-registered study (docs/testbed.md, "Pre-registered protocol"): its runs and its reading, as pure steps.

Task ``scratchpad`` (:mod:`calibrl.testbed.tasks`: deterministic reward, 25-character worked scratchpad, easy /
medium / hard prompts, a warm start that slips systematically on the hard ones). Every run evaluates, every
``eval_every`` steps, two disjoint prompt sets with ``eval_samples`` samples each (T = 1):

* *eval* (``eval_prompts`` prompts of the eval split): the pilot's rule, the accuracy targets and every run's
  stopping points are read here;
* *test* (``test_prompts`` prompts of the test split): its samples are saved at every evaluation but read only at
  the stopping points chosen on eval (:func:`endpoints`), once, after the runs.

The steps, in order:

1. :func:`pilot_verdict`: GRPO, seeds ``pilot_seeds``. The premise (GRPO widens the gap between the AUROC ceiling
   and the AUROC of the mean token log-prob) holds iff that pooled gap grows by at least ``min_gap_growth`` from
   step 0 to the last evaluation in EVERY pilot seed; otherwise the study reports "premise not reproduced at this
   scale" and stops (nothing is tuned to make it appear).
2. :func:`accuracy_targets`: warm-start eval accuracy + 1/3 and 2/3 of GRPO-1e-4's mean gain at its last
   evaluation (expected accuracy, averaged over seeds).
3. :func:`stopping_step`: each run's first evaluation whose eval accuracy reaches a target (None: never reached;
   reported as such, never interpolated).
4. :func:`endpoints` on the test samples at the stopping steps: per-prompt AUROC and pooled ceiling - AUROC.
5. :func:`paired_bootstrap`: arm minus GRPO-1e-4, paired by seed, 95% interval by resampling test prompts within
   seeds (the same resample for both arms of a seed).
6. :func:`success`: the rule fixed in docs/testbed.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from calibrl.testbed.methods import PROTOCOL_ARMS, PROTOCOL_TASK

REFERENCE_ARM = "grpo"
CONTROL_ARMS = ("grpo_lr3e-5", "grpo_kl")
SECOND_PILOT_TASK = "scratchpad_unfixable"
# the second pilot's arms and seeds if it is positive (docs/testbed.md, fixed before its runs: fewer than the first)
SECOND_PILOT_ARMS = ("grpo", "grpo_lr3e-5", "grpo_kl", "capo_tau0.6", "capo_mask_tau0.6")
SECOND_PILOT_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class ProtocolConfig:
    """The study's fixed settings (docs/testbed.md). ``task``: ``scratchpad`` (the first protocol) or
    ``scratchpad_unfixable`` (the second pilot: hard items out of reach)."""

    task: str = PROTOCOL_TASK
    steps: int = 400
    eval_every: int = 25
    eval_prompts: int = 128
    test_prompts: int = 256
    eval_samples: int = 8
    prompts_per_step: int = 16
    num_generations: int = 8
    learning_rate: float = 1e-4
    pilot_seeds: tuple[int, ...] = (0, 1)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    min_gap_growth: float = 0.02  # the pilot's rule
    success_margin: float = 0.02  # the success rule's margin on the ceiling gap
    n_bootstrap: int = 10_000
    workers: int = 2
    arms: tuple[str, ...] = tuple(a.name for a in PROTOCOL_ARMS)

    @classmethod
    def for_task(cls, task: str, **settings) -> "ProtocolConfig":
        """The pre-registered settings of ``task``'s study: the first protocol's for ``scratchpad``; for
        ``scratchpad_unfixable`` its smaller arm set and 3 seeds."""
        if task == SECOND_PILOT_TASK:
            settings = {"arms": SECOND_PILOT_ARMS, "seeds": SECOND_PILOT_SEEDS, **settings}
        elif task != PROTOCOL_TASK:
            raise ValueError(f"no pre-registered protocol for task {task!r}: {PROTOCOL_TASK} or {SECOND_PILOT_TASK}")
        return cls(task=task, **settings)


def build_jobs(config: ProtocolConfig, *, arms: Sequence[str], seeds: Sequence[int], runs_dir: Path,
               warm_path: str) -> list[dict]:
    """Jobs for :func:`calibrl.testbed.runner.run_jobs`: one per arm x seed, from the same warm start."""
    by_name = {a.name: a for a in PROTOCOL_ARMS}
    unknown = [a for a in arms if a not in by_name]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; choose from {list(by_name)}")
    jobs = []
    for seed in seeds:
        for name in arms:
            arm = by_name[name]
            jobs.append({
                "key": f"{config.task}/{name}", "task": config.task, "method": name, "label": arm.label,
                "config": dict(arm.config), "train": True, "seed": seed, "steps": config.steps,
                "eval_every": config.eval_every, "eval_prompts": config.eval_prompts, "eval_split": "eval",
                "eval_sets": {"test": ("test", config.test_prompts)}, "eval_samples": config.eval_samples,
                "prompts_per_step": config.prompts_per_step, "num_generations": config.num_generations,
                "learning_rate": config.learning_rate, "warm_path": warm_path,
                "run_dir": str(runs_dir / name / f"seed{seed}")})
    return jobs


def ceiling_gap(record: dict) -> float:
    """Pooled ``auroc_ceiling - auroc`` of one evaluation record (metrics dict)."""
    return float(record["auroc_ceiling"] - record["auroc"])


def pilot_verdict(histories: Sequence[Sequence[dict]], *, min_gap_growth: float = 0.02) -> dict:
    """The pilot's rule on the eval set: for each run (its list of evaluation records, step 0 first), the growth
    of the pooled ceiling gap from step 0 to the last evaluation; the premise holds iff every run's growth is at
    least ``min_gap_growth``."""
    growth = [ceiling_gap(h[-1]) - ceiling_gap(h[0]) for h in histories]
    return {"gap_growth": growth, "reproduced": bool(histories) and all(g >= min_gap_growth for g in growth),
            "min_gap_growth": min_gap_growth}


def accuracy_targets(grpo_histories: Sequence[Sequence[dict]], *, key: str = "expected_accuracy"
                     ) -> tuple[float, float]:
    """Warm-start accuracy + 1/3 and + 2/3 of GRPO-1e-4's mean gain at its last evaluation (eval set)."""
    start = float(np.mean([h[0][key] for h in grpo_histories]))
    end = float(np.mean([h[-1][key] for h in grpo_histories]))
    gain = end - start
    return start + gain / 3.0, start + 2.0 * gain / 3.0


def stopping_step(history: Sequence[dict], target: float, *, key: str = "expected_accuracy") -> int | None:
    """First evaluation step (after step 0) whose eval accuracy reaches ``target``; None if none does."""
    for record in history:
        if record["step"] > 0 and record[key] >= target:
            return int(record["step"])
    return None


def endpoints(samples: dict[str, np.ndarray], prompt_weights: np.ndarray | None = None) -> dict[str, float]:
    """The endpoints on one run's test samples at one stopping step.

    ``samples``: ``prompt_index`` [M], ``logprob_mean`` [M], ``correct`` [M] bool, ``q_true`` [M];
    ``prompt_weights`` [P] (a bootstrap resample's count of each prompt; None = every prompt once). Returns
    ``auroc_per_prompt`` (weighted mean of the within-prompt AUROC over prompts with both outcomes),
    ``auroc`` (pooled, samples weighted by their prompt's count), ``ceiling_gap`` (pooled AUROC of ``q_true``
    minus ``auroc``) and ``accuracy``.
    """
    pid = np.asarray(samples["prompt_index"])
    n_prompts = int(pid.max()) + 1
    w = np.ones(n_prompts) if prompt_weights is None else np.asarray(prompt_weights, dtype=np.float64)
    out = _weighted_endpoints(pid, np.asarray(samples["logprob_mean"], dtype=np.float64),
                              np.asarray(samples["correct"], dtype=bool),
                              np.asarray(samples["q_true"], dtype=np.float64), w[None, :])
    return {k: float(v[0]) for k, v in out.items()}


def _weighted_endpoints(pid: np.ndarray, lpm: np.ndarray, correct: np.ndarray, q: np.ndarray,
                        prompt_weights: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`endpoints` for B prompt-weight vectors at once ([B, P]) -> arrays [B]."""
    from calibrl.metrics import per_prompt_auroc, weighted_auroc

    sample_w = prompt_weights[:, pid]  # [B, M]
    pooled = weighted_auroc(lpm, correct, sample_w)
    ceiling = weighted_auroc(q, correct, sample_w)
    # within-prompt AUROC, once per prompt (it does not depend on the resample), then weighted means
    per = np.full(prompt_weights.shape[1], np.nan)
    _, values = per_prompt_auroc(lpm, correct, pid, return_values=True)  # in the order of np.unique(pid)
    per[np.unique(pid)] = values
    has = np.isfinite(per)
    pw = prompt_weights[:, has]
    with np.errstate(invalid="ignore", divide="ignore"):
        per_prompt = (pw * per[has]).sum(axis=1) / pw.sum(axis=1)
        acc = (sample_w * correct).sum(axis=1) / sample_w.sum(axis=1)
    return {"auroc_per_prompt": per_prompt, "auroc": pooled, "ceiling_gap": ceiling - pooled, "accuracy": acc}


def paired_bootstrap(arm: Sequence[dict[str, np.ndarray]], reference: Sequence[dict[str, np.ndarray]], *,
                     metric: str, n_bootstrap: int = 10_000, seed: int = 0) -> dict[str, float]:
    """Mean over seeds of (arm - reference) ``metric``, with a 95% percentile interval from resampling the test
    prompts within each seed (the same resample for the arm and the reference of that seed: they share prompts).

    ``arm[i]`` and ``reference[i]`` are seed i's test samples (:func:`endpoints`' input) at the stopping step. Each
    seed's replicates are :func:`calibrl.metrics.paired.paired_bootstrap_difference`'s (seed ``seed + i``), the
    seeds fixed; replicate r of the mean is the mean of the seeds' replicates r."""
    from calibrl.metrics.bootstrap import percentile_interval
    from calibrl.metrics.paired import paired_bootstrap_difference

    if len(arm) != len(reference) or not arm:
        raise ValueError("paired_bootstrap needs the same seeds (at least one) for the arm and the reference")

    def score(prompt_ids, logprob_mean, correct, q_true) -> float:  # prompt_ids: the replicate's fresh numbering
        return endpoints({"prompt_index": prompt_ids, "logprob_mean": logprob_mean, "correct": correct,
                          "q_true": q_true})[metric]

    def arrays(samples: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        pid, lpm, correct, q = _arrays(samples)
        return {"prompt_ids": pid, "logprob_mean": lpm, "correct": correct, "q_true": q}

    per_seed = [paired_bootstrap_difference(score, arrays(a), arrays(r), prompt_ids_a=a["prompt_index"],
                                            prompt_ids_b=r["prompt_index"], n_boot=n_bootstrap, seed=seed + i)
                for i, (a, r) in enumerate(zip(arm, reference))]
    diffs = np.mean([d.replicates for d in per_seed], axis=0)
    low, high = percentile_interval(diffs, alpha=0.05)
    return {"difference": float(np.mean([d.point for d in per_seed])), "low": float(low), "high": float(high),
            "n_seeds": len(arm)}


def _arrays(samples: dict[str, np.ndarray]):
    return (np.asarray(samples["prompt_index"]), np.asarray(samples["logprob_mean"], dtype=np.float64),
            np.asarray(samples["correct"], dtype=bool), np.asarray(samples["q_true"], dtype=np.float64))


def success(capo_vs_grpo: dict, capo_vs_controls: Sequence[dict], *, margin: float = 0.02) -> bool:
    """docs/testbed.md's rule on the ceiling gap at the higher target: CAPO's gap smaller than GRPO-1e-4's by at
    least ``margin`` with the interval excluding 0, and smaller than each control's with the interval excluding 0
    (each dict: :func:`paired_bootstrap` of CAPO minus the other arm on ``ceiling_gap``)."""
    beats_grpo = capo_vs_grpo["difference"] <= -margin and capo_vs_grpo["high"] < 0
    return bool(beats_grpo and all(c["high"] < 0 for c in capo_vs_controls))


def load_test_samples(run_dir: Path, step: int) -> dict[str, np.ndarray]:
    """The test-set samples a run saved at evaluation ``step`` (``eval_set_samples.npz``)."""
    with np.load(Path(run_dir) / "eval_set_samples.npz") as data:
        return {field: data[f"test/step{step}/{field}"] for field in ("prompt_index", "logprob_mean", "correct",
                                                                      "q_true")}


def analyze(histories: dict[str, dict[int, list[dict]]], run_dirs: dict[str, dict[int, Path]], *,
            config: ProtocolConfig) -> dict:
    """Steps 2-6 of the module docstring on finished runs.

    ``histories[arm][seed]``: the run's eval-set records; ``run_dirs[arm][seed]``: its folder (test samples).
    Returns ``{"targets", "stops": {arm: {target: {seed: step or None}}}, "comparisons": {target: {arm: {metric:
    paired_bootstrap or None}}}, "success": bool or None}``. An arm is compared at a target only over the seeds
    where both it and GRPO-1e-4 reached it (``n_seeds`` says how many; None when no seed did).
    """
    seeds = sorted(histories[REFERENCE_ARM])
    targets = accuracy_targets([histories[REFERENCE_ARM][s] for s in seeds])
    names = ("lower", "higher")
    stops = {arm: {name: {s: stopping_step(h, t) for s, h in runs.items()} for name, t in zip(names, targets)}
             for arm, runs in histories.items()}
    comparisons: dict[str, dict] = {}
    for name in names:
        comparisons[name] = {}
        for arm in histories:
            if arm == REFERENCE_ARM:
                continue
            both = [s for s in seeds if stops[arm][name].get(s) is not None
                    and stops[REFERENCE_ARM][name].get(s) is not None]
            if not both:
                comparisons[name][arm] = None
                continue
            a = [load_test_samples(run_dirs[arm][s], stops[arm][name][s]) for s in both]
            r = [load_test_samples(run_dirs[REFERENCE_ARM][s], stops[REFERENCE_ARM][name][s]) for s in both]
            comparisons[name][arm] = {metric: paired_bootstrap(a, r, metric=metric, n_bootstrap=config.n_bootstrap)
                                      for metric in ("ceiling_gap", "auroc_per_prompt", "accuracy")}
    verdicts = {}
    for capo in (a for a in histories if a.startswith("capo")):
        vs_grpo = comparisons["higher"].get(capo)
        controls = []
        for control in CONTROL_ARMS:  # CAPO minus control = (CAPO - GRPO) - (control - GRPO), same resamples
            c = comparisons["higher"].get(control)
            if vs_grpo is None or c is None or c["ceiling_gap"]["n_seeds"] != vs_grpo["ceiling_gap"]["n_seeds"]:
                controls = None
                break
            controls.append(_capo_minus_control(run_dirs, stops, capo, control, config))
        verdicts[capo] = (None if vs_grpo is None or controls is None
                          else success(vs_grpo["ceiling_gap"], controls, margin=config.success_margin))
    return {"targets": list(targets), "stops": stops, "comparisons": comparisons, "success": verdicts}


def _capo_minus_control(run_dirs, stops, capo: str, control: str, config: ProtocolConfig) -> dict:
    seeds = [s for s in sorted(run_dirs[capo]) if stops[capo]["higher"].get(s) is not None
             and stops[control]["higher"].get(s) is not None]
    a = [load_test_samples(run_dirs[capo][s], stops[capo]["higher"][s]) for s in seeds]
    c = [load_test_samples(run_dirs[control][s], stops[control]["higher"][s]) for s in seeds]
    return paired_bootstrap(a, c, metric="ceiling_gap", n_bootstrap=config.n_bootstrap)


__all__ = ["CONTROL_ARMS", "REFERENCE_ARM", "SECOND_PILOT_ARMS", "SECOND_PILOT_SEEDS", "SECOND_PILOT_TASK",
           "ProtocolConfig", "accuracy_targets", "build_jobs", "ceiling_gap",
           "analyze", "endpoints", "load_test_samples", "paired_bootstrap", "pilot_verdict", "stopping_step", "success"]
