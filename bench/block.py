"""Block request cost, hypercalls answered in C against Python, side by side.

    python3 bench/block.py [--requests 2000] [--runs 3]

For each request size, the blkbench guest writes --requests requests at
consecutive offsets of a 64 MiB scratch image, then reads them back and
checks the data, timing each phase with its TSC clock. Each size runs with
the C hypercall fast path (csrc/hcfast.c) and with every hypercall answered
by Python (PYVMM_PY_HYPERCALLS=1); every figure is the median of --runs.
The image lives in a temporary directory and is removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GUEST = ROOT / "guests" / "bin" / "blkbench.hvt"
SIZES = (512, 4096, 65536)
IMAGE_BYTES = 64 << 20


def run_guest(image: Path, requests: int, size: int, python: bool) -> tuple[int, int, str]:
    env = dict(os.environ, PYVMM_PY_HYPERCALLS="1") if python else None
    argv = [sys.executable, "-m", "pyvmm", f"--block:storage={image}", str(GUEST)]
    argv += [str(requests), str(size)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    if result.returncode != 0:
        raise SystemExit(f"blkbench {size} failed: {result.stdout}{result.stderr}")
    out = dict(re.findall(r"^(\w+): (\S+)$", result.stdout, re.M))
    return int(out["write_ns"]), int(out["read_ns"]), out["cpl"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from pyvmm.kvm.system import kvm_flavour

    rows = []
    with tempfile.TemporaryDirectory(prefix="pyvmm-bench-") as tmp:
        image = Path(tmp) / "disk.img"
        with open(image, "wb") as f:
            f.truncate(IMAGE_BYTES)
        cpl = "?"
        for size in SIZES:
            cells = []
            for python in (False, True):
                writes, reads = [], []
                for _ in range(args.runs):
                    w, r, cpl = run_guest(image, args.requests, size, python)
                    writes.append(w)
                    reads.append(r)
                cells += [np.median(writes) / 1000, np.median(reads) / 1000]
            rows.append((size, *cells))
    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
        f"KVM {kvm_flavour()}, guest CPL {cpl}; {args.requests} requests per phase, "
        f"median of {args.runs} runs; image in {tempfile.gettempdir()}"
    )
    print(
        f"{'size':>6} {'C write us':>11} {'C read us':>10} {'Py write us':>12} "
        f"{'Py read us':>11} {'C read MB/s':>12} {'Py read MB/s':>13}"
    )
    for size, cw, cr, pw, pr in rows:
        print(
            f"{size:>6} {cw:>11.1f} {cr:>10.1f} {pw:>12.1f} {pr:>11.1f} "
            f"{size / cr:>12.1f} {size / pr:>13.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
