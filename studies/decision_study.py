"""Decision-token calibration when the decision copies the reasoning's conclusion (arXiv 2601.13284's diagnosis),
on ``testbed/decision_copy``: GRPO vs GRPO + decision-token CE (three variants x four lambdas) vs post-hoc
calibration of GRPO, compared at matched sampled accuracy.

Arms (``calibrl.testbed.methods.DECISION_STUDY_ARMS``; same warm start, 200 steps of 16 prompts x 8 samples,
T = 1, lr 1e-4, beta 0, seeds 0 and 1):

* ``sft``: the warm start, evaluated only; ``grpo``;
* ``ce_<variant>_lam<lambda>``, lambda in {1e-3, 1e-2, 0.1, 1}, variants: ``paper_gate`` (the paper's target:
  one-hot when right, uniform when wrong, with the consistency gate: our reading of the paper), ``paper_nogate``
  (the same without the gate), ``binary`` (ours: binary cross-entropy of q(chosen) against correctness).

Protocol, fixed before the runs: every run is evaluated every 25 steps on 128 *eval* prompts (the curve and every
choice) and 256 *test* prompts (read only as below), 8 samples each, common random numbers.

1. lambda per variant: the one with the lowest eval ``calib_err`` (mean |q(Y) - p(x)| over samples with a right
   sum: the noise-free calibration error) at the last step, averaged over seeds;
2. the chosen arms, GRPO and SFT are reported on test at their last step: decision ECE (10 equal-count bins),
   calib_err, sampled (expected) accuracy and argmax-decision accuracy;
3. matched sampled accuracy: GRPO read at the first evaluation where its EVAL expected accuracy reaches the
   chosen arm's final eval expected accuracy (its test metrics at that step); added with the regenerated data
   (2026-11-26, after these results had been seen): the same reading interpolated linearly in eval accuracy
   between the two GRPO evaluations that bracket the arm's (the start, step 0, included; an arm that ended below
   GRPO's start is read at the start, and said so);
4. post-hoc baselines: temperature scaling and isotonic regression (``calibrl.posthoc``) fitted on GRPO's final
   eval-set decision confidences and drawn outcomes, applied to its final test confidences (decision ECE, and
   mean |q(Y) - p(x)| of the recalibrated confidences);
5. downstream: AURC of each arm's decision confidence on its final test samples (selective prediction).

    python -m studies.decision_study --out runs/decision_study        # 26 training runs, about 25 min on one core
    python -m studies.decision_study --out runs/decision_study --report-only

Writes ``<out>/report.md`` and ``<out>/analysis.json``; a run whose history.json exists is not run again. With
``--save FILE`` (``docs/results/decision_results.json.gz``) also the runs' raw records (:func:`collect`: every
evaluation of every run and the test samples the AURC and post-hoc readings use), from which :func:`analyze` and
:func:`report` rebuild the tables alone.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from calibrl.testbed.methods import DECISION_COPY_TASK, DECISION_LAMBDAS, DECISION_STUDY_ARMS, DECISION_VARIANTS
from studies.data_files import load_data, save_data  # noqa: F401  (load_data: the rebuild reads through this module)

SEEDS = (0, 1)
STEPS, EVAL_EVERY, EVAL_PROMPTS, TEST_PROMPTS = 200, 25, 128, 256
TEST_KEYS = ("dec_ece", "calib_err", "expected_accuracy", "greedy_decision_accuracy", "frac_conf_99")


def _jobs(out: Path, warm_path: str) -> list[dict]:
    jobs = []
    for seed in SEEDS:
        for arm in DECISION_STUDY_ARMS:
            jobs.append({
                "key": f"{DECISION_COPY_TASK}/{arm.name}", "task": DECISION_COPY_TASK, "method": arm.name,
                "label": arm.label, "config": dict(arm.config), "train": arm.train, "seed": seed,
                "steps": STEPS if arm.train else 0, "eval_every": EVAL_EVERY, "eval_prompts": EVAL_PROMPTS,
                "eval_split": "eval", "eval_sets": {"test": ("test", TEST_PROMPTS)}, "eval_samples": 8,
                "prompts_per_step": 16, "num_generations": 8, "learning_rate": 1e-4, "warm_path": warm_path,
                "run_dir": str(out / arm.name / f"seed{seed}")})
    return [j for j in jobs if not (Path(j["run_dir"]) / "history.json").exists()]


def run(out: Path, workers: int) -> None:
    from calibrl.testbed.runner import run_jobs
    from calibrl.testbed.warmstart import WarmStartConfig, warm_start

    warm = str(warm_start(DECISION_COPY_TASK, WarmStartConfig.for_task(DECISION_COPY_TASK),
                          log=lambda m: print(m, flush=True)))
    jobs = _jobs(out, warm)
    start = time.time()
    print(f"{len(jobs)} run(s) to do", flush=True)

    def progress(msg: dict) -> None:
        if "metrics" in msg and msg["step"] == msg["total"]:
            m = msg["metrics"]
            print(f"[{time.time() - start:5.0f} s] {msg['key']} seed {msg['seed']} done: accuracy "
                  f"{m['expected_accuracy']:.3f} dec ECE {m['dec_ece']:.3f} calib_err {m['calib_err']:.3f}",
                  flush=True)

    if jobs:
        run_jobs(jobs, workers=workers, on_progress=progress)


def collect(out: Path) -> dict:
    """Every run's raw records from ``out``: the per-evaluation history of each arm and seed, each run's decision
    confidences and drawn outcomes on the test prompts at its last step (for the AURC), and GRPO's last-step
    eval-set and test-set decision samples (for the post-hoc baselines). The data file of docs/results/decision.md
    (``--save``); :func:`analyze` reads only this. ``times``: each run's UTC start and end."""
    from calibrl.testbed.runner import run_times

    arms = [a.name for a in DECISION_STUDY_ARMS]
    data: dict = {"config": {"seeds": list(SEEDS), "steps": STEPS, "eval_every": EVAL_EVERY,
                             "eval_prompts": EVAL_PROMPTS, "test_prompts": TEST_PROMPTS},
                  "history": {}, "times": {}, "test_final": {}, "grpo_samples": {}}
    for arm in arms:
        for s in SEEDS:
            run_dir = out / arm / f"seed{s}"
            record = json.loads((run_dir / "history.json").read_text())
            history = record["history"]
            data["times"].setdefault(arm, {})[str(s)] = run_times(record)
            step = history[-1]["step"]
            data["history"].setdefault(arm, {})[str(s)] = history
            with np.load(run_dir / "eval_set_samples.npz") as npz:
                data["test_final"].setdefault(arm, {})[str(s)] = {
                    "step": step, **_columns({k: npz[f"test/step{step}/{k}"] for k in ("dec_conf", "correct")})}
    for s in SEEDS:
        run_dir = out / "grpo" / f"seed{s}"
        fit = dict(np.load(run_dir / "final_samples.npz"))  # the eval set at the last step
        with np.load(run_dir / "eval_set_samples.npz") as npz:
            test = _columns({k: npz[f"test/step{STEPS}/{k}"]
                             for k in ("dec_conf", "correct", "p_yes", "q_true", "prompt_index")})
        data["grpo_samples"][str(s)] = {"fit": _columns({k: fit[k] for k in ("dec_conf", "correct")}), "test": test}
    return data


