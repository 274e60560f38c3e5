"""RLCR on the testbed: does a Brier reward teach the tiny model to state a calibrated confidence?

    python -m studies.rlcr                                # 3 seeds x 3 arms, 800 steps each (about 2 min per run)
    python -m studies.rlcr --seeds 1 --steps 100          # a quick look

Task ``testbed/verbalized``: completions ``ss;A:k`` (digit sum, answer digit, stated confidence k/10); the answer
is right with the task's known probability, so every stated confidence can be compared with the truth. The warm
start (SFT) states k at random: it knows nothing of its own chances. Arms, all from that warm start, same budget
(16 prompts x 8 samples per step, T = 1, lr 3e-4 constant, beta 0), rewards drawn fresh from the true probability:

- ``grpo``: GRPO on correctness alone (the confidence digit earns nothing: a control for "training alone does it");
- ``capo``: CAPO (tau 0.6) on correctness alone (its confidence is the sequence's: exp(mean log-prob));
- ``rlcr``: GRPO on RLCR's reward 1[correct] - (k/10 - 1[correct])^2 (arXiv 2507.16806).

Every ``--eval-every`` steps each arm samples 8 completions of 128 held-out prompts (seeded, the same for every
arm) and records expected accuracy (mean true probability), the share of completions that state a confidence, the
stated confidence's ECE / AUROC / Brier / mean |stated - true probability| over those, and the sequence
confidence's AUROC, per-token entropy and the AUROC ceiling (the last two read by studies/newer_methods.py, which
runs further arms through :class:`Arm` settings and :func:`run_arm`). The tables: the last evaluation (mean and spread
over seeds) and each metric read at matched expected accuracy (linear interpolation along each arm's own curve at
accuracies every arm reaches). lr 3e-4 was set after a first 100-step run at 1e-4 barely moved the stated
confidence (see docs/results/rlcr.md on what that run read). Results: ``--out`` (default runs/rlcr/results.json):
every evaluation of every run (docs/results/rlcr_results.json, from which :func:`tables` rebuilds rlcr.md's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calibrl.testbed.report import at_accuracy


@dataclass(frozen=True)
class Arm:
    """One arm of a study on ``testbed/verbalized``: its training reward (``"correctness"``: the drawn outcome
    alone, the confidence digit ignored; ``"rlcr"``: RLCR's reward) and its ``CalibratedGRPOConfig`` fields beyond
    the shared budget of :func:`run_arm`."""

    reward: str
    config: dict = field(default_factory=dict)


ARM_SETTINGS = {
    "grpo": Arm("correctness", {"advantage_estimator": "grpo"}),
    "capo": Arm("correctness", {"advantage_estimator": "capo", "capo_tau": 0.6}),
    "rlcr": Arm("rlcr", {"advantage_estimator": "grpo"}),
}
ARMS = tuple(ARM_SETTINGS)
TASK = "verbalized"
METRICS = ("expected_accuracy", "stated_fraction", "stated_ece", "stated_auroc", "stated_calib_err", "brier", "seq_auroc")


def evaluate(model, tok, prompts, *, step: int) -> dict:
    """One evaluation: 8 samples per prompt, fixed sampling seed, the metrics above, plus ``entropy`` (the
    testbed's per-token entropy estimate) and ``auroc_ceiling`` (the true probability's AUROC on the same draws)."""
    from calibrl import metrics as M
    from calibrl.testbed import tasks as tb
    from calibrl.metrics import metric
    from calibrl.testbed.methods import stated_confidence_metrics
    from calibrl.testbed.warmstart import sample_completions

    res = sample_completions(model, tok, prompts, n=8, max_new_tokens=tb.VERBALIZED.max_completion_length,
                             seed=10_000)
    q = np.array([tb.true_success_probability(TASK, p, c) for p, c in zip(res["prompt"], res["completion"])])
    stated = np.array([np.nan if (s := tb.parse(TASK, p, c)["confidence"]) is None else s
                       for p, c in zip(res["prompt"], res["completion"])])
    correct = np.random.default_rng(10_000).random(len(q)) < q  # one fixed draw of the outcomes
    out = stated_confidence_metrics(stated=stated, correct=correct, p_true=q)
    mixed = 0 < correct.mean() < 1
    out["seq_auroc"] = float(M.auroc(np.asarray(res["logprob_mean"]), correct)) if mixed else math.nan
    out["auroc_ceiling"] = float(M.auroc(q, correct)) if mixed else math.nan
    out["entropy"] = metric("entropy").compute({"logprob_mean": res["logprob_mean"], "n_tokens": res["n_tokens"]})
    out.update(step=step, expected_accuracy=float(q.mean()))
    model.train()
    return out


def run_arm(arm: str, *, seed: int, steps: int, eval_every: int, lr: float, settings: Arm | None = None) -> list[dict]:
    """Warm start, then ``steps`` steps of ``arm`` (``settings``, default :data:`ARM_SETTINGS`'s); returns the
    evaluation history."""
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from calibrl.testbed import tasks as tb
    from calibrl.testbed.evaluate import eval_prompts_for
    from calibrl.testbed.warmstart import WarmStartConfig, load_warm_start, warm_start
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

    torch.manual_seed(seed)
    model, tok = load_warm_start(warm_start(TASK, WarmStartConfig.for_task(TASK, max_steps=600, target=0.95)))
    prompts = eval_prompts_for(TASK, 128)
    history = [evaluate(model, tok, prompts, step=0)]

    class Evaluate(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % eval_every == 0:
                history.append(evaluate(model, tok, prompts, step=state.global_step))
                h = history[-1]
                print(f"  {arm} seed {seed} step {h['step']}: expected accuracy {h['expected_accuracy']:.3f}, "
                      f"stated ECE {h['stated_ece']:.3f}, stated AUROC {h['stated_auroc']:.3f}", flush=True)

    rng = np.random.default_rng(seed)

    def correctness(prompts, completions, **columns):  # the drawn outcome alone: the confidence digit ignored
        return [float(rng.random() < tb.true_success_probability(TASK, tb._completion(p), tb._completion(c)))
                for p, c in zip(prompts, completions)]

    settings = settings or ARM_SETTINGS[arm]
    if settings.reward not in ("correctness", "rlcr"):
        raise ValueError(f"arm {arm}: reward must be 'correctness' or 'rlcr', got {settings.reward!r}")
    reward = tb.make_reward(TASK, seed=seed) if settings.reward == "rlcr" else correctness
    with tempfile.TemporaryDirectory() as tmp:
        cfg = CalibratedGRPOConfig(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=128, num_generations=8,
            max_completion_length=tb.VERBALIZED.max_completion_length, learning_rate=lr, lr_scheduler_type="constant",
            warmup_steps=0, beta=0.0, temperature=1.0, top_k=0, top_p=1.0, logging_steps=eval_every,
            report_to="none", save_strategy="no", use_cpu=True, seed=seed, data_seed=seed, bf16=False,
            disable_tqdm=True, weight_decay=0.0, max_grad_norm=1.0, dataloader_num_workers=0,
            calibration_logging=False, **settings.config)
        trainer = CalibratedGRPOTrainer(model=model, reward_funcs=[reward], args=cfg, processing_class=tok,
                                        train_dataset=tb.build_dataset(TASK, 2000, split="train", seed=seed),
                                        callbacks=[Evaluate()])
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        trainer.train()
    return history


TITLES = ("expected accuracy", "share stating a confidence", "stated ECE ↓", "stated AUROC ↑",
          "mean abs(stated - true p) ↓", "Brier ↓", "sequence-confidence AUROC ↑")
STATED = ("stated_ece", "stated_auroc", "stated_calib_err", "brier")  # read over the completions that state one
RARE = 0.01  # a seed whose share stating a confidence is below this: left out of its arm's stated figures


MATCHED = (("stated_ece", "stated ECE ↓"), ("stated_auroc", "stated AUROC ↑"),
           ("stated_calib_err", "mean abs(stated - true p) ↓"), ("seq_auroc", "sequence-confidence AUROC ↑"))


def tables(results: dict, *, metrics: tuple[str, ...] = METRICS, titles: tuple[str, ...] = TITLES,
           matched: tuple[tuple[str, str], ...] = MATCHED, matched_arms: tuple[str, ...] | None = None) -> str:
    """Markdown (docs/results/rlcr.md): the warm start and each arm's last evaluation (mean ± std over seeds), then
    each metric at matched expected accuracy (each run's curve read where it first reaches the level, mean over
    seeds). The stated-confidence figures (:data:`STATED`) of a seed that almost never states one (under
    :data:`RARE` of its completions) are left out of its arm's: the others' mean ± std with "(k of n seeds)", or,
    when no seed states, the mean of all in parentheses.
    ``metrics`` / ``titles``: the columns of the first table; ``matched``: (key, title) of the second's;
    ``matched_arms``: the arms of the second table and of its levels (default all)."""
    lines = ["| arm | " + " | ".join(titles) + " |", "|---|" + "---:|" * len(metrics)]
    first = next(iter(next(iter(results.values())).values()))
    lines.append("| warm start | " + " | ".join(f"{first[0][k]:.3f}" for k in metrics) + " |")
    def cell(v: np.ndarray) -> str:
        return f"{np.nanmean(v):.3f} ± {np.nanstd(v):.3f}" if len(v) > 1 else f"{v[0]:.3f}"

    for arm, runs in results.items():
        states = np.array([h[-1]["stated_fraction"] >= RARE for h in runs.values()])  # per seed
        cells = []
        for key in metrics:
            v = np.array([h[-1][key] for h in runs.values()], dtype=float)
            if key not in STATED or states.all():
                cells.append(cell(v))
            elif not states.any():
                cells.append(f"({np.nanmean(v):.3f})")
            else:  # a mixed arm: the seeds that state a confidence, said
                kept = v[states]
                cells.append(f"{cell(kept)} ({int(np.isfinite(kept).sum())} of {len(v)} seeds)")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    results = {arm: runs for arm, runs in results.items() if matched_arms is None or arm in matched_arms}
    start = min(h[0]["expected_accuracy"] for runs in results.values() for h in runs.values())
    reach = min(max(e["expected_accuracy"] for e in h) for runs in results.values() for h in runs.values())
    lines += ["", f"At matched expected accuracy (every arm and seed reaches {reach:.3f}; start {start:.3f}):", ""]
    levels = [start + (reach - start) * f for f in (0.5, 0.9)] if reach > start else []
    lines += ["| accuracy | arm | " + " | ".join(title for _, title in matched) + " |",
              "|---:|---|" + "---:|" * len(matched)]
    for level in levels:
        for arm, runs in results.items():
            cells = [np.nanmean([at_accuracy(h, k, level) for h in runs.values()]) for k, _ in matched]
            lines.append(f"| {level:.3f} | {arm} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default="runs/rlcr/results.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from calibrl.testbed.runner import utc_now

    results: dict[str, dict[int, list[dict]]] = {}
    times: dict[str, dict[int, dict[str, str]]] = {}  # arm -> seed -> UTC start and end of its run
    for arm in args.arms.split(","):
        if arm not in ARMS:
            parser.error(f"--arms: unknown arm {arm!r}; known: {', '.join(ARMS)}")
        for seed in range(args.seeds):
            start, started_utc = time.perf_counter(), utc_now()
            results.setdefault(arm, {})[seed] = run_arm(arm, seed=seed, steps=args.steps,
                                                        eval_every=args.eval_every, lr=args.lr)
            times.setdefault(arm, {})[seed] = {"started_utc": started_utc, "finished_utc": utc_now()}
            print(f"{arm} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results, "times": times}, indent=1))
    print(tables(results))
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
