"""Peak memory and time of ``calibrl eval`` on long completions, and of reading a million samples.

    python bench/eval_memory.py                    # 8,000 samples x 20,000-char completions (160 MB) vs 200-char
    python bench/eval_memory.py --rows 2000        # a quicker, smaller run of the same comparison
    python bench/eval_memory.py --million          # 1,000,000 short samples: reading vs merely parsing the file
    python bench/eval_memory.py --big-row 5        # one row with a 5 MB completion among short ones

Every measurement runs in a child process; its peak resident memory (RSS) is the child's ``ru_maxrss`` from
``os.wait4`` and its time the wall time of the child, both printed. The files are written to a temporary folder
(``--dir`` to keep them). Rows look like ``calibrl generate``'s: 16 samples per prompt, a benchmark, the answer, a
reward, logprob_mean, verbalized_confidence, n_tokens and the completion text (one in eight a copy of an earlier
path of its prompt, so PC and RPC have identical texts to count once).

The eval comparison runs ``calibrl eval --methods majority,weighted,pc,best_of_n --bootstrap 100 --scaling-draws 2
--no-math-verify`` (``--eval-args`` to change): PC compares the texts exactly as RPC does (the same text ids and
first-occurrence mask), and the rest of the defaults (RPC's mixture fits, 1000 resamples, math-verify) only add
time that does not depend on the texts, so the time ratio below is the texts' cost. ``--million`` times three children on one file: ``load_samples``
(reading and validation, the stage this measures), ``json.loads`` of every line, and ``pyarrow.json.read_json``
(the practical limit of merely parsing the file); and one full ``calibrl eval --methods '' --bootstrap 0``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PER_PROMPT = 16
_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz      ", dtype=np.uint8)


def write_samples(path: Path, *, rows: int, chars: int, seed: int = 0, big_row_mb: float = 0.0) -> int:
    """Write ``rows`` calibrl sample rows with ``chars``-character completions to ``path`` (one row, the first, with
    a ``big_row_mb`` MB completion when > 0); returns the file's size in bytes."""
    rng = np.random.default_rng(seed)
    answers = rng.integers(0, 4, rows)  # [rows] each path's answer, "0" is right
    lpm, stated = -rng.exponential(0.5, rows), np.round(rng.uniform(size=rows), 3)  # [rows], [rows]
    copy_of = rng.integers(0, PER_PROMPT, rows)  # [rows] which earlier path of its prompt a copy repeats
    with path.open("w", encoding="utf-8") as f:
        texts: list[str] = []
        block = ""
        for i in range(rows):
            prompt = i // PER_PROMPT
            if i % PER_PROMPT == 0:
                texts = []
                # the prompt's random words: 16 texts' worth, each text a slice of them
                length = int(big_row_mb * 1e6) if (i == 0 and big_row_mb > 0) else chars
                block = _LETTERS[rng.integers(0, len(_LETTERS), length + PER_PROMPT)].tobytes().decode("ascii")
            if texts and i % 8 == 7:  # a copy of an earlier path of this prompt: PC / RPC count it once
                text, answer = texts[int(copy_of[i]) % len(texts)]
            else:
                answer = str(int(answers[i]))
                tail = f" so the answer is \\boxed{{{answer}}} <confidence>0.7</confidence>"
                start = i % PER_PROMPT
                size = int(big_row_mb * 1e6) if (i == 0 and big_row_mb > 0) else chars
                text = block[start:start + max(size - len(tail), 0)] + tail
            texts.append((text, answer))
            row = {"prompt_id": str(prompt), "benchmark": "math" if prompt % 2 else "aime",
                   "sample_index": i % PER_PROMPT, "completion": text, "correct": answer == "0",
                   "reward": float(answer == "0"), "logprob_mean": float(lpm[i]),
                   "verbalized_confidence": float(stated[i]), "n_tokens": len(text) // 4, "truncated": False,
                   "answer": answer, "gold": "0"}
            f.write(json.dumps(row) + "\n")
    return path.stat().st_size


def samples_file(folder: Path, *, rows: int, chars: int, big_row_mb: float = 0.0) -> tuple[Path, int]:
    """(path, size in bytes) of the samples file of these settings in ``folder``, written unless already there."""
    path = folder / (f"samples-{rows}x{chars}" + (f"-big{big_row_mb:g}MB" if big_row_mb else "") + ".jsonl")
    if not path.exists():
        part = path.with_suffix(".part")
        write_samples(part, rows=rows, chars=chars, big_row_mb=big_row_mb)
        part.rename(path)
    return path, path.stat().st_size