def _history(data: dict, arm: str, seed: int) -> list[dict]:
    return data["history"][arm][str(seed)]


def _mean(values) -> float:
    values = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


def _columns(arrays: dict[str, np.ndarray]) -> dict:
    """Sample arrays as JSON lists (NaN as null), with their dtypes so that :func:`_arrays` reads them back exactly."""
    out: dict = {k: [None if isinstance(v, float) and not np.isfinite(v) else v for v in a.tolist()]
                 for k, a in arrays.items()}
    out["dtypes"] = {k: a.dtype.str for k, a in arrays.items()}
    return out


def _arrays(columns: dict) -> dict[str, np.ndarray]:
    """Inverse of :func:`_columns` (null back to NaN)."""
    return {k: np.array([np.nan if v is None else v for v in values], dtype=np.dtype(columns["dtypes"][k]))
            for k, values in columns.items() if k not in ("dtypes", "step")}


def posthoc(data: dict, seed: int) -> dict[str, dict[str, float]]:
    """GRPO's final test decisions after temperature scaling / isotonic regression fitted on its final eval-set
    decision confidences and drawn outcomes (and unchanged): decision ECE, and mean |q'(Y) - p(x)| over samples
    with a right sum (q'(Y) = the recalibrated confidence of Y: c' when Y was decided, 1 - c' otherwise)."""
    from calibrl import metrics as M
    from calibrl.posthoc import get_posthoc
    from calibrl.testbed import tasks as tb

    samples = data["grpo_samples"][str(seed)]
    fit, test = _arrays(samples["fit"]), _arrays(samples["test"])
    p_true = np.array([r["p_true"] for r in tb.build_rows(DECISION_COPY_TASK, TEST_PROMPTS, split="test", seed=0)])
    has_fit, has = np.isfinite(fit["dec_conf"]), np.isfinite(test["dec_conf"])
    x_fit, y_fit = fit["dec_conf"][has_fit], fit["correct"][has_fit].astype(bool)
    conf, correct = test["dec_conf"][has], test["correct"][has].astype(bool)
    decided_yes = test["dec_conf"][has] == test["p_yes"][has]  # dec_conf is q of the decided class
    right_sum = test["q_true"][has] > 0
    p = p_true[test["prompt_index"][has]]
    results = {}
    for name in ("none", "temperature", "isotonic"):
        c = conf if name == "none" else get_posthoc(name).fit(x_fit, y_fit).transform(conf)
        q_yes = np.where(decided_yes, c, 1.0 - c)
        results[name] = {"dec_ece": float(M.ece(c, correct, n_bins=10, strategy="quantile")),
                         "calib_err": float(np.abs(q_yes - p)[right_sum].mean())}
    return results


