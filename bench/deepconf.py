"""DeepConf's costs: reading token_confidence arrays in ``calibrl eval``, and recording them in ``calibrl generate``.

    python bench/deepconf.py                       # 8,000 traces x 16,384 tokens, JSONL and Parquet (float16)
    python bench/deepconf.py --rows 1000           # a quicker, smaller run of the same comparison
    python bench/deepconf.py --generate --limit 4  # top-k recording vs plain generation, the built-in real model

Reading: every row carries a ``token_confidence`` list (JSONL: numbers rounded to 4 decimals, as ``calibrl
generate`` writes them; Parquet: a list of float16) and the other fields of a generated row. Each measurement runs
in a child process; its peak resident memory (RSS, ``ru_maxrss`` from ``os.wait4``) and time are printed:
``load_samples`` (reading, validation, and the reduction of each array to DeepConf's four signals as it is read:
:mod:`calibrl.selection.deepconf`) against merely parsing the same file (``json.loads`` of every line; for Parquet
``pyarrow.parquet.read_table`` of the whole file, columnar, holding it all) and against the size of the arrays
themselves (what holding them all as float64 would take). calibrl reads Parquet a batch of 4,096 rows at a time, so
its peak grows with that batch (4,096 x 16,384 float16 values: 128 MiB), not with the file.

Generation: ``calibrl generate`` of the first ``--limit`` problems of the bundled deepscaler file on
``builtin:smollm2-135m-instruct`` (transformers, float32 on the CPU), once with ``token_confidence_k=0`` and once
with 20, the model loaded once, each timed in this process (the first run is a warm-up and is not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from eval_memory import run  # (peak RSS in MB, wall seconds, stdout) of a child process

PER_PROMPT = 16


def _confidences(rng: np.random.Generator, tokens: int) -> np.ndarray:
    """[tokens] a plausible confidence profile: a level per trace, noise, and a dip somewhere."""
    level = rng.uniform(1.0, 4.0)
    confs = np.abs(rng.normal(level, 1.0, size=tokens))
    start = int(rng.integers(0, max(tokens - 1024, 1)))
    confs[start:start + 1024] *= 0.5
    return confs


def _row(i: int, rng: np.random.Generator) -> dict:
    answer = str(int(rng.integers(0, 4)))
    return {"prompt_id": str(i // PER_PROMPT), "sample_index": i % PER_PROMPT, "answer": answer,
            "correct": answer == "0", "logprob_mean": float(-rng.exponential(0.5)), "truncated": False}


def write_jsonl(path: Path, *, rows: int, tokens: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            row = _row(i, rng)
            row.update(n_tokens=tokens, token_confidence=np.round(_confidences(rng, tokens), 4).tolist())
            f.write(json.dumps(row) + "\n")


def write_parquet(path: Path, *, rows: int, tokens: int, seed: int = 0, batch: int = 500) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    writer = None
    for start in range(0, rows, batch):
        part = [_row(i, rng) for i in range(start, min(start + batch, rows))]
        confs = np.stack([_confidences(rng, tokens) for _ in part]).astype(np.float16)  # [batch, tokens]
        columns = {k: [r[k] for r in part] for k in part[0]}
        columns["n_tokens"] = [tokens] * len(part)
        columns["token_confidence"] = pa.ListArray.from_arrays(
            pa.array(np.arange(len(part) + 1, dtype=np.int32) * tokens), pa.array(confs.reshape(-1)))
        table = pa.table(columns)
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()


def data_file(folder: Path, suffix: str, *, rows: int, tokens: int) -> Path:
    path = folder / f"traces-{rows}x{tokens}{suffix}"
    if not path.exists():
        part = path.with_name(path.name + ".part")
        (write_jsonl if suffix == ".jsonl" else write_parquet)(part, rows=rows, tokens=tokens)
        part.rename(path)
    return path


_READ = ("import sys, time; from calibrl.evaluation.samples import load_samples; t = time.perf_counter(); "
         "s = load_samples(sys.argv[1]); print(time.perf_counter() - t, len(s), s.deepconf_signals.nbytes)")
_JSON = ("import sys, time, json; t = time.perf_counter(); f = open(sys.argv[1], 'rb'); "
         "n = sum(1 for line in f if json.loads(line) is not None); print(time.perf_counter() - t, n)")
_ARROW = ("import sys, time; import pyarrow.parquet as pq; t = time.perf_counter(); "
          "n = pq.read_table(sys.argv[1]).num_rows; print(time.perf_counter() - t, n)")


def reading(folder: Path, rows: int, tokens: int, formats: str = "jsonl,parquet") -> None:
    held = rows * tokens * 8 / 2**20
    print(f"{rows:,} traces x {tokens:,} tokens: holding every array as float64 would take {held:,.0f} MB")
    for suffix, parse_name, parse in ((".jsonl", "json.loads per line", _JSON),
                                      (".parquet", "pyarrow read_table", _ARROW)):
        if suffix[1:] not in formats.split(","):
            continue
        path = data_file(folder, suffix, rows=rows, tokens=tokens)
        size = path.stat().st_size / 2**20
        read_peak, _, out = run([sys.executable, "-c", _READ, str(path)])
        read_s = float(out.split()[0])
        parse_peak, _, out = run([sys.executable, "-c", parse, str(path)])
        parse_s = float(out.split()[0])
        print(f"  {suffix[1:]:7s} ({size:7,.0f} MB): load_samples {read_s:7.1f} s, peak {read_peak:6,.0f} MB | "
              f"{parse_name} {parse_s:7.1f} s, peak {parse_peak:6,.0f} MB | time ratio {read_s / parse_s:.2f}x")


def generation(limit: int, max_new_tokens: int, n: int) -> None:
    import torch

    from calibrl.evaluation.generate import generate
    from calibrl.models import resolve_model

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    folder = resolve_model("builtin:smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    data = Path(__file__).resolve().parent.parent / "calibrl" / "recipes" / "data" / "deepscaler.jsonl"
    times: dict[int, list[float]] = {0: [], 20: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(3):  # the first round warms up; k = 0 and 20 alternate so drifts in load hit both
            for k in (0, 20):
                start = time.perf_counter()
                summary = generate(model="builtin:smollm2-135m-instruct", dataset="deepscaler", path=str(data),
                                   n=n, limit=limit, max_new_tokens=max_new_tokens, template="qwen-math-chat",
                                   out=Path(tmp) / f"g{repeat}-{k}.jsonl", progress=False, backend="transformers",
                                   token_confidence_k=k, hf_model=model, hf_tokenizer=tokenizer, seed=repeat)
                if repeat:
                    times[k].append(time.perf_counter() - start)
                tokens = sum(json.loads(line)["n_tokens"] for line in open(summary["out"]))
                print(f"  round {repeat} k={k:2d}: {time.perf_counter() - start:6.1f} s, {tokens} tokens")
    step_cost(model, rows=limit * n)
    plain, topk = np.mean(times[0]), np.mean(times[20])
    print(f"generation of {limit} problems x {n} samples x up to {max_new_tokens} tokens: plain {plain:.1f} s, "
          f"recording top-20 token confidence {topk:.1f} s ({topk / plain:.3f}x; mean of 2 rounds each)")


def step_cost(model, *, rows: int, reps: int = 30) -> None:
    """Per decoding step, interleaved so a change in the machine's load hits both: the top-20 token confidence of
    one step's logits [rows, V] (what recording adds) against the model's forward of one token per row with a
    64-token cache (what every step costs anyway)."""
    import torch

    from calibrl.logprobs import chunked_token_confidence, positions_per_chunk

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (rows, 64))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        logits = torch.randn(rows, vocab)
        forward, topk = [], []
        for _ in range(reps):
            start = time.perf_counter()
            model(ids[:, -1:], past_key_values=cache, use_cache=True)
            forward.append(time.perf_counter() - start)
            start = time.perf_counter()
            chunked_token_confidence(logits, project=lambda z: z, k=20, chunk=positions_per_chunk(vocab_size=vocab))
            topk.append(time.perf_counter() - start)
    f, t = np.median(forward) * 1e3, np.median(topk) * 1e3
    print(f"one decoding step of {rows} rows (V = {vocab:,}), medians of {reps}: forward {f:.1f} ms, top-20 token "
          f"confidence {t:.2f} ms ({t / f:.3f}x the forward)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8000, help="traces per file")
    parser.add_argument("--tokens", type=int, default=16_384, help="tokens per trace")
    parser.add_argument("--generate", action="store_true", help="the generation comparison instead")
    parser.add_argument("--limit", type=int, default=4, help="--generate: problems")
    parser.add_argument("--n", type=int, default=4, help="--generate: samples per problem")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="--generate: tokens per sample at most")
    parser.add_argument("--formats", default="jsonl,parquet", help="which files to read (jsonl, parquet)")
    parser.add_argument("--dir", type=Path, default=None, help="keep the files here")
    args = parser.parse_args()
    if args.generate:
        generation(args.limit, args.max_new_tokens, args.n)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        reading(folder, args.rows, args.tokens, args.formats)


if __name__ == "__main__":
    main()
