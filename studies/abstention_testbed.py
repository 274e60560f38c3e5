"""Which training comes closest to the optimal "I don't know"? The testbed's abstain task, where the Bayes-optimal
policy is known (protocol written before the runs: docs/protocols/abstention_testbed.md).

    python -m studies.abstention_testbed run --workers 2     # 5 arms x 5 seeds (resumable: a run's file ends it)
    python -m studies.abstention_testbed report              # docs/results/abstention_testbed.md from the files

Task ``testbed/abstain`` (:mod:`calibrl.testbed.tasks`): ``stochastic_reasoning`` with a decline (``ss;?``) and a
quarter of the prompts with a digit hidden (no right answer). Under the risk threshold t = 0.65 (right 1, wrong
-t / (1 - t), declining 0) the optimal policy answers the likely digit iff its success probability c(x) > t and
declines otherwise, always on the unanswerable prompts; each sample's expected reward is known exactly, so each
policy's regret (expected reward lost against that optimum, :func:`calibrl.metrics.stated_abstention.
risk_threshold_regret`) is too. The warm start declines 20% of the time at random. Arms (:data:`ARMS`), each from
its task's warm start, same budget:

- ``grpo_binary``: GRPO on the binary reward (a decline is right only on an unanswerable prompt), then a threshold
  on the mean token log-prob chosen afterwards on the calibration prompts (``grpo_binary`` + threshold);
- ``grpo_risk``, ``capo_risk``: GRPO and CAPO (tau 0.6) on the risk-threshold reward;
- ``rlcr_risk``: GRPO on ``testbed/abstain_verbalized`` (the same prompts and law, a stated confidence digit after
  an answer) with the risk-threshold reward plus RLCR's Brier term;
- ``grpo_ternary``: GRPO on TruthRL's ternary reward (+1 / 0 / -1: answering pays iff P(right) > 0.5, not t).

Each run writes ``<out>/<arm>_seed<k>.json.gz``: its evaluations (every ``--eval-every`` steps, 8 samples of 256
test prompts), its final samples on the test prompts and on 256 calibration prompts (the eval split), its UTC start
and end and the commit. The report reads those files alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from calibrl.testbed.report import format_interval, paired_t_interval

OUT = Path("docs/results/abstention_testbed")
PAGE = "docs/results/abstention_testbed.md"
PROTOCOL = "docs/protocols/abstention_testbed.md"
TEST_PROMPTS = 256
CALIBRATION_PROMPTS = 256
SAMPLES = 8
SEEDS = 5
STEPS = 400
EVAL_EVERY = 50
LR = 3e-4


@dataclass(frozen=True)
class Arm:
    """An arm: its task, its reward scheme (:data:`calibrl.testbed.tasks.ABSTAIN_SCHEMES`), its trainer fields."""

    task: str
    scheme: str
    label: str
    config: dict = field(default_factory=dict)


ARMS: dict[str, Arm] = {
    "grpo_binary": Arm("abstain", "binary", "GRPO, binary reward",
                       {"advantage_estimator": "grpo"}),
    "grpo_risk": Arm("abstain", "risk", "GRPO, risk-threshold reward", {"advantage_estimator": "grpo"}),
    "capo_risk": Arm("abstain", "risk", "CAPO (tau 0.6), risk-threshold reward",
                     {"advantage_estimator": "capo", "capo_tau": 0.6}),
    "rlcr_risk": Arm("abstain_verbalized", "rlcr_risk", "RLCR: risk-threshold reward + Brier of the stated confidence",
                     {"advantage_estimator": "grpo"}),
    "grpo_ternary": Arm("abstain", "ternary", "GRPO, ternary reward (TruthRL: +1 / 0 / -1)",
                        {"advantage_estimator": "grpo"}),
}
REFERENCE = "grpo_binary"  # the arms are compared with it, read with its threshold chosen afterwards


# ------------------------------------------------------------------------------------------------ evaluation


def sample_outcomes(model, tok, task: str, prompts: list[str], *, seed: int) -> dict[str, np.ndarray]:
    """``SAMPLES`` completions per prompt at T = 1 (a fixed sampling seed: the same draws for every arm's policy
    where the policies agree) and each one's exact figures: ``success`` (P(right) as the binary grading reads it),
    ``abstained``, ``answerable``, ``best`` (its prompt's best success probability), ``drawn`` (one fixed draw of
    the outcome), ``logprob_mean``, ``prompt_index``."""
    from calibrl.testbed import tasks as tb
    from calibrl.testbed.warmstart import sample_completions

    res = sample_completions(model, tok, prompts, n=SAMPLES, max_new_tokens=tb.get_task(task).max_completion_length,
                             seed=seed)
    parsed = [tb.parse(task, p, c) for p, c in zip(res["prompt"], res["completion"])]
    success = np.array([tb.true_success_probability(task, p, c) for p, c in zip(res["prompt"], res["completion"])])
    return {"prompt_index": np.asarray(res["prompt_index"]), "logprob_mean": np.asarray(res["logprob_mean"]),
            "success": success, "abstained": np.array([x["abstained"] for x in parsed], dtype=bool),
            "answerable": np.array([tb.prompt_answerable(p) for p in res["prompt"]], dtype=bool),
            "best": np.array([tb.best_success_probability(task, p) for p in res["prompt"]]),
            "drawn": np.random.default_rng(seed).random(len(success)) < success,
            "format_ok": np.array([x["format_ok"] for x in parsed], dtype=bool)}


def figures(samples: dict[str, np.ndarray], *, abstained: np.ndarray | None = None) -> dict[str, float]:
    """An evaluation's figures from its samples (``abstained``: another decline rule, e.g. a threshold's, in place
    of the model's own): regret, expected reward and the optimum (means over prompts), answer rate, expected
    accuracy among the answers, the expected share of confident wrong answers among all samples (hallucination),
    the decline rates on each kind of prompt, and the expected accuracy of the answers on answerable prompts."""
    from calibrl.metrics.stated_abstention import declined_by_kind, risk_threshold_regret
    from calibrl.testbed.tasks import ABSTAIN_THRESHOLD

    a = samples["abstained"] if abstained is None else np.asarray(abstained, dtype=bool)
    s, can = samples["success"], samples["answerable"]
    r = risk_threshold_regret(s, a, samples["best"], samples["prompt_index"], threshold=ABSTAIN_THRESHOLD)
    answered = ~a
    declined_unanswerable, declined_answerable = declined_by_kind(a, can)
    return {"regret": r.regret, "utility": r.utility, "optimum": r.optimum,
            "answer_rate": float(answered.mean()),
            "accuracy_answered": float(s[answered].mean()) if answered.any() else math.nan,
            "hallucination_rate": float(((1.0 - s) * answered).mean()),
            "declined_unanswerable": declined_unanswerable, "declined_answerable": declined_answerable,
            "format_ok": float(samples["format_ok"].mean())}


def threshold_after(calibration: dict[str, np.ndarray]) -> float:
    """The threshold on ``logprob_mean`` chosen afterwards on the calibration samples: a sample answers iff the
    model does not decline and its mean token log-prob is at least the threshold, chosen to maximise the drawn
    risk-threshold reward there (mean over samples; -inf keeps every answer). What a user without the true
    probabilities can do."""
    from calibrl.tasks.abstention import risk_threshold_reward
    from calibrl.testbed.tasks import ABSTAIN_THRESHOLD

    lpm, own = calibration["logprob_mean"], calibration["abstained"]
    value = risk_threshold_reward(calibration["drawn"] & ~own, own, threshold=ABSTAIN_THRESHOLD)
    # answering sample i earns value_i (0 where the model declined anyway); a threshold keeps those with lpm >= it
    order = np.argsort(-lpm, kind="stable")
    gains = np.concatenate([[0.0], np.cumsum(np.where(own, 0.0, value)[order])])
    candidates = np.concatenate([[np.inf], lpm[order]])
    # ties: a threshold keeps every sample of its value, so only the last of a run of equal values is reachable
    reachable = np.r_[True, np.r_[lpm[order][1:] != lpm[order][:-1], True]]
    best = int(np.argmax(np.where(reachable, gains, -np.inf)))
    return float(candidates[best]) if best > 0 else math.inf


# ------------------------------------------------------------------------------------------------------ runs


def run_file(out: Path, arm: str, seed: int) -> Path:
    return Path(out) / f"{arm}_seed{seed}.json.gz"


def _arrays(samples: dict[str, np.ndarray]) -> dict[str, list]:
    return {k: (np.round(v, 6).tolist() if v.dtype.kind == "f" else v.astype(int).tolist()) for k, v in samples.items()}


def _from_lists(samples: dict[str, list]) -> dict[str, np.ndarray]:
    kinds = {"abstained": bool, "answerable": bool, "drawn": bool, "format_ok": bool, "prompt_index": np.int64}
    return {k: np.asarray(v, dtype=kinds.get(k, np.float64)) for k, v in samples.items()}


def run_arm(arm: str, *, seed: int, steps: int, eval_every: int, lr: float) -> dict:
    """Warm start, then ``steps`` steps of ``arm``; its evaluations and final samples."""
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from calibrl.testbed import tasks as tb
    from calibrl.testbed.evaluate import eval_prompts_for
    from calibrl.testbed.warmstart import WarmStartConfig, load_warm_start, warm_start
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

    spec = ARMS[arm]
    torch.manual_seed(seed)
    model, tok = load_warm_start(warm_start(spec.task, WarmStartConfig.for_task(spec.task, max_steps=1500)))
    test = eval_prompts_for(spec.task, TEST_PROMPTS, split="test")
    calibration = eval_prompts_for(spec.task, CALIBRATION_PROMPTS, split="eval")
    history: list[dict] = []
    final: dict = {}

    def evaluate(step: int) -> None:
        was = model.training
        samples = sample_outcomes(model, tok, spec.task, test, seed=10_000)
        history.append({"step": step, **figures(samples)})
        if step == steps:
            final["test"] = samples
            final["calibration"] = sample_outcomes(model, tok, spec.task, calibration, seed=20_000)
        model.train(was)
        h = history[-1]
        print(f"  {arm} seed {seed} step {step}: regret {h['regret']:.3f}, answer rate {h['answer_rate']:.2f}, "
              f"declines unanswerable {h['declined_unanswerable']:.2f} / answerable {h['declined_answerable']:.2f}",
              flush=True)

    class Evaluate(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % eval_every == 0 or state.global_step == steps:
                evaluate(state.global_step)

    evaluate(0)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = CalibratedGRPOConfig(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=128, num_generations=8,
            max_completion_length=tb.get_task(spec.task).max_completion_length, learning_rate=lr,
            lr_scheduler_type="constant", warmup_steps=0, beta=0.0, temperature=1.0, top_k=0, top_p=1.0,
            logging_steps=eval_every, report_to="none", save_strategy="no", use_cpu=True, seed=seed, data_seed=seed,
            bf16=False, disable_tqdm=True, weight_decay=0.0, max_grad_norm=1.0, dataloader_num_workers=0,
            calibration_logging=False, **spec.config)
        trainer = CalibratedGRPOTrainer(
            model=model, reward_funcs=[tb.make_reward(spec.task, seed=seed, scheme=spec.scheme)], args=cfg,
            processing_class=tok, train_dataset=tb.build_dataset(spec.task, 2000, split="train", seed=0),
            callbacks=[Evaluate()])
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        trainer.train()
    return {"history": history, "final": {k: _arrays(v) for k, v in final.items()}}


def _one_run(arm: str, seed: int, steps: int, eval_every: int, lr: float, out: str, commit: str) -> str:
    import torch

    from calibrl._files import write_then_rename
    from calibrl.testbed.runner import utc_now

    torch.set_num_threads(1)
    started_utc, start = utc_now(), time.perf_counter()
    print(f"{started_utc} start {arm} seed {seed}", flush=True)
    result = run_arm(arm, seed=seed, steps=steps, eval_every=eval_every, lr=lr)
    record = {"arm": arm, "seed": seed, "steps": steps, "eval_every": eval_every, "lr": lr,
              "settings": asdict(ARMS[arm]), "started_utc": started_utc, "finished_utc": utc_now(),
              "seconds": round(time.perf_counter() - start, 1), "commit": commit, **result}
    path = run_file(Path(out), arm, seed)
    write_then_rename(path, gzip.compress(json.dumps(record).encode(), mtime=0))
    print(f"{record['finished_utc']} done {arm} seed {seed}: {record['seconds']:.0f} s -> {path}", flush=True)
    return str(path)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        sys.exit(f"--arms: unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    todo = [(arm, seed) for seed in seeds for arm in arms if not run_file(out, arm, seed).exists()]
    print(f"{len(todo)} runs to do: {', '.join(f'{a}/{s}' for a, s in todo)}", flush=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["OMP_NUM_THREADS"] = "1"
    commit = _commit()
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_one_run, arm, seed, args.steps, args.eval_every, args.lr, str(out), commit): (arm, seed)
                   for arm, seed in todo}
        for future in as_completed(futures):
            future.result()  # a failed run stops the job; the finished runs' files are kept


# ---------------------------------------------------------------------------------------------------- report


def load(folder: Path = OUT) -> list[dict]:
    """Every run record in ``folder`` (arm order of :data:`ARMS`, then seed)."""
    records = [json.loads(gzip.decompress(p.read_bytes())) for p in sorted(Path(folder).glob("*_seed*.json.gz"))]
    order = list(ARMS)
    return sorted(records, key=lambda r: (order.index(r["arm"]), r["seed"]))


def final_figures(record: dict) -> dict[str, dict[str, float]]:
    """A run's end: ``own`` (the model's own declines) and ``threshold`` (its declines plus a threshold on the mean
    token log-prob chosen on the calibration prompts, :func:`threshold_after`) on the test prompts."""
    test = _from_lists(record["final"]["test"])
    cut = threshold_after(_from_lists(record["final"]["calibration"]))
    with_threshold = test["abstained"] | (test["logprob_mean"] < cut)
    return {"own": figures(test), "threshold": {**figures(test, abstained=with_threshold), "cut": cut}}


def endpoints(records: list[dict]) -> dict:
    """The protocol's endpoints: each arm's final regret as a policy (grpo_binary with its threshold, the others by
    their own declines), and each arm's paired difference from grpo_binary + threshold (same seeds)."""
    by = {}
    for r in records:
        by.setdefault(r["arm"], {})[r["seed"]] = final_figures(r)
    policy = {arm: {seed: f["threshold" if arm == REFERENCE else "own"] for seed, f in runs.items()}
              for arm, runs in by.items()}
    out = {"regret": {arm: paired_t_interval([f["regret"] for f in runs.values()])
                      for arm, runs in policy.items()},
           "paired": {}}
    ref = policy.get(REFERENCE, {})
    for arm, runs in policy.items():
        if arm == REFERENCE:
            continue
        seeds = sorted(set(runs) & set(ref))
        differences = [runs[s]["regret"] - ref[s]["regret"] for s in seeds]
        out["paired"][arm] = (paired_t_interval(differences), len(seeds))
    return {**out, "by": by}