def run(argv: list[str]) -> tuple[float, float, str]:
    """(peak RSS in MB, wall seconds, stdout) of the child process ``argv``; its own peak (``os.wait4``), not the
    maximum over all children; raises if it fails."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:4])} ... exited {proc.returncode}:\n{err.read()[-3000:]}")
        return usage.ru_maxrss / 1024, wall, out.read()


EVAL_ARGS = "--methods majority,weighted,pc,best_of_n --bootstrap 100 --scaling-draws 2 --no-math-verify"


def _eval(path: Path, out: Path, options: str = EVAL_ARGS) -> list[str]:
    return [sys.executable, "-m", "calibrl", "eval", str(path), "--out", str(out), *options.split()]


_READ = ("import sys, time; t = time.perf_counter(); from calibrl.evaluation.samples import load_samples; "
         "t1 = time.perf_counter(); s = load_samples(sys.argv[1]); print(time.perf_counter() - t1, len(s))")
_JSON = ("import sys, time, json; t = time.perf_counter(); f = open(sys.argv[1], 'rb'); "
         "n = sum(1 for line in f if json.loads(line) is not None); print(time.perf_counter() - t, n)")
_ARROW = ("import sys, time; import pyarrow.json as pj; t = time.perf_counter(); "
          "n = pj.read_json(sys.argv[1]).num_rows; print(time.perf_counter() - t, n)")


def compare_long_short(folder: Path, rows: int, chars: int, options: str, read_only: bool = False) -> None:
    (short, short_size), (long, long_size) = (samples_file(folder, rows=rows, chars=200),
                                              samples_file(folder, rows=rows, chars=chars))
    sizes = {"short": short_size, "long": long_size}
    print(f"load_samples (reading + validation) of {rows} samples; peak RSS of the child process")
    for name, path in (("short", short), ("long", long)):
        peak, _, out = run([sys.executable, "-c", _READ, str(path)])
        print(f"  {name:5s} ({sizes[name] / 1e6:7.1f} MB): peak {peak:7.0f} MB, {float(out.split()[0]):6.1f} s")
    if read_only:
        return
    print(f"calibrl eval {options} on {rows} samples; peak RSS of the child process")
    results = {}
    for name, path in (("short", short), ("long", long)):
        peak, wall, _ = run(_eval(path, folder / f"out-{name}", options))
        results[name] = (peak, wall)
        width = 200 if name == "short" else chars
        print(f"  {name:5s} ({width:>6,} chars, {sizes[name] / 1e6:7.1f} MB): peak {peak:7.0f} MB "
              f"({peak * 2**20 / sizes[name]:5.1f}x the file), {wall:6.1f} s")
    print(f"  long / short: peak {results['long'][0] / results['short'][0]:.2f}x, "
          f"time {results['long'][1] / results['short'][1]:.2f}x")


def big_row(folder: Path, mb: float) -> None:
    path, size = samples_file(folder, rows=256, chars=200, big_row_mb=mb)
    try:
        peak, wall, _ = run(_eval(path, folder / "out-big"))
        print(f"one {mb:g} MB completion among 256 rows ({size / 1e6:.1f} MB file): peak {peak:.0f} MB, {wall:.1f} s")
    except RuntimeError as exc:
        print(f"one {mb:g} MB completion among 256 rows ({size / 1e6:.1f} MB file): refused\n  {str(exc).strip()[-400:]}")


def million(folder: Path, rows: int) -> None:
    path, size = samples_file(folder, rows=rows, chars=200)
    print(f"{rows:,} samples with 200-char completions ({size / 1e6:.0f} MB)")
    figures = {}
    for name, code in (("json.loads per line", _JSON), ("pyarrow.json.read_json", _ARROW),
                       ("load_samples (read + validate)", _READ)):
        peak, wall, out = run([sys.executable, "-c", code, str(path)])
        figures[name] = float(out.split()[0])
        print(f"  {name:32s} {figures[name]:7.1f} s (child peak {peak:6.0f} MB)")
    read = figures["load_samples (read + validate)"]
    print(f"  load_samples / json.loads: {read / figures['json.loads per line']:.2f}x, "
          f"/ pyarrow: {read / figures['pyarrow.json.read_json']:.2f}x")
    peak, wall, _ = run([sys.executable, "-m", "calibrl", "eval", str(path), "--out", str(folder / "out-million"),
                         "--methods", "", "--bootstrap", "0"])
    print(f"  calibrl eval --methods '' --bootstrap 0: {wall:.1f} s, peak {peak:.0f} MB "
          f"({peak * 2**20 / size:.2f}x the file)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8000, help="samples per file of the long/short comparison")
    parser.add_argument("--chars", type=int, default=20_000, help="completion length of the long file")
    parser.add_argument("--million", action="store_true", help="the 1,000,000-sample reading comparison instead")
    parser.add_argument("--million-rows", type=int, default=1_000_000)
    parser.add_argument("--big-row", type=float, default=0.0, help="MB of one row's completion (instead)")
    parser.add_argument("--read-only", action="store_true", help="only the reading stage of the comparison")
    parser.add_argument("--eval-args", default=EVAL_ARGS, help="calibrl eval's options in the comparison")
    parser.add_argument("--dir", type=Path, default=None, help="keep the files here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.million:
            million(folder, args.million_rows)
        elif args.big_row:
            big_row(folder, args.big_row)
        else:
            compare_long_short(folder, args.rows, args.chars, args.eval_args, args.read_only)


if __name__ == "__main__":
    main()
