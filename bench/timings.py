"""Wall time of the demo commands, one at a time, each printed with the exact command that produced it.

    python bench/timings.py            # calibrl demo --quick, cold cache then warm cache
    python bench/timings.py --full     # also calibrl demo (the default demo, several minutes)

"Cold" runs with an empty ``CALIBRL_CACHE`` (the warm starts are trained first, as on a first run); "warm" reuses
the cache the cold run filled, as every later run does. The full demo runs after the quick ones with its own
empty cache, so its figure includes training its warm starts (what a first ``make demo`` costs). Outputs go to a
temporary folder (``--keep DIR`` keeps them there). The commands run one after the other, never side by side:
they share the machine's cores, and the figures are only comparable on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def calibrl_executable() -> str:
    """The ``calibrl`` script of the running Python environment (falls back to ``python -m calibrl``)."""
    script = Path(sys.executable).with_name("calibrl")
    return str(script) if script.exists() else f"{sys.executable} -m calibrl"


def time_command(args: list[str], cache: Path, log: Path) -> float:
    """Run ``args`` with ``CALIBRL_CACHE=cache`` (output to ``log``) and return its wall time in seconds; a
    failing command raises with the tail of its log."""
    env = {**os.environ, "CALIBRL_CACHE": str(cache)}
    start = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"{shlex.join(args)} failed with exit code {code}:\n{tail}")
    return seconds


def describe(seconds: float) -> str:
    minutes = seconds / 60
    return f"{seconds:6.0f} s (about {minutes:.1f} minutes)" if minutes >= 1 else f"{seconds:6.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also time `calibrl demo` (long: several minutes)")
    parser.add_argument("--keep", type=Path, default=None, help="folder for the outputs, caches and logs")
    opts = parser.parse_args(argv)
    root = opts.keep or Path(tempfile.mkdtemp(prefix="calibrl-timings-"))
    root.mkdir(parents=True, exist_ok=True)
    exe = shlex.split(calibrl_executable())
    quick_cache, full_cache = root / "cache-quick", root / "cache-full"
    plan = [
        ("calibrl demo --quick (cold cache: trains the warm starts)", exe + ["demo", "--quick", "--out",
                                                                           str(root / "quick-cold")], quick_cache),
        ("calibrl demo --quick (warm cache)", exe + ["demo", "--quick", "--out", str(root / "quick-warm")],
         quick_cache),
    ]
    if opts.full:
        plan.append(("calibrl demo (cold cache: trains the warm starts)",
                     exe + ["demo", "--out", str(root / "full-cold")], full_cache))
        plan.append(("calibrl demo (warm cache)", exe + ["demo", "--out", str(root / "full-warm")], full_cache))
    print(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the start; outputs in {root}",
          flush=True)
    for name, args, cache in plan:
        log = root / (args[args.index("--out") + 1].rsplit("/", 1)[-1] + ".log")
        seconds = time_command(args, cache, log)
        print(f"{describe(seconds)}  {name}\n{'':>10}CALIBRL_CACHE={cache} {shlex.join(args)}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
