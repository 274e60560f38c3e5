"""What reading "I don't know" costs ``calibrl eval`` on a file that has none (issue 53: it should add nothing
measurable). Each row without an ``abstained`` field has its completion's final answer read
(:func:`calibrl.tasks.abstention.is_abstention`: one phrase search over the text, the final answer only when a phrase
occurs). Timed in one run (ratios within one run: machines are noisy), best of ``--repeat``:

1. ``load_samples`` of the file as it is, against the same with the reading replaced by ``False``;
2. the declared metrics of the ``eval`` context on those samples given an ``abstained`` array where none abstains
   (a file whose rows say ``abstained: false``), against the same without it (what a file with no decline gives:
   its samples keep no array).

    python bench/abstention.py                         # 200,000 rows (25,000 prompts x 8) of 300-character texts
    python bench/abstention.py --rows 40000 --chars 4000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def _best(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def write_file(path: Path, rows: int, chars: int, per_prompt: int = 8) -> None:
    rng = np.random.default_rng(0)
    filler = ("Let us add the numbers step by step and check each partial sum again. " * (chars // 70 + 1))[:chars]
    with path.open("w") as f:
        for i in range(rows):
            answer = int(rng.integers(100))
            f.write(json.dumps({"prompt_id": f"q{i // per_prompt}", "gold": "42",
                                "completion": f"{filler} So the answer is \\boxed{{{answer}}}.",
                                "correct": bool(answer == 42), "logprob_mean": float(-rng.exponential(0.4))}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chars", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    import calibrl.evaluation.samples as samples_module
    from calibrl.metrics.registry import compute_metrics

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "samples.jsonl"
        write_file(path, args.rows, args.chars)
        size = path.stat().st_size / 2**20
        read = samples_module.is_abstention
        t_read, s = _best(lambda: samples_module.load_samples(path), args.repeat)
        samples_module.is_abstention = lambda *a, **k: False
        try:
            t_none, s_none = _best(lambda: samples_module.load_samples(path), args.repeat)
        finally:
            samples_module.is_abstention = read
    # a file where nothing declines keeps no abstained array: the report's abstention figures are skipped
    assert s.abstained is None and np.array_equal(s.correct, s_none.correct)
    print(f"load_samples, {args.rows:,} rows of {args.chars:,}-character completions ({size:.0f} MB): "
          f"{t_read:.2f} s reading each final answer, {t_none:.2f} s without; ratio {t_read / t_none:.3f}")

    base = {"correct": s.correct, "prompt_index": s.prompt_index, "logprob_mean": s.logprob_mean,
            "confidence": np.exp(s.logprob_mean)}
    none_abstain = np.zeros(len(s.correct), dtype=bool)
    t_with, with_abstained = _best(lambda: compute_metrics("eval", {**base, "abstained": none_abstain}), args.repeat)
    t_without, without = _best(lambda: compute_metrics("eval", base), args.repeat)
    extra = sorted(set(with_abstained) - set(without))
    assert set(without) <= set(with_abstained)
    print(f"the eval context's declared metrics on those samples: {t_with:.2f} s with an abstained array where none "
          f"abstains (it adds {', '.join(extra)}), {t_without:.2f} s without; ratio {t_with / t_without:.3f}")


if __name__ == "__main__":
    main()
