"""Benchmark every advantage estimator on one large batch: 4096 groups x G = 16 (N = 65,536 completions).

Prints each estimator's median wall time over repeats and its ratio to grpo measured in the same run
(goal: every estimator <= 3x grpo). gcpo runs with D = 64 embeddings; capo with and without the noise mask.
Two batch layouts: "contiguous" (each prompt's completions adjacent, as TRL and verl build batches) and
"shuffled" (rows in random order).

    python bench/advantages.py [--groups 4096] [--group-size 16] [--dim 64] [--repeats 30] [--device cpu]
                               [--threads 0] [--layouts contiguous,shuffled] [--clock wall|cpu]
                               [--empty-fraction 0.0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from calibrl import RolloutBatch, compute_advantages

CASES: list[tuple[str, str, dict]] = [
    ("grpo", "grpo", {}),
    ("dr_grpo", "dr_grpo", {}),
    ("rloo", "rloo", {}),
    ("capo", "capo", {}),
    ("capo mask=fixed", "capo", {"mask": "fixed"}),
    ("capo mask=quantile", "capo", {"mask": "quantile"}),
    ("seed_grpo", "seed_grpo", {}),
    ("gcpo cosine", "gcpo", {"measure": "cosine"}),
    ("gcpo barycentric", "gcpo", {"measure": "barycentric"}),
    ("codapo", "codapo", {}),
    ("cde", "cde", {}),
]


def make_batch(n_groups: int, group_size: int, dim: int, device: str, layout: str = "contiguous",
               seed: int = 0, empty_fraction: float = 0.0) -> RolloutBatch:
    """``layout="contiguous"``: each prompt's completions adjacent (TRL and verl batches); ``"shuffled"``: rows in
    random order, so nothing can rely on contiguity. ``empty_fraction`` > 0 sets ``lengths`` with that fraction of
    rows without tokens (truncated or rejected), which ``compute_advantages`` leaves out of every statistic."""
    g = torch.Generator().manual_seed(seed)
    n = n_groups * group_size
    group_ids = torch.arange(n_groups).repeat_interleave(group_size)
    if layout == "shuffled":
        group_ids = group_ids[torch.randperm(n, generator=g)]
    p = torch.rand(n_groups, generator=g)[group_ids]
    rewards = (torch.rand(n, generator=g) < p).float()
    logprob_mean = -torch.rand(n, generator=g) * 2.0
    ref_logprob_mean = -torch.rand(n, generator=g) * 1.5
    embeddings = torch.randn(n, dim, generator=g)
    answer_ids = torch.randint(0, 4, (n,), generator=g)
    lengths = None
    if empty_fraction > 0:
        lengths = torch.where(torch.rand(n, generator=g) < empty_fraction, 0, 1 + torch.randint(0, 512, (n,), generator=g))
    return RolloutBatch(rewards=rewards, group_ids=group_ids, logprob_mean=logprob_mean,
                        ref_logprob_mean=ref_logprob_mean, embeddings=embeddings, answer_ids=answer_ids,
                        lengths=lengths).to(device)


def time_cases(batch: RolloutBatch, repeats: int, device: str,
               clock=time.perf_counter) -> tuple[dict[str, float], dict[str, float]]:
    """(median, min) seconds per case. Cases run round-robin (one call of each per repeat), so a load spike on a shared
    machine hits every estimator alike and the ratios to grpo stay meaningful."""

    def run(name: str, params: dict) -> float:
        t0 = clock()
        compute_advantages(batch, name, **params)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return clock() - t0

    for _ in range(2):  # warm-up
        for _label, name, params in CASES:
            run(name, params)
    times: dict[str, list[float]] = {label: [] for label, _, _ in CASES}
    for _ in range(repeats):
        for label, name, params in CASES:
            times[label].append(run(name, params))
    return {label: statistics.median(ts) for label, ts in times.items()}, {label: min(ts) for label, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=4096)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--layouts", default="contiguous,shuffled", help="comma-separated: contiguous, shuffled")
    parser.add_argument("--empty-fraction", type=float, default=0.0,
                        help="fraction of rows without tokens (lengths 0), left out by compute_advantages")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: perf_counter; cpu: this thread's CPU time (forces 1 torch thread, CPU only), "
                             "robust on a shared, loaded machine because time spent descheduled is not counted")
    args = parser.parse_args()
    if args.clock == "cpu":
        if args.device != "cpu":
            parser.error("--clock cpu needs --device cpu")
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter

    layouts = args.layouts.split(",")
    print(f"# advantage estimators: {args.groups} groups x G={args.group_size} (N={args.groups * args.group_size}), "
          f"D={args.dim}, device={args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}, round-robin, {args.clock} clock, empty rows {args.empty_fraction:g}")
    results, minima = {}, {}
    for layout in layouts:
        batch = make_batch(args.groups, args.group_size, args.dim, args.device, layout,
                           empty_fraction=args.empty_fraction)
        results[layout], minima[layout] = time_cases(batch, args.repeats, args.device, clock)
    print()
    print("| estimator | " + " | ".join(f"{lay}: median ms | x grpo | min ms | x grpo" for lay in layouts) + " |")
    print("|---|" + "---:|---:|---:|---:|" * len(layouts))
    for label, _, _ in CASES:
        cells = [f"{results[lay][label] * 1e3:.2f} | {results[lay][label] / results[lay]['grpo']:.2f} | "
                 f"{minima[lay][label] * 1e3:.2f} | {minima[lay][label] / minima[lay]['grpo']:.2f}" for lay in layouts]
        print(f"| {label} | " + " | ".join(cells) + " |")
    for lay in layouts:
        base = results[lay]["grpo"]
        worst = max(results[lay], key=lambda k: results[lay][k] / base)
        status = "OK" if results[lay][worst] / base <= 3.0 else "OVER GOAL"
        print(f"\n{lay}: slowest relative to grpo (medians): {worst} ({results[lay][worst] / base:.2f}x; goal <= 3x): "
              f"{status}")


if __name__ == "__main__":
    main()