ROW_KEYS = (("regret", "regret ↓"), ("utility", "expected reward"), ("answer_rate", "answer rate"),
            ("accuracy_answered", "accuracy of the answers"), ("hallucination_rate", "wrong answers among all ↓"),
            ("declined_unanswerable", "declines, unanswerable ↑"), ("declined_answerable", "declines, answerable"))


def plot(records: list[dict], path: Path) -> Path:
    """Left: each arm's regret along training (its own declines; mean over seeds), the optimum at 0. Right: each
    run's end as a policy (grpo_binary with its threshold: hollow diamonds) in the (answer rate, accuracy of the
    answers) plane, beside the optimal policy's point. One colour per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ends = endpoints(records)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.4))
    for i, (arm, spec) in enumerate(ARMS.items()):
        runs = [r for r in records if r["arm"] == arm]
        if not runs:
            continue
        color = plt.cm.tab10(i)  # one colour per arm, the same in both panels
        steps = [h["step"] for h in runs[0]["history"]]
        regret = np.mean([[h["regret"] for h in r["history"]] for r in runs], axis=0)
        left.plot(steps, regret, marker="o", markersize=4, color=color, label=spec.label)
        rule = "threshold" if arm == REFERENCE else "own"
        ends_of_arm = [f[rule] for f in ends["by"][arm].values()]
        if arm == REFERENCE:  # its policy: the threshold chosen afterwards, at the end
            left.plot([steps[-1]], [np.mean([f["regret"] for f in ends_of_arm])], marker="D", markersize=8,
                      color=color, markerfacecolor="none", linestyle="none",
                      label=f"{spec.label}, + a threshold chosen afterwards (at the end)")
        right.plot([f["answer_rate"] for f in ends_of_arm], [f["accuracy_answered"] for f in ends_of_arm],
                   marker="D" if arm == REFERENCE else "o", markerfacecolor="none" if arm == REFERENCE else color,
                   color=color, linestyle="none", markersize=7)
    optimum = optimal_point()
    right.plot([optimum[0]], [optimum[1]], marker="*", color="black", markersize=14, linestyle="none",
               label="the optimal policy")
    left.axhline(0.0, color="black", linewidth=0.8)
    left.set(title="Regret along training (mean over seeds)", xlabel="training step",
             ylabel="regret: expected reward lost per prompt")
    right.set(title="Each run at the end, as a policy", xlabel="answer rate",
              ylabel="expected accuracy of the answers")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    handles += right.get_legend_handles_labels()[0]
    labels += right.get_legend_handles_labels()[1]
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False, fontsize="small")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def optimal_point() -> tuple[float, float]:
    """(answer rate, expected accuracy of the answers) of the optimal policy on the test prompts: it answers the
    likely digit where c(x) > t."""
    from calibrl.testbed import tasks as tb
    from calibrl.testbed.evaluate import eval_prompts_for

    best = np.array([tb.best_success_probability("abstain", p) for p in eval_prompts_for("abstain", TEST_PROMPTS)])
    answered = best > tb.ABSTAIN_THRESHOLD
    return float(answered.mean()), float(best[answered].mean())


def readings(ends: dict) -> list[str]:
    """The primary comparisons in words, each no larger than its interval, and where each policy ends against the
    optimal one (answer rate, accuracy of the answers)."""
    out = []
    for arm, (interval, n) in ends["paired"].items():
        mean, low, high = interval
        label = ARMS[arm].label
        if n < 2 or not np.isfinite(low):
            out.append(f"- {label}: not resolvable (fewer than 2 paired seeds).")
        elif low > 0 or high < 0:
            side = "more" if low > 0 else "less"
            out.append(f"- {label}: {side} regret than GRPO + a threshold chosen afterwards, by "
                       f"{format_interval(interval)} "
                       f"(resolved: the interval excludes 0; {n} paired seeds).")
        else:
            out.append(f"- {label}: not resolved from GRPO + a threshold chosen afterwards, "
                       f"{format_interval(interval)} "
                       f"({n} paired seeds; the interval contains 0).")
    rate, accuracy = optimal_point()
    out += ["", f"The optimal policy answers {rate:.3f} of the test samples, right {accuracy:.3f} of the time on "
            "average. At the end, as policies (means over seeds):"]
    for arm, runs in ends["by"].items():
        rule = "threshold" if arm == REFERENCE else "own"
        answer_rate = np.mean([f[rule]["answer_rate"] for f in runs.values()])
        right = np.nanmean([f[rule]["accuracy_answered"] for f in runs.values()])
        name = ARMS[arm].label + (", + a threshold chosen afterwards" if arm == REFERENCE else "")
        out.append(f"- {name}: answers {answer_rate:.3f}, right {right:.3f} of the time.")
    return out


def page(records: list[dict], *, figure: str | None = None) -> str:
    """docs/results/abstention_testbed.md from the run records alone (``figure``: the plot's file name)."""
    ends = endpoints(records)
    seeds = sorted({r["seed"] for r in records})
    steps = sorted({r["steps"] for r in records})
    arms = [arm for arm in ARMS if arm in ends["regret"]]
    first = records[0]["history"][0]
    lines = [
        "# Abstention on the testbed: which training comes closest to the optimal \"I don't know\"?", "",
        f"Data: `{OUT}/` (one file per run: its evaluations, its final samples, its UTC start and end and its "
        "commit). This page is written whole from those files by `python -m studies.abstention_testbed report`, "
        "and rebuilt by `python -m studies.reproduce --only abstention_testbed`.", "",
        f"Protocol: [{Path(PROTOCOL).name}](../protocols/{Path(PROTOCOL).name}), committed before the runs.", "",
        f"Task `testbed/abstain`: the risk threshold t = 0.65; a quarter of the prompts have no right answer. "
        f"{len(arms)} arms x {len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({', '.join(map(str, seeds))}), "
        f"{', '.join(map(str, steps))} steps each (128 completions a step). "
        f"Regret: the expected reward lost against the optimal policy, per prompt, averaged over the "
        f"{TEST_PROMPTS} test prompts ({SAMPLES} samples each; 0 is the optimum, whose expected reward here is "
        f"{first['optimum']:.3f}).", "",
        *([f"![Regret along training, and each run's end as a policy]({figure})", ""] if figure else []),
        "## Primary endpoint: regret at the end, and its difference from GRPO + a threshold chosen afterwards", "",
        "Mean over seeds with the 95% t-interval (the run is the unit); the difference is paired by seed.", "",
        "| arm (as a policy) | regret ↓ | minus GRPO + threshold's |", "|---|---:|---:|"]
    for arm, spec in ARMS.items():
        if arm not in ends["regret"]:
            continue
        label = spec.label if arm != REFERENCE else "GRPO, binary reward, + a threshold chosen afterwards"
        diff = ends["paired"].get(arm)
        shown = format_interval(diff[0]) if diff else "(reference)"
        lines.append(f"| {label} | {format_interval(ends['regret'][arm])} | {shown} |")
    lines += ["", *readings(ends), "",
              "## Each arm at the end, by its own declines and with a threshold chosen afterwards", "",
              "Means over seeds. \"own\": the model's declines alone; \"+ threshold\": also declining where the mean "
              "token log-prob is below the threshold that maximised the drawn reward on the calibration prompts.", "",
              "| arm | rule | " + " | ".join(title for _, title in ROW_KEYS) + " |",
              "|---|---|" + "---:|" * len(ROW_KEYS)]
    warm = [r["history"][0] for r in records if r["arm"] == REFERENCE]  # step 0: the warm start, every seed alike
    lines.append("| warm start | own | " + " | ".join(f"{np.mean([h[k] for h in warm]):.3f}" for k, _ in ROW_KEYS)
                 + " |")
    for arm, runs in ends["by"].items():
        for rule, name in (("own", "own"), ("threshold", "+ threshold")):
            cells = [np.nanmean([f[rule][k] for f in runs.values()]) for k, _ in ROW_KEYS]
            lines.append(f"| {ARMS[arm].label} | {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def report(args) -> None:
    from calibrl._files import write_then_rename

    records = load(Path(args.out))
    if not records:
        sys.exit(f"{args.out}: no run records (*_seed*.json.gz)")
    figure = Path(args.page).with_suffix(".png")
    plot(records, figure)
    write_then_rename(args.page, page(records, figure=figure.name))
    print(f"written {args.page} and {figure} from {len(records)} runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train the arms (skips runs whose file exists)")
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--seeds", type=int, default=SEEDS)
    r.add_argument("--first-seed", type=int, default=0)
    r.add_argument("--steps", type=int, default=STEPS)
    r.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    r.add_argument("--lr", type=float, default=LR)
    r.add_argument("--arms", default=",".join(ARMS))
    r.add_argument("--out", default=str(OUT))
    p = sub.add_parser("report", help="write the results page from the run files")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--page", default=PAGE)
    args = parser.parse_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
