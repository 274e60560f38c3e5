"""Time answer selection and scaling curves on synthetic groups: python bench/selection.py [--prompts 500 --n 16].

Prints seconds per call of each method on all paths, and of one scaling curve (ns 1,2,4,...,N) per method.
RPC fits one 2-component Weibull mixture per prompt (scipy's L-BFGS-B steps, run for all prompts at once by
calibrl.selection._lbfgsb; ``--rpc-solver scipy`` for the per-prompt scipy calls of the reference code), so it
dominates.
"""

import argparse
import time

import numpy as np

from calibrl.selection import METHODS, answer_clusters, scaling_curve, select


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--rpc-draws", type=int, default=2)
    ap.add_argument("--rpc-solver", choices=("batched", "scipy"), default="batched")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    pid = np.repeat(np.arange(args.prompts), args.n)
    answers = rng.integers(0, 5, size=pid.size)
    correct = answers == 0
    lpm = -rng.exponential(0.3, size=pid.size) - 0.2 * (~correct)
    texts = np.array([f"path {i % 7} answer {a}" for i, a in enumerate(answers)], dtype=object)

    t = time.perf_counter()
    ids = answer_clusters([str(a) for a in answers], pid, use_math_verify=True)
    print(f"answer_clusters (math-verify) on {pid.size} answers: {time.perf_counter() - t:.2f} s")
    print(f"{args.prompts} prompts x {args.n} paths")
    print(f"{'method':<10} {'select s':>9} {'accuracy':>9} {'curve s':>8} draws")
    if args.rpc_solver != "batched":
        from calibrl.selection import pruning

        batched = pruning.rpc_keep_mask
        pruning.rpc_keep_mask = lambda p, lpm: batched(p, lpm, solver=args.rpc_solver)
    for method in METHODS:
        kw = {"logprob_mean": lpm, "completions": texts}
        t = time.perf_counter()
        acc = select(method, ids, correct, pid, **kw).accuracy
        t_sel = time.perf_counter() - t
        draws = args.rpc_draws if method == "rpc" else args.draws
        t = time.perf_counter()
        scaling_curve(method, ids, correct, pid, n_draws=draws, **kw)
        t_curve = time.perf_counter() - t
        print(f"{method:<10} {t_sel:>9.3f} {acc:>9.3f} {t_curve:>8.2f} {draws}")


if __name__ == "__main__":
    main()
