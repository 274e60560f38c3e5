"""Peak memory and time of the test suite, per test.

    python bench/test_memory.py                          # the whole suite (tests/)
    python bench/test_memory.py tests/test_trl.py -k capo  # any pytest selection and options
    python bench/test_memory.py --top 20 tests/          # longer lists

Runs pytest in a child process while a sampler reads the resident memory (RSS) of the whole process tree from
/proc every 20 ms, so tests that spawn workers count their workers too. This file is also the pytest plugin that
marks when each test starts and ends (loaded with ``-p``), so every sample is charged to the test running at the
time. Prints the tree's peak RSS, the heaviest tests (peak RSS while each ran) and the slowest ones. Linux only
(/proc). Not collected by ``pytest`` itself: the suite's testpaths are tests/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EVENTS_ENV = "CALIBRL_MEMORY_EVENTS"
SAMPLE_SECONDS = 0.02
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


# ---------------------------------------------------------------------------------------------------- pytest plugin


def pytest_runtest_logstart(nodeid, location):
    _write_event("start", nodeid)


def pytest_runtest_logfinish(nodeid, location):
    _write_event("end", nodeid)


def _write_event(kind: str, nodeid: str) -> None:
    path = os.environ.get(EVENTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, "test": nodeid, "time": time.time()}) + "\n")


# ---------------------------------------------------------------------------------------------------- sampler


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                # the command name (field 2) may hold spaces and parentheses: split after its closing one
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="utf-8") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_bytes(root: int) -> int:
    """RSS of ``root`` and all its descendants (shared pages are counted once per process, as `top` does)."""
    children = _children_map()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss_bytes(pid)
        stack.extend(children.get(pid, []))
    return total


def run(pytest_args: list[str]) -> tuple[int, list[tuple[float, int]], list[dict]]:
    """Runs pytest with this plugin; returns its exit status, the (time, tree RSS) samples and the test events."""
    bench_dir = str(Path(__file__).resolve().parent)
    with tempfile.TemporaryDirectory() as tmp:
        events_path = Path(tmp) / "events.jsonl"
        env = dict(os.environ, **{EVENTS_ENV: str(events_path)})
        env["PYTHONPATH"] = os.pathsep.join(p for p in [bench_dir, env.get("PYTHONPATH", "")] if p)
        cmd = [sys.executable, "-m", "pytest", "-p", Path(__file__).stem, "-p", "no:cacheprovider", *pytest_args]
        proc = subprocess.Popen(cmd, env=env)
        samples: list[tuple[float, int]] = []
        while proc.poll() is None:
            samples.append((time.time(), tree_rss_bytes(proc.pid)))
            time.sleep(SAMPLE_SECONDS)
        events = [json.loads(line) for line in events_path.read_text().splitlines()] if events_path.exists() else []
    return proc.returncode, samples, events


def per_test(samples: list[tuple[float, int]], events: list[dict]) -> list[dict]:
    """Each test's duration and the peak tree RSS sampled while it ran."""
    starts: dict[str, float] = {}
    rows = []
    for event in events:
        if event["kind"] == "start":
            starts[event["test"]] = event["time"]
        elif event["test"] in starts:
            begin, end = starts.pop(event["test"]), event["time"]
            peak = max((rss for t, rss in samples if begin <= t <= end), default=0)
            rows.append({"test": event["test"], "seconds": end - begin, "peak_rss": peak})
    return rows


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def main(argv: list[str]) -> int:
    top = 10
    if argv[:1] == ["--top"]:
        top, argv = int(argv[1]), argv[2:]
    returncode, samples, events = run(argv)
    rows = per_test(samples, events)
    peak = max((rss for _, rss in samples), default=0)
    wall = samples[-1][0] - samples[0][0] if samples else 0.0
    print(f"\npytest exit status {returncode}; {len(rows)} tests in {wall:.0f} s")
    print(f"peak RSS of the pytest process tree: {_gb(peak)}")
    print(f"\nheaviest {top} tests (peak tree RSS while the test ran):")
    for row in sorted(rows, key=lambda r: -r["peak_rss"])[:top]:
        print(f"  {_gb(row['peak_rss']):>9}  {row['seconds']:6.1f} s  {row['test']}")
    print(f"\nslowest {top} tests:")
    for row in sorted(rows, key=lambda r: -r["seconds"])[:top]:
        print(f"  {row['seconds']:6.1f} s  {_gb(row['peak_rss']):>9}  {row['test']}")
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