def decision_aurc(data: dict, arm: str, seed: int) -> float:
    """AURC (area under the risk-coverage curve, lower is better) of the decision confidence against the drawn
    outcomes of the run's test samples at its last step: abstaining on the least confident decisions."""
    from calibrl.metrics import aurc

    final = _arrays(data["test_final"][arm][str(seed)])
    conf, correct = final["dec_conf"], final["correct"].astype(bool)
    has = np.isfinite(conf)
    return float(aurc(conf[has], correct[has]))


def analyze(data: dict) -> dict:
    arms = [a.name for a in DECISION_STUDY_ARMS]
    hist = {arm: {s: _history(data, arm, s) for s in SEEDS} for arm in arms}
    chosen = {}
    for variant, label, _ in DECISION_VARIANTS:
        scores = {lam: _mean(hist[f"ce_{variant}_lam{lam:g}"][s][-1]["calib_err"] for s in SEEDS)
                  for lam in DECISION_LAMBDAS}
        chosen[variant] = {"lambda": min(scores, key=lambda lam: (np.nan_to_num(scores[lam], nan=np.inf), lam)),
                           "eval_calib_err_by_lambda": scores, "label": label}
    final = {}
    for arm in ["sft", "grpo"] + [f"ce_{v}_lam{c['lambda']:g}" for v, c in chosen.items()]:
        final[arm] = {k: _mean(hist[arm][s][-1]["test"].get(k) for s in SEEDS) for k in TEST_KEYS}
        final[arm]["eval_expected_accuracy"] = _mean(hist[arm][s][-1]["expected_accuracy"] for s in SEEDS)
        final[arm]["aurc"] = _mean(decision_aurc(data, arm, s) for s in SEEDS)
    matched = {}
    for variant, c in chosen.items():
        arm = f"ce_{variant}_lam{c['lambda']:g}"
        rows = []
        for s in SEEDS:
            target = hist[arm][s][-1]["expected_accuracy"]
            step = next((r for r in hist["grpo"][s] if r["step"] > 0 and r["expected_accuracy"] >= target), None)
            rows.append(None if step is None else {"step": step["step"], **{k: step["test"].get(k) for k in TEST_KEYS}})
        reached = [r for r in rows if r is not None]
        matched[arm] = {"grpo_steps": [r and r["step"] for r in rows], "n_seeds": len(reached),
                        **{k: _mean(r[k] for r in reached) for k in TEST_KEYS}}
    interpolated = {arm: interpolated_grpo(hist["grpo"], {s: hist[arm][s][-1]["expected_accuracy"] for s in SEEDS})
                    for arm in matched}
    per_seed = [posthoc(data, s) for s in SEEDS]
    post = {name: {k: _mean(r[name][k] for r in per_seed) for k in ("dec_ece", "calib_err")}
            for name in ("none", "temperature", "isotonic")}
    return {"chosen": chosen, "final": final, "grpo_at_matched_accuracy": matched,
            "grpo_interpolated_at_matched_accuracy": interpolated, "grpo_posthoc": post}


