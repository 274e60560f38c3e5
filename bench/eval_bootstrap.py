"""Two choices in ``calibrl eval``'s per-source bootstrap, each timed against its alternative in one run (ratios
within one run: machines are noisy), with the agreement of their results:

1. PRR and AUROC replicates one at a time once a source has more than 2^15 tie runs
   (``calibrl.metrics.rejection._REPLICATE_BLOCK``), against several replicates per pass;
2. with at most 64 prompts, a repeated bootstrap draw computed once (``calibrl.evaluation.scoring._DEDUP_PROMPTS``),
   against every draw computed.

    python bench/eval_bootstrap.py                     # 200,000 samples (25,000 prompts x 8), 64 replicates
    python bench/eval_bootstrap.py --rows 40000 --replicates 32
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _timed(fn, repeat: int = 3):
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def replicate_blocks(rows: int, replicates: int, per_pass: int) -> None:
    """PRR + AUROC replicates of ``logprob_mean`` of the eval benchmark's file (bench/eval_scale.py) of ``rows``
    samples: one replicate per pass against ``per_pass``."""
    import calibrl.metrics.rejection as rejection
    from calibrl.metrics.bootstrap import resampled_prompt_counts

    import sys
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_scale import write_samples  # the benchmark's file: its ties are those docs/eval.md measured

    from calibrl.evaluation.samples import load_samples

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "samples.jsonl"
        write_samples(path, rows)
        samples = load_samples(path)
    groups, pidx = samples.n_prompts, samples.prompt_index
    score, correct = samples.logprob_mean, samples.correct
    counts = next(iter(resampled_prompt_counts(groups, n_boot=replicates, seed=0, chunk=replicates)))[1]
    replicate = rejection.PRRReplicates(score, correct, pidx, groups)
    runs = replicate.samples.shape[0]
    default = rejection._REPLICATE_BLOCK
    t_one, (prr_one, auc_one) = _timed(lambda: replicate.with_auroc(counts))
    try:
        rejection._REPLICATE_BLOCK = per_pass * runs
        t_many, (prr_many, auc_many) = _timed(lambda: replicate.with_auroc(counts))
    finally:
        rejection._REPLICATE_BLOCK = default
    gap = max(float(np.nanmax(np.abs(prr_one - prr_many))), float(np.nanmax(np.abs(auc_one - auc_many))))
    print(f"PRR + AUROC replicates, {rows:,} samples, {runs:,} tie runs, {len(counts)} replicates:")
    print(f"  one per pass (the default): {1e3 * t_one / len(counts):7.2f} ms per replicate")
    print(f"  {per_pass} per pass:               {1e3 * t_many / len(counts):7.2f} ms per replicate")
    print(f"  ratio {t_many / t_one:.2f}x; largest difference of a replicate's PRR or AUROC: {gap:.1e} "
          "(the order of floating-point sums)")


def small_file_dedup(n_boot: int) -> None:
    import calibrl.evaluation.scoring as scoring

    rng = np.random.default_rng(1)
    pidx = np.repeat(np.arange(3), 5)  # 3 prompts x 5 samples: only 10 distinct draws of 3 prompts
    lpm = -rng.exponential(0.5, 15)
    correct = rng.random(15) < np.exp(lpm)
    arrays = {"logprob_mean": (pidx, np.exp(lpm), lpm, correct, True)}

    def run():
        return scoring.source_bootstrap(arrays, 3, n_boot=n_boot, alpha=0.05, seed=0)

    t_dedup, with_dedup = _timed(run, repeat=1)
    default = scoring._DEDUP_PROMPTS
    try:
        scoring._DEDUP_PROMPTS = 0
        t_all, every = _timed(run, repeat=1)
    finally:
        scoring._DEDUP_PROMPTS = default
    gap = {m: float(np.nanmax(np.abs(with_dedup["replicates"]["logprob_mean"][m]
                                     - every["replicates"]["logprob_mean"][m])))
           for m in scoring.SOURCE_INTERVALS}
    print(f"Source intervals of a 15-sample file of 3 prompts, {n_boot} replicates:")
    print(f"  repeated draws computed once (the default): {t_dedup:6.2f} s")
    print(f"  every draw computed:                        {t_all:6.2f} s")
    print(f"  ratio {t_all / t_dedup:.1f}x; largest difference of a replicate's value: "
          + ", ".join(f"{m} {g:.1e}" for m, g in gap.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--replicates", type=int, default=64)
    parser.add_argument("--per-pass", type=int, default=11, help="replicates per pass of the alternative")
    parser.add_argument("--n-boot", type=int, default=1000, help="replicates of the small-file comparison")
    args = parser.parse_args()
    replicate_blocks(args.rows, args.replicates, args.per_pass)
    small_file_dedup(args.n_boot)


if __name__ == "__main__":
    main()
