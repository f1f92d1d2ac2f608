"""How late a guest's solo5_yield to a deadline comes back, under pyvmm and
other tenders, side by side.

    python3 bench/oversleep.py [--runs 4] [--solo5-dir /var/cache/pyvmm-solo5-build/solo5-v0.12.1]
                               [--peer solo5-hvt=$(scripts/solo5_build.py --print solo5-hvt)]
                               [--checkout NAME=DIR] [--json FILE]

Two guests measure their own sleeps with their own clocks (the TSC, scaled
by the frequency the tender reports in the boot info) and print them:
Solo5's test_time (five yields to now + 1 s; built from Solo5's source as
scripts/solo5_build.py builds it) and pyvmm's guests/bin/sleep.hvt (1, 10 and
100 ms). The oversleep is what a yield took beyond what it asked for.
Each row runs both guests --runs times; the rows take turns, so a machine
whose load changes treats them alike. A row reports, per requested sleep,
the median, the 90th percentile and the smallest oversleep in
microseconds (a busy machine adds its scheduling delays to the upper
figures; the smallest is what the tender's wait itself adds).

``--peer NAME=PATH`` adds a tender binary (solo5-hvt runs both guests);
``--checkout NAME=DIR`` another copy of pyvmm (DIR holds its ``pyvmm``
package with the extension built, such as ``git archive`` of an older
commit), run as ``python3 -m pyvmm`` with DIR first on sys.path, to compare
before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "pyvmm" / "_launcher"
SOLO5_DIR = Path("/var/cache/pyvmm-solo5-build/solo5-v0.12.1")  # scripts/solo5_build.py

# test_time: "[5] Slept for 1000150990 ns" after a yield to now + 1 s.
SOLO5_SLEPT = re.compile(r"^\[\d\] Slept for (\d+) ns$", re.M)
# guests/sleep.c: "sleep  10 ms:    10107 us".
OWN_SLEPT = re.compile(r"^sleep +(\d+) ms: +(\d+) us$", re.M)


def oversleeps(argv: list[str], kernel: Path, env: dict | None) -> dict[str, list[float]]:
    """Requested sleep ("1 s", "10 ms") -> oversleeps in microseconds."""
    done = subprocess.run(
        [*argv, "--mem=64", str(kernel)],
        capture_output=True,
        text=True,
        env=env,
        # Not this checkout's directory: python3 -m puts it before PYTHONPATH.
        cwd="/",
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} {kernel}: status {done.returncode}: {done.stderr.strip()}")
    found: dict[str, list[float]] = {}
    for ns in SOLO5_SLEPT.findall(done.stdout):
        found.setdefault("1 s", []).append((int(ns) - 1_000_000_000) / 1000)
    for ms, us in OWN_SLEPT.findall(done.stdout):
        found.setdefault(f"{ms} ms", []).append(int(us) - int(ms) * 1000)
    return found


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--solo5-dir", type=Path, default=SOLO5_DIR)
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    kernels = [ROOT / "guests" / "bin" / "sleep.hvt"]
    test_time = args.solo5_dir / "hvt-tests" / "test_time.hvt"
    if test_time.exists():
        kernels.insert(0, test_time)
    else:
        print(f"no {test_time}: Solo5's test_time is left out", file=sys.stderr)
    rows: list[tuple[str, list[str], dict | None]] = [("pyvmm", [str(LAUNCHER)], None)]
    for spec in args.checkout:
        name, _, where = spec.partition("=")
        env = dict(os.environ, PYTHONPATH=where, PYVMM_PYTHON=sys.executable)
        rows.append((name, [sys.executable, "-m", "pyvmm"], env))
    for spec in args.peer:
        name, _, path = spec.partition("=")
        rows.append((name, [path], None))

    results: dict[str, dict[str, list[float]]] = {name: {} for name, _, _ in rows}
    for _ in range(args.runs):
        for name, argv, env in rows:
            for kernel in kernels:
                for asked, values in oversleeps(argv, kernel, env).items():
                    results[name].setdefault(asked, []).extend(values)

    asked_all = sorted({a for r in results.values() for a in r}, key=_as_ns)
    print(f"oversleep of a yield, us (median / p90 / min), {args.runs} runs, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'tender':<16}" + "".join(f"{a:>24}" for a in asked_all))
    for name, _, _ in rows:
        cells = []
        for asked in asked_all:
            v = results[name].get(asked, [])
            cells.append(
                f"{statistics.median(v):8.0f} /{percentile(v, 0.9):6.0f} /{min(v):5.0f}"
                if v
                else f"{'-':>24}"
            )
        print(f"{name:<16}" + "".join(f"{c:>24}" for c in cells))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


def _as_ns(asked: str) -> int:
    value, unit = asked.split()
    return int(value) * (1_000_000_000 if unit == "s" else 1_000_000)


if __name__ == "__main__":
    sys.exit(main())
