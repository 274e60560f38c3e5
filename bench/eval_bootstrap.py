"""Two choices in ``calibrl eval``'s per-source bootstrap, each timed against its alternative in one run (ratios
within one run: machines are noisy), with the agreement of their results:

1. PRR and AUROC replicates from one sort of the scores, each a compiled pass over the sorted samples weighted by
   its prompt counts (``calibrl.metrics.rejection.PRRReplicates``), against gathering each replicate's rows and
   calling ``calibrl.metrics.prr`` and ``auroc`` on them (a sort per replicate);
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


def replicate_pass(rows: int, replicates: int) -> None:
    """PRR + AUROC replicates of ``logprob_mean`` of the eval benchmark's file (bench/eval_scale.py) of ``rows``
    samples: the compiled pass against each replicate's gathered rows sorted again."""
    import sys
    import tempfile
    from pathlib import Path

    import calibrl.metrics as M
    import calibrl.metrics.rejection as rejection
    from calibrl.metrics.bootstrap import resampled_prompt_counts

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
    start = time.perf_counter()
    replicate = rejection.PRRReplicates(score, correct, pidx, groups)
    replicate.with_auroc(counts[:1])  # numba's import and compilation (or its cache), once per process
    t_first = time.perf_counter() - start
    runs = replicate.run_start.size - 1
    t_pass, (prr_pass, auc_pass) = _timed(lambda: replicate.with_auroc(counts))

    def gathered():
        out = []
        for c in counts:
            idx = np.repeat(np.arange(score.size), c[pidx].astype(np.int64))
            out.append((M.prr(score[idx], correct[idx]), M.auroc(score[idx], correct[idx])))
        return np.array(out).T

    t_sort, (prr_sort, auc_sort) = _timed(gathered, repeat=1)
    gap_prr = float(np.nanmax(np.abs(prr_pass - prr_sort)))
    same_auc = bool(np.array_equal(auc_pass, auc_sort, equal_nan=True))
    print(f"PRR + AUROC replicates, {rows:,} samples, {runs:,} tie runs, {len(counts)} replicates:")
    print(f"  the compiled pass (the default): {1e3 * t_pass / len(counts):8.3f} ms per replicate "
          f"(first call, with numba's import and compilation or its cache: {t_first:.2f} s)")
    print(f"  gathered rows, sorted again:     {1e3 * t_sort / len(counts):8.3f} ms per replicate")
    print(f"  ratio {t_sort / t_pass:.0f}x; AUROC the same bits: {same_auc}; largest PRR difference {gap_prr:.1e} "
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
    parser.add_argument("--n-boot", type=int, default=1000, help="replicates of the small-file comparison")
    args = parser.parse_args()
    replicate_pass(args.rows, args.replicates)
    small_file_dedup(args.n_boot)


if __name__ == "__main__":
    main()
