"""Time of ``calibrl eval`` with its defaults at 200,000 and 1,000,000 samples, against reading the file with
``json.loads`` line by line; and the agreement of RPC's batched fit with scipy's per-prompt fit.

    python bench/eval_scale.py                          # 200,000 and 1,000,000 samples (long)
    python bench/eval_scale.py --sizes 40000            # a quicker run
    python bench/eval_scale.py --sizes 40000 --no-cli   # per-stage times only (no second, CLI run)
    python bench/eval_scale.py --sizes 200000 --workers 1,2   # one process, then two (CALIBRL_WORKERS)
    python bench/eval_scale.py --sizes 200000 --workers 1 --busy  # beside a process spinning on one core
    python bench/eval_scale.py --agreement --groups 400 # RPC keep-masks: batched vs scipy, N = 2 .. 64

Files look like a user's sweep: 8 samples per prompt with ``prompt_id``, ``correct``, ``logprob_mean`` and
``answer`` (85% of prompts with integer answers, 10% fractions ``\\frac{a}{b}``, 5% radicals ``a\\sqrt{b}``; a
prompt's wrong answers drawn from the same family, so math-verify has distinct strings to compare). For each size,
four child processes run one after the other on the same file: ``json.loads`` of every line, ``orjson.loads`` of
every line (the parser the command reads with), the stages of
``calibrl eval`` timed one by one (reading, then each step the progress display names), and the ``calibrl eval``
command itself with the defaults (1000 bootstrap resamples, every selection method and its scaling curve, the
figures). It prints each stage's seconds (and, inside the confidence sources' bootstrap and RPC's stage, each
source's replicates by figure and each of RPC's fits), the command's seconds and its ratio to ``json.loads``, and
the part of them that is the process's exit after the command; then, on a file of 800 samples, that exit with the
objects frozen (as ``calibrl.cli.main`` leaves them after an eval) and collected by Python's exit (as before).
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

PER_PROMPT = 8


def write_samples(path: Path, rows: int, *, seed: int = 0) -> int:
    """Write ``rows`` sample rows (``rows // 8`` prompts x 8) to ``path``; returns the file's size in bytes."""
    rng = np.random.default_rng(seed)
    with path.open("w", encoding="utf-8") as f:
        for p in range(rows // PER_PROMPT):
            kind = rng.uniform()
            if kind < 0.85:
                def draw() -> str:
                    return str(int(rng.integers(0, 1000)))
            elif kind < 0.95:
                def draw() -> str:
                    return f"\\frac{{{int(rng.integers(1, 20))}}}{{{int(rng.integers(2, 20))}}}"
            else:
                def draw() -> str:
                    return f"{int(rng.integers(1, 10))}\\sqrt{{{int(rng.integers(2, 10))}}}"
            gold, skill = draw(), rng.uniform(0.1, 0.95)
            wrong = [draw() for _ in range(3)]  # a prompt's wrong answers repeat, as models' do
            lines = []
            for _ in range(PER_PROMPT):
                answer = gold if rng.uniform() < skill else wrong[int(rng.integers(0, 3))]
                lpm = -float(rng.exponential(0.3)) - 0.2 * (answer != gold)
                lines.append(json.dumps({"prompt_id": f"q{p}", "correct": answer == gold,
                                         "logprob_mean": round(lpm, 6), "answer": answer}))
            f.write("\n".join(lines) + "\n")
    return path.stat().st_size


_JSON = ("import sys, time, json; t = time.perf_counter(); f = open(sys.argv[1], 'rb'); "
         "n = sum(1 for line in f if json.loads(line) is not None); print(time.perf_counter() - t)")
# the parser calibrl reads JSON Lines with (json.loads where it refuses a line), timed the same way: the ratio to
# json.loads is the goal's measure, the ratio to this one what calibrl adds beyond parsing
_ORJSON = _JSON.replace("json", "orjson")


# ``calibrl <args>`` as the console script runs it, printing the wall time at which its main() returned: the rest
# of the process's time is Python's exit; with ``--collect``, gc.freeze is made a no-op, so the exit collects
# every object as it did before 2026-11-30 (calibrl.cli.main freezes them after an eval)
_CLI = """import sys, time, runpy
if sys.argv[1] == "--collect":
    import gc
    gc.freeze = lambda: None
    del sys.argv[1]
sys.argv = ["calibrl", *sys.argv[1:]]
try:
    runpy.run_module("calibrl", run_name="__main__")
finally:
    print(time.time(), flush=True)
"""


def _run_cli(args: list[str], workers: str | None = None) -> tuple[float, float]:
    """(seconds of the whole process, seconds from the command's end to the process's end) of ``calibrl args``."""
    took, out = _run([sys.executable, "-c", _CLI, *args], workers)
    return took, time.time() - float(out.strip().splitlines()[-1])


def exit_cost(folder: Path) -> None:
    """The process's exit after ``calibrl eval`` of a small file (800 samples: the exit does not grow with the
    file), with the objects frozen (the command) and collected at exit (as before 2026-11-30), one after the other."""
    path = folder / "samples_800.jsonl"
    write_samples(path, 800)
    args = ["eval", str(path), "--out", str(folder / "out_800")]
    for label, extra in (("frozen (calibrl.cli.main's gc.freeze)", []), ("collected by Python's exit", ["--collect"])):
        took, exiting = _run_cli(extra + args, "1")
        print(f"  800 samples, the exit after the command, objects {label}: {exiting:.2f} s (the command: {took:.1f} s)",
              flush=True)


def _time_inside(times: list[list]) -> None:
    """Wrap what the two longest stages are made of, so the same run also says where their time goes: each
    confidence source's PRR + AUROC replicates and smooth-ECE replicates (``inside: <source> <figure>``), and each
    of RPC's fits (``inside: RPC fit of <P> prompts``), appended to ``times`` as they end."""
    from calibrl.evaluation import scoring
    from calibrl.selection import pruning

    def timed(label, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            times.append([f"inside: {label(*args)}", time.perf_counter() - start])
            return out
        return run

    real_bootstrap, real_fit = scoring.source_bootstrap, pruning._rpc_keep_mask

    def source_bootstrap(arrays, *args, **kwargs):
        names = {"prr": iter(arrays), "smooth": iter(k for k, v in arrays.items() if v[4])}  # creation order
        real_prr, real_smooth = scoring.PRRReplicates, scoring.SmoothECEReplicates

        class PRR(real_prr):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                name = next(names["prr"])
                self.with_auroc = timed(lambda c: f"{name} PRR + AUROC", super().with_auroc)

        class Smooth(real_smooth):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                self.name = next(names["smooth"])

            def __call__(self, counts):
                return timed(lambda c: f"{self.name} smooth ECE", super().__call__)(counts)

        scoring.PRRReplicates, scoring.SmoothECEReplicates = PRR, Smooth
        try:
            return real_bootstrap(arrays, *args, **kwargs)
        finally:
            scoring.PRRReplicates, scoring.SmoothECEReplicates = real_prr, real_smooth

    scoring.source_bootstrap = source_bootstrap
    pruning._rpc_keep_mask = timed(lambda pidx, *_: f"RPC fit of {int(np.unique(pidx).size):,} prompts", real_fit)


def stages_child(path: str) -> None:
    """Run the stages of ``calibrl eval`` (defaults) on ``path`` and print ``[[stage, seconds], ...]`` as JSON
    (what the two longest stages are made of as ``inside: ...`` entries, see :func:`_time_inside`)."""
    from calibrl.evaluation.pipeline import write_eval_report
    from calibrl.evaluation.samples import load_samples
    from calibrl.evaluation.settings import EvalSettings

    times: list[list] = []
    _time_inside(times)
    start = time.perf_counter()
    samples = load_samples(path)
    times.append(["read and validate", time.perf_counter() - start])
    last = [time.perf_counter(), None]

    def step(desc: str | None) -> None:
        now = time.perf_counter()
        if last[1] is not None:
            times.append([last[1], now - last[0]])
        last[:] = [now, desc]

    with tempfile.TemporaryDirectory() as out:
        write_eval_report(Path(out), [samples], labels=["x"], files=[Path(path)], settings=EvalSettings(),
                          step=step)
        step(None)
    print(json.dumps(times))


def _run(argv: list[str], workers: str | None = None) -> tuple[float, str]:
    env = None if workers is None else {**os.environ, "CALIBRL_WORKERS": workers}
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start, proc.stdout


def timing(folder: Path, rows: int, cli: bool, workers: str | None = None) -> None:
    path = folder / f"samples_{rows}.jsonl"
    size = write_samples(path, rows)
    shown = workers or os.environ.get("CALIBRL_WORKERS") or f"default ({os.cpu_count()} cores)"
    print(f"{rows:,} samples ({rows // PER_PROMPT:,} prompts x {PER_PROMPT}, {size / 1e6:.0f} MB), "
          f"CALIBRL_WORKERS={shown}, load average {os.getloadavg()[0]:.1f}", flush=True)
    _, out = _run([sys.executable, "-c", _JSON, str(path)])
    t_json = float(out.split()[0])
    print(f"  json.loads per line          {t_json:8.1f} s", flush=True)
    _, out = _run([sys.executable, "-c", _ORJSON, str(path)])
    t_orjson = float(out.split()[0])
    print(f"  orjson.loads per line        {t_orjson:8.1f} s (the parser calibrl reads with)", flush=True)
    _, out = _run([sys.executable, __file__, "--stages-child", str(path)], workers)
    stages = json.loads(out.strip().splitlines()[-1])
    merged: dict[str, float] = {}
    inside: dict[str, float] = {}
    for name, sec in stages:
        if name.startswith("inside: "):  # part of a stage, printed below it
            inside[name[8:]] = inside.get(name[8:], 0.0) + sec
            continue
        key = name.split(": ", 1)[-1] if ": " in name else name
        if key.startswith("scaling curve '"):  # one step per draw: add them to their method's stage
            key = f"selection {key.split(' ', 2)[2].split(',')[0]} and its scaling curve"
        elif key.startswith(("bootstrap, confidence sources", "bootstrap of the confidence sources")):
            # the figures' bootstrap (accuracy, AUROC, ECE, Brier) shares the sources' draws, in this stage
            key = "bootstrap of the confidence sources (AUROC, PRR, smooth ECE) and of the figures"
        elif key.startswith("bootstrap"):  # one step per chunk of replicates
            key = "bootstrap (1000 prompt resamples)"
        merged[key] = merged.get(key, 0.0) + sec
    for key, sec in merged.items():
        print(f"    {key:55s} {sec:8.1f} s")
    print("  inside them (the replicates of each source by figure, each of RPC's fits):")
    for key, sec in inside.items():
        print(f"      {key:53s} {sec:8.1f} s")
    total = sum(merged.values())
    print(f"  stages in total              {total:8.1f} s  ({total / t_json:.1f}x json.loads)", flush=True)
    if cli:
        out = folder / f"out_{rows}_w{workers or 'default'}"
        t_cli, t_exit = _run_cli(["eval", str(path), "--out", str(out)], workers)
        print(f"  calibrl eval (defaults)      {t_cli:8.1f} s  ratio to json.loads: {t_cli / t_json:.1f}x "
              f"(target: 20x at 200,000 samples, 15x at 1,000,000); to orjson.loads: {t_cli / t_orjson:.0f}x; "
              f"its exit after the command {t_exit:.2f} s", flush=True)


def agreement(groups: int, seed: int) -> None:
    """Keep-masks of RPC's batched fit vs scipy's per-prompt fit on random groups, and RPC's scaling curves."""
    from calibrl.selection import scaling_curve
    from calibrl.selection.pruning import rpc_keep_mask

    rng = np.random.default_rng(seed)
    print(f"RPC keep-mask agreement, batched vs scipy per prompt ({groups} random prompts per N)")
    for n in (2, 3, 4, 6, 8, 12, 16, 32, 64):
        pid = np.repeat(np.arange(groups), n)
        wrong = rng.uniform(size=pid.size) < rng.uniform(0.1, 0.9, size=groups)[pid]
        lpm = -rng.exponential(rng.uniform(0.1, 0.6, size=groups)[pid]) - 0.2 * wrong
        t = time.perf_counter()
        batched = rpc_keep_mask(pid, lpm)
        t_b = time.perf_counter() - t
        t = time.perf_counter()
        ref = rpc_keep_mask(pid, lpm, solver="scipy")
        t_s = time.perf_counter() - t
        same = (batched == ref).reshape(groups, n).all(axis=1)
        print(f"  N = {n:2d}: {same.mean():7.2%} of prompts identical ({(~same).sum()} differ); "
              f"batched {1e3 * t_b / groups:5.2f} ms/prompt, scipy {1e3 * t_s / groups:5.2f} ms/prompt", flush=True)
    pid = np.repeat(np.arange(groups), 8)
    answers = rng.integers(0, 3, size=pid.size)
    correct = answers == 0
    lpm = -rng.exponential(0.3, size=pid.size) - 0.2 * ~correct
    from calibrl.selection import pruning

    curves = {}
    batched = pruning.rpc_keep_mask
    for solver in ("batched", "scipy"):
        pruning.rpc_keep_mask = lambda p, lpm, solver=solver: batched(p, lpm, solver=solver)
        try:
            curves[solver] = scaling_curve("rpc", answers, correct, pid, logprob_mean=lpm, n_draws=2).accuracy
        finally:
            pruning.rpc_keep_mask = batched
    diff = np.abs(curves["batched"] - curves["scipy"])
    print(f"  RPC scaling curve (N = 1, 2, 4, 8; {groups} prompts): largest accuracy difference {diff.max():.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200000,1000000", help="comma-separated sample counts")
    parser.add_argument("--no-cli", action="store_true", help="per-stage times only, no calibrl eval command run")
    parser.add_argument("--agreement", action="store_true", help="RPC batched-vs-scipy agreement instead")
    parser.add_argument("--workers", default=None,
                        help="comma-separated CALIBRL_WORKERS values, each size timed with each (default: as set)")
    parser.add_argument("--groups", type=int, default=400, help="prompts per N for --agreement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="keep the files here")
    parser.add_argument("--busy", action="store_true",
                        help="time everything beside a busy process (a Python loop spinning on one core)")
    parser.add_argument("--stages-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stages_child:
        stages_child(args.stages_child)
    elif args.agreement:
        agreement(args.groups, args.seed)
    else:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
        try:
            if busy is not None:
                print("beside a busy process (a Python loop spinning on one core)", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                folder = args.dir or Path(tmp)
                folder.mkdir(parents=True, exist_ok=True)
                for rows in (int(s) for s in args.sizes.split(",")):
                    for workers in (args.workers.split(",") if args.workers else [None]):
                        timing(folder, rows, cli=not args.no_cli, workers=workers)
                if not args.no_cli:
                    exit_cost(folder)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()


if __name__ == "__main__":
    main()
