"""Wall time of ``calibrl --help``, ``calibrl <cmd> --help`` and an argument error, each in a fresh interpreter.

    python bench/cli_startup.py [--repeats 5]

Prints the median and the slowest of the repeats per command line, and whether the run imported torch (it
should not: the commands import their heavy modules in their bodies).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

COMMAND_LINES = (
    ["--help"],
    ["train", "--help"],
    ["eval", "--help"],
    ["generate", "--help"],
    ["demo", "--help"],
    ["demo", "--seeds", "0"],
)

PROBE = """
import sys
from calibrl.cli import app
try:
    app(sys.argv[1:], standalone_mode=False)
except Exception:
    pass
sys.stderr.write("torch imported: %s\\n" % ("torch" in sys.modules))
"""


def time_command(argv: list[str], repeats: int) -> tuple[list[float], bool]:
    seconds, torch_loaded = [], False
    for _ in range(repeats):
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True)
        seconds.append(time.perf_counter() - start)
        torch_loaded |= "torch imported: True" in result.stderr
    return seconds, torch_loaded


def main(argv: list[str]) -> None:
    repeats = int(argv[1]) if argv[:1] == ["--repeats"] else 5
    print(f"{'command':<28} {'median':>8} {'max':>8}  torch")
    for command in COMMAND_LINES:
        seconds, torch_loaded = time_command(command, repeats)
        print(f"calibrl {' '.join(command):<20} {statistics.median(seconds):7.2f}s {max(seconds):7.2f}s  "
              f"{'imported' if torch_loaded else 'not imported'}")


if __name__ == "__main__":
    main(sys.argv[1:])