def interpolated_grpo(grpo: dict[int, list[dict]], targets: dict[int, float]) -> dict:
    """GRPO's test metrics at each seed's ``targets[seed]`` eval expected accuracy, interpolated linearly in eval
    accuracy between the first two consecutive evaluations that bracket it (step 0 included); a target at or below
    the start's accuracy is read at the start (``below_start`` counts those seeds), one above every evaluation is
    left out (``n_seeds`` counts the rest). Returns the seed means of :data:`TEST_KEYS` and the per-seed bracket."""
    rows, brackets, below = [], [], 0
    for s, target in targets.items():
        curve = grpo[s]
        if target <= curve[0]["expected_accuracy"]:
            below += 1
            rows.append({k: curve[0]["test"].get(k) for k in TEST_KEYS})
            brackets.append("start")
            continue
        i = next((i for i in range(1, len(curve)) if curve[i]["expected_accuracy"] >= target), None)
        if i is None:
            brackets.append(None)
            continue
        a, b = curve[i - 1], curve[i]
        w = (target - a["expected_accuracy"]) / (b["expected_accuracy"] - a["expected_accuracy"])
        rows.append({k: None if a["test"].get(k) is None or b["test"].get(k) is None
                     else (1 - w) * a["test"][k] + w * b["test"][k] for k in TEST_KEYS})
        brackets.append(f"{a['step']}-{b['step']}")
    return {"brackets": brackets, "n_seeds": len(rows), "below_start": below,
            **{k: _mean(r[k] for r in rows) for k in TEST_KEYS}}


def report(result: dict) -> str:
    cols = ("dec_ece", "calib_err", "expected_accuracy", "greedy_decision_accuracy", "frac_conf_99", "aurc")
    titles = ("decision ECE ↓", "mean abs(q - p) ↓", "accuracy (sampled) ↑", "accuracy (argmax decision) ↑",
              "decisions with q > 0.99", "AURC ↓")
    fmt = lambda v: "" if v is None or not np.isfinite(v) else f"{v:.3f}"  # noqa: E731
    names = {"sft": "SFT warm start", "grpo": "GRPO"}
    names.update({f"ce_{v}_lam{c['lambda']:g}": f"+ CE, {c['label']} (lambda {c['lambda']:g})"
                  for v, c in result["chosen"].items()})
    lines = ["## Test prompts, last step (mean of seeds " + ", ".join(map(str, SEEDS)) + ")", "",
             "| arm (lambda chosen on eval) | " + " | ".join(titles) + " |", "|---|" + "---:|" * len(cols)]
    for arm, row in result["final"].items():
        lines.append(f"| {names.get(arm, arm)} | " + " | ".join(fmt(row[k]) for k in cols) + " |")
    lines += ["", "## GRPO at the chosen arms' sampled accuracy (read on its eval curve)", "",
              "| arm | GRPO steps (per seed) | GRPO decision ECE | GRPO mean abs(q - p) | GRPO accuracy (expected) |",
              "|---|---|---:|---:|---:|"]
    for arm, row in result["grpo_at_matched_accuracy"].items():
        lines.append(f"| {arm} | {row['grpo_steps']} | {fmt(row['dec_ece'])} | {fmt(row['calib_err'])} | "
                     f"{fmt(row['expected_accuracy'])} |")
    if "grpo_interpolated_at_matched_accuracy" in result:
        lines += ["", "## GRPO at the chosen arms' sampled accuracy, interpolated on its eval curve", "",
                  "| arm | GRPO evaluations bracketing it (per seed) | GRPO decision ECE | GRPO mean abs(q - p) | "
                  "GRPO accuracy (expected) |", "|---|---|---:|---:|---:|"]
        for arm, row in result["grpo_interpolated_at_matched_accuracy"].items():
            lines.append(f"| {arm} | {', '.join(str(b) for b in row['brackets'])} | {fmt(row['dec_ece'])} | "
                         f"{fmt(row['calib_err'])} | {fmt(row['expected_accuracy'])} |")
    post = result["grpo_posthoc"]
    lines += ["", "## Post-hoc calibration of GRPO (fitted on eval, read on test)", "",
              "| recalibration | decision ECE ↓ | mean abs(q - p) ↓ |", "|---|---:|---:|"]
    lines += [f"| {name} | {fmt(v['dec_ece'])} | {fmt(v['calib_err'])} |" for name, v in post.items()]
    lines += ["", "## lambda chosen on eval (mean eval calib_err at the last step)", ""]
    for variant, c in result["chosen"].items():
        scores = ", ".join(f"{lam:g}: {fmt(v)}" for lam, v in c["eval_calib_err_by_lambda"].items())
        lines.append(f"- {c['label']}: lambda {c['lambda']:g} ({scores})")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decision_study"))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--save", type=Path, default=None,
                        help="also write the runs' raw records (collect(); .json.gz compressed) to this file")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    if not options.report_only:
        run(options.out, options.workers)
    data = collect(options.out)
    if options.save:
        save_data(data, options.save)
    result = analyze(data)
    (options.out / "analysis.json").write_text(json.dumps(result, indent=1, default=str))
    text = report(result)
    (options.out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
