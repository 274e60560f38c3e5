"""Time per training step of CalibratedGRPOTrainer vs TRL's stock GRPOTrainer on the tiny model (CPU).

    python bench/train_step.py [--rounds 6] [--steps 4] [--batch 16] [--generations 8] [--completion 32]

Every variant trains the same tiny model (same initial weights, seed, prompts) with learning_rate 0, so every
step does the same work on the same generations (the weights never move) and the only difference is what the
variant adds: the extra no-grad forward that gives the rollout policy's log-probs (capo, telemetry), the
reference forward (capo + mask), the hidden-state pooling (gcpo). Variants are ALTERNATED: each round runs a few
steps of every variant, in a rotated order, so drifts in machine load hit all variants alike. A step is timed
from ``on_step_begin`` to ``on_step_end`` (generation, rewards, advantages, forward, backward, optimizer step);
the first step of each call is dropped as warm-up. The table shows the median step time and, more robust to load,
the median over rounds of the paired ratio (variant / stock in the same round).

Goals: grpo <= 1.03x, capo <= 1.05x, capo+mask <= 1.35x of stock GRPOTrainer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

VARIANTS = {
    "stock GRPOTrainer": None,
    "grpo": dict(advantage_estimator="grpo"),
    "grpo (no telemetry)": dict(advantage_estimator="grpo", calibration_logging=False),
    "capo": dict(advantage_estimator="capo"),
    "capo (no telemetry)": dict(advantage_estimator="capo", calibration_logging=False),
    "capo + mask": dict(advantage_estimator="capo", capo_mask="quantile"),
    "gcpo": dict(advantage_estimator="gcpo"),
}
GOALS = {"grpo": 1.03, "capo": 1.05, "capo + mask": 1.35}


def parity_reward(prompts, completions, **kwargs):
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


def build(name, extra, opts):
    import transformers
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from calibrl.models import build_tiny_model
    from calibrl.trl import CalibratedGRPOConfig, CalibratedGRPOTrainer

    transformers.logging.set_verbosity_error()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.cpu, self._t0, self._c0, self._call, self._ccall = [], [], None, None, [], []

        def on_train_begin(self, args, state, control, **kwargs):
            self._call, self._ccall = [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self._t0, self._c0 = time.perf_counter(), time.thread_time()

        def on_step_end(self, args, state, control, **kwargs):
            self._call.append(time.perf_counter() - self._t0)
            self._ccall.append(time.thread_time() - self._c0)

        def on_train_end(self, args, state, control, **kwargs):
            self.times.append(self._call[1:])  # drop the warm-up step of this call
            self.cpu.append(self._ccall[1:])

    model, tok = build_tiny_model(seed=0)
    dataset = Dataset.from_list([{"prompt": f"{i:03d}+{i % 7}="} for i in range(512)])
    common = dict(
        output_dir="/tmp/calibrl-bench-train-step", per_device_train_batch_size=opts.batch,
        num_generations=opts.generations, max_completion_length=opts.completion, max_steps=opts.steps,
        learning_rate=0.0, logging_steps=10_000, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
        seed=0, disable_tqdm=True,
    )
    timer = StepTimer()
    if extra is None:
        trainer = GRPOTrainer(model=model, reward_funcs=parity_reward, args=GRPOConfig(**common),
                              train_dataset=dataset, processing_class=tok, callbacks=[timer])
    else:
        trainer = CalibratedGRPOTrainer(model=model, reward_funcs=parity_reward,
                                        args=CalibratedGRPOConfig(**common, **extra), train_dataset=dataset,
                                        processing_class=tok, callbacks=[timer])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    timer.own = []  # CPU seconds spent in calibrl's own per-batch code (advantage step + deferred telemetry)
    if extra is not None:
        for method in ("_calibrl_replace_advantages", "_fill_pending_telemetry"):
            original = getattr(trainer, method)

            def timed(*a, _original=original, **k):
                t0 = time.thread_time()
                try:
                    return _original(*a, **k)
                finally:
                    timer.own.append(time.thread_time() - t0)

            setattr(trainer, method, timed)
    return trainer, timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4, help="steps per variant per round (first is warm-up)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the results here")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)

    runs = {name: build(name, extra, opts) for name, extra in VARIANTS.items()}
    names = list(VARIANTS)
    start = time.perf_counter()
    for r in range(opts.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            runs[name][0].train()
    wall = time.perf_counter() - start

    def summary(attr):
        per_round = {name: [statistics.median(t) for t in getattr(runs[name][1], attr)] for name in names}
        flat = {name: [x for t in getattr(runs[name][1], attr) for x in t] for name in names}
        base_round, base_flat = per_round[names[0]], statistics.median(flat[names[0]])
        return {
            name: {
                "median_step_s": statistics.median(flat[name]),
                "ratio_of_medians": statistics.median(flat[name]) / base_flat,
                "median_paired_ratio": statistics.median(v / b for v, b in zip(per_round[name], base_round)),
                "n_steps": len(flat[name]),
            }
            for name in names
        }

    wall_rows, cpu_rows = summary("times"), summary("cpu")
    n_steps_total = {n: sum(len(t) + 1 for t in runs[n][1].times) for n in names}  # incl. warm-up steps
    own_ms = {n: 1000 * sum(runs[n][1].own) / n_steps_total[n] for n in names}
    rows = [{"variant": n, "goal": GOALS.get(n), "wall": wall_rows[n], "cpu": cpu_rows[n], "own_ms": own_ms[n]}
            for n in names]
    print(f"\ntiny model, batch {opts.batch} (groups of {opts.generations}), completions <= {opts.completion} tokens, "
          f"{opts.threads} thread(s), {opts.rounds} alternated rounds x {opts.steps - 1} timed steps; "
          f"bench wall {wall:.0f} s\n")
    print("CPU time of the training thread (robust to other load on the machine; torch uses this thread only when "
          "--threads 1) and wall time:\n")
    print("'calibrl ms' is the CPU time per step spent in calibrl's own advantage step and deferred telemetry "
          "(the added work, measured directly); 'added' = calibrl ms / stock CPU ms per step.\n")
    stock_cpu = 1000 * cpu_rows[names[0]]["median_step_s"]
    print("| variant | CPU ms/step | CPU ratio (paired) | wall ms/step | wall ratio (paired) | calibrl ms/step | "
          "added | goal |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        goal = f"<= {row['goal']:.2f}x" if row["goal"] else ""
        c, w = row["cpu"], row["wall"]
        print(f"| {row['variant']} | {1000 * c['median_step_s']:.1f} | {c['median_paired_ratio']:.3f}x | "
              f"{1000 * w['median_step_s']:.1f} | {w['median_paired_ratio']:.3f}x | {row['own_ms']:.1f} | "
              f"{1 + row['own_ms'] / stock_cpu:.3f}x | {goal} |")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"options": vars(opts), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
