"""What recording ``self_certainty`` costs ``calibrl generate`` on the transformers backend.

    python bench/self_certainty.py                      # 4 problems x 4 samples x up to 128 tokens, SmolLM2-135M
    python bench/self_certainty.py --limit 8 --n 8      # a larger batch

Two measurements on ``builtin:smollm2-135m-instruct`` (V = 49,152; float32 on the CPU), the model loaded once:

* per decoding step, interleaved so a change in the machine's load hits both: the self-certainty of one step's
  logits [rows, V] (:func:`calibrl.self_certainty.chunked_token_self_certainty`, what recording adds) against the
  model's forward of one token per row with a 64-token cache (what every step costs anyway);
* whole runs of ``calibrl generate`` on the bundled deepscaler file with ``self_certainty`` off and on
  (``token_confidence_k=0`` in both, so only this field differs), alternating, the first round a warm-up.

Memory: recording keeps 4 bytes per row per step (the [rows] values of each step until the batch ends); computing
one step's value allocates at most the chunk budget of :func:`calibrl.logprobs.positions_per_chunk` (its
temporaries are [chunk, V] float32: the logits divided by T and the exponentials of logsumexp), printed below.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def step_cost(model, *, rows: int, temperature: float, reps: int = 30) -> None:
    import torch

    from calibrl.logprobs import FORWARD_BUDGET_BYTES, positions_per_chunk
    from calibrl.self_certainty import chunked_token_self_certainty

    vocab = model.config.vocab_size
    chunk = positions_per_chunk(vocab_size=vocab)
    ids = torch.randint(0, vocab, (rows, 64))
    timings: dict[str, list[float]] = {"forward": [], "self-certainty": []}
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        logits = torch.randn(rows, vocab)
        for _ in range(reps):
            start = time.perf_counter()
            model(ids[:, -1:], past_key_values=cache, use_cache=True)
            timings["forward"].append(time.perf_counter() - start)
            start = time.perf_counter()
            chunked_token_self_certainty(logits, project=lambda z: z, chunk=chunk, temperature=temperature)
            timings["self-certainty"].append(time.perf_counter() - start)
    f, s = (np.median(timings[k]) * 1e3 for k in ("forward", "self-certainty"))
    print(f"one decoding step of {rows} rows (V = {vocab:,}), medians of {reps}: forward {f:.1f} ms, self-certainty "
          f"{s:.2f} ms ({s / f:.3f}x the forward)")
    extra = 2 * min(rows, chunk) * vocab * 4
    print(f"memory: {chunk:,} rows per chunk (budget {FORWARD_BUDGET_BYTES / 2**20:.0f} MiB); this step's "
          f"temporaries {extra / 2**20:.2f} MiB; kept: 4 bytes x {rows} rows per step")


def whole_runs(model, tokenizer, *, limit: int, n: int, max_new_tokens: int, temperature: float) -> None:
    from calibrl.evaluation.generate import generate

    data = Path(__file__).resolve().parent.parent / "calibrl" / "recipes" / "data" / "deepscaler.jsonl"
    seconds: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(3):
            for on in (False, True):
                start = time.perf_counter()
                out = Path(tmp) / f"r{repeat}-{on}.jsonl"
                generate(model="builtin:smollm2-135m-instruct", dataset="deepscaler", path=str(data), n=n,
                         limit=limit, max_new_tokens=max_new_tokens, template="qwen-math-chat", out=out,
                         temperature=temperature, progress=False, backend="transformers", token_confidence_k=0,
                         self_certainty=on, hf_model=model, hf_tokenizer=tokenizer, seed=repeat)
                took = time.perf_counter() - start
                if repeat:
                    seconds[on].append(took)
                tokens = sum(json.loads(line)["n_tokens"] for line in out.open())
                print(f"  round {repeat} self_certainty={'on ' if on else 'off'}: {took:6.1f} s, {tokens} tokens")
    (off, on), (off_min, on_min) = ([stat(seconds[k]) for k in (False, True)] for stat in (np.mean, np.min))
    print(f"generation of {limit} problems x {n} samples x up to {max_new_tokens} tokens: off {off:.1f} s, "
          f"on {on:.1f} s ({on / off:.3f}x; mean of 2 rounds each); fastest round: off {off_min:.1f} s, on "
          f"{on_min:.1f} s ({on_min / off_min:.3f}x; the least disturbed by other jobs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=4, help="problems")
    parser.add_argument("--n", type=int, default=4, help="samples per problem")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per sample at most")
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from calibrl.models import resolve_model

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    folder = resolve_model("builtin:smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    step_cost(model, rows=args.limit * args.n, temperature=args.temperature)
    whole_runs(model, tokenizer, limit=args.limit, n=args.n, max_new_tokens=args.max_new_tokens,
               temperature=args.temperature)


if __name__ == "__main__":
    main()
