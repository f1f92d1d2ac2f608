"""Boot-to-exit time of a unikernel under pyvmm and other tenders, side by
side, and where pyvmm's time goes.

    python3 bench/boot.py [--runs 20] [--kernel guests/bin/hello.hvt]
                          [--peer solo5-hvt=$(scripts/solo5_build.py --print solo5-hvt)]
                          [--checkout NAME=DIR] [--phases] [--json FILE]

Each row runs a command --runs times after one warm-up; the rows take
turns (run 1 of every row, then run 2, ...), so a machine whose load
changes treats them alike. A row reports the median and 90th percentile
wall time from fork to wait4, the median CPU time (user + system, from
wait4's rusage: less sensitive to other processes than wall time). No
peak RSS: a child's ru_maxrss starts from this Python process's own, which
it was forked from (bench/density.py measures memory). ``--peer NAME=PATH``
adds a row running PATH on the same kernel (solo5-hvt runs pyvmm's own
guests as well as Solo5's): how far pyvmm's start is from a C tender's.
``--checkout NAME=DIR`` adds rows running another copy of pyvmm (DIR holds
its ``pyvmm`` package with the extension built, such as ``git archive`` of
an older commit plus a copy of pyvmm/_native.abi3.so) to compare before
and after: through its own launcher (DIR/pyvmm/_launcher, when it was
built: the same start as this checkout's ``pyvmm`` rows, whatever PYTHON*
variables this process has) and as ``python3 -m pyvmm`` with DIR first on
sys.path. The
"python3 -I -S -c pass" row is the floor any tender written in Python
pays to start.

``--phases`` also runs ``pyvmm --trace=FILE KERNEL`` --runs times and
prints the median of every phase (docs/startup.md): from the fork in this
process to the launcher's first instruction ("spawn"), pyvmm's own phases,
and from its last mark to wait4's return ("process exit": the kernel
closing what is left, the VM among it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUESTS = ROOT / "guests" / "bin"
LAUNCHER = ROOT / "pyvmm" / "_launcher"  # what scripts/setup installs as `pyvmm`
CLOCK = time.CLOCK_BOOTTIME  # the clock --trace's times are on


def run_once(argv: list[str], env: dict | None = None) -> tuple[float, float, int, int, int]:
    """(wall ms, CPU ms, exit status, fork ns, end ns)."""
    fork_ns = time.clock_gettime_ns(CLOCK)
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=None if env is None else "/",  # not this checkout's directory
    )
    _, wait_status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    end_ns = time.clock_gettime_ns(CLOCK)
    proc.returncode = os.waitstatus_to_exitcode(wait_status)
    cpu = (usage.ru_utime + usage.ru_stime) * 1000
    return elapsed * 1000, cpu, proc.returncode, fork_ns, end_ns


def rows(
    kernel: Path, peers: list[tuple[str, str]], checkouts: list[tuple[str, str]]
) -> list[tuple[str, list[str], dict | None]]:
    py = [sys.executable]
    pyvmm = [str(LAUNCHER)]
    name = kernel.name
    out = [
        ("python3 -I -S -c pass", py + ["-I", "-S", "-c", "pass"]),
        ("python3 -c pass", py + ["-c", "pass"]),
        ("pyvmm --version", pyvmm + ["--version"]),
        (f"pyvmm {name}", pyvmm + [str(kernel)]),
        (f"python3 -m pyvmm {name}", py + ["-m", "pyvmm", str(kernel)]),
        (f"pyvmm --no-sandbox {name}", pyvmm + ["--no-sandbox", str(kernel)]),
        (f"pyvmm --mem=8 {name}", pyvmm + ["--mem=8", str(kernel)]),
    ]
    out = [(label, argv, None) for label, argv in out]
    for label, directory in checkouts:
        launcher = Path(directory) / "pyvmm" / "_launcher"
        if launcher.exists():
            out.append((f"{label}: pyvmm --version", [str(launcher), "--version"], None))
            out.append((f"{label}: pyvmm {name}", [str(launcher), str(kernel)], None))
        env = dict(os.environ, PYTHONPATH=directory)
        out.append((f"{label}: python3 -m pyvmm --version", py + ["-m", "pyvmm", "--version"], env))
        out.append((f"{label}: python3 -m pyvmm {name}", py + ["-m", "pyvmm", str(kernel)], env))
    out += [(f"{peer} {name}", [path, str(kernel)], None) for peer, path in peers]
    return out


def side_by_side(table: list[tuple[str, list[str], dict | None]], runs: int) -> list[dict]:
    results = [
        {"row": label, "argv": argv, "env": env, "wall": [], "cpu": []}
        for label, argv, env in table
    ]
    for i in range(runs + 1):
        for result in results:
            wall, cpu, status, _, _ = run_once(result["argv"], result["env"])
            result["status"] = status
            if i:  # the first round warms the page cache
                result["wall"].append(wall)
                result["cpu"].append(cpu)
    return results


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def phases(kernel: Path, runs: int) -> list[tuple[str, float]]:
    """The median duration (ms) of every phase of ``pyvmm --trace``."""
    per_phase: dict[str, list[float]] = {}
    order: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.json"
        for i in range(runs + 1):
            _, _, status, fork_ns, end_ns = run_once([str(LAUNCHER), f"--trace={out}", str(kernel)])
            if status != 0:
                raise SystemExit(f"pyvmm --trace {kernel} exited with {status}")
            data = json.loads(out.read_text())
            start_ns = data["otherData"]["start_ns"]
            spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
            last_ns = start_ns + (spans[-1]["ts"] + spans[-1]["dur"]) * 1000
            timeline = [("spawn (fork, exec of the launcher)", (start_ns - fork_ns) / 1e6)]
            timeline += [(e["name"], e["dur"] / 1000) for e in spans]
            exiting = (end_ns - last_ns) / 1e6
            timeline.append(("process exit (the kernel: fds, VM, memory)", exiting))
            if not i:
                continue  # warm-up
            for name, ms in timeline:
                if name not in per_phase:
                    order.append(name)
                per_phase.setdefault(name, []).append(ms)
    return [(name, statistics.median(per_phase[name])) for name in order]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kernel", type=Path, default=GUESTS / "hello.hvt")
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another tender to run on the same kernel (repeatable)",
    )
    parser.add_argument(
        "--checkout",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="another copy of pyvmm to run as python3 -m pyvmm (repeatable)",
    )
    parser.add_argument("--phases", action="store_true", help="the median --trace breakdown")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    peers = []
    for spec in args.peer:
        name, eq, path = spec.partition("=")
        if not eq or not os.access(path, os.X_OK):
            parser.error(f"--peer {spec}: want NAME=PATH of an executable")
        peers.append((name, path))
    checkouts = []
    for spec in args.checkout:
        name, eq, directory = spec.partition("=")
        if not eq or not (Path(directory) / "pyvmm" / "__main__.py").exists():
            parser.error(f"--checkout {spec}: want NAME=DIR, DIR holding a pyvmm package")
        checkouts.append((name, str(Path(directory).resolve())))
    if not os.access(LAUNCHER, os.X_OK):
        parser.error(f"{LAUNCHER} is missing: run scripts/setup")

    load = os.getloadavg()[0]
    print(
        f"# {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, kernel "
        f"{platform.release()}, load {load:.2f}, {args.runs} runs per row, interleaved"
    )
    kernel = args.kernel.resolve()
    results = side_by_side(rows(kernel, peers, checkouts), args.runs)
    print(f"{'command':<44} {'median ms':>10} {'p90 ms':>8} {'CPU ms':>7} {'exit':>5}")
    for r in results:
        print(
            f"{r['row']:<44} {statistics.median(r['wall']):>10.1f} "
            f"{percentile(r['wall'], 0.9):>8.1f} {statistics.median(r['cpu']):>7.1f} "
            f"{r['status']:>5}"
        )
    breakdown = []
    if args.phases:
        breakdown = phases(kernel, args.runs)
        total = sum(ms for _, ms in breakdown)
        print(f"\n# pyvmm --trace {args.kernel.name}: median per phase over {args.runs} runs")
        print(f"{'phase':<50} {'median ms':>10}")
        for name, ms in breakdown:
            print(f"{name:<50} {ms:>10.2f}")
        print(f"{'sum of the medians':<50} {total:>10.2f}")
    if args.json:
        data = {
            "load": load,
            "runs": args.runs,
            "rows": [
                {
                    "row": r["row"],
                    "median_ms": statistics.median(r["wall"]),
                    "p90_ms": percentile(r["wall"], 0.9),
                    "cpu_ms": statistics.median(r["cpu"]),
                    "status": r["status"],
                }
                for r in results
            ],
            "phases_ms": dict(breakdown),
        }
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
