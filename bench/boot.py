"""Boot-to-exit time and peak RSS of guests under pyvmm, side by side.

    python3 bench/boot.py [--runs 20]

Each row runs a command --runs times (one warm-up first) and reports the
median and 90th percentile wall time and the largest peak RSS, taken from
wait4()'s rusage of the child, so it is the pyvmm process alone. The
"python3 -c pass" row is the floor any Python tender pays to start.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GUESTS = ROOT / "guests" / "bin"


def measure(argv: list[str], runs: int) -> tuple[np.ndarray, int, int]:
    times, rss, status = [], 0, 0
    for i in range(runs + 1):
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, wait_status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        status = proc.returncode
        if i:  # the first run warms the page cache
            times.append(elapsed)
            rss = max(rss, usage.ru_maxrss)
    return np.array(times) * 1000, rss, status


def rows(runs: int) -> list[tuple[str, list[str]]]:
    py = [sys.executable]
    pyvmm = py + ["-m", "pyvmm"]
    return [
        ("python3 -c pass", py + ["-c", "pass"]),
        ("pyvmm --version", pyvmm + ["--version"]),
        ("pyvmm hello.hvt", pyvmm + [str(GUESTS / "hello.hvt")]),
        ("pyvmm --no-sandbox hello.hvt", pyvmm + ["--no-sandbox", str(GUESTS / "hello.hvt")]),
        ("pyvmm --mem=8 hello.hvt", pyvmm + ["--mem=8", str(GUESTS / "hello.hvt")]),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    import importlib.util

    import pyvmm.vmm

    # Whether imports read bytecode or compile the sources on every start
    # (PYTHONDONTWRITEBYTECODE with no compiled files: scripts/setup compiles).
    cached = Path(importlib.util.cache_from_source(pyvmm.vmm.__file__)).exists()
    print(
        f"# {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"kernel {platform.release()}, {args.runs} runs each, "
        f"pyvmm bytecode {'compiled' if cached else 'NOT compiled (sources parsed each start)'}"
    )
    print(f"{'command':<28} {'median ms':>10} {'p90 ms':>8} {'peak RSS MiB':>13} {'exit':>5}")
    for label, argv in rows(args.runs):
        times, rss_kib, status = measure(argv, args.runs)
        print(
            f"{label:<28} {np.median(times):>10.1f} {np.percentile(times, 90):>8.1f} "
            f"{rss_kib / 1024:>13.1f} {status:>5}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
