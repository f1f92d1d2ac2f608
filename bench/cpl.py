"""Guest privilege level 0 against 3, side by side in one run.

    python3 bench/cpl.py [--compute-kib 1024] [--hypercalls 1000] [--traps 2000]

For each level: the compute guest's time for a checksum over a buffer
(instruction-heavy, no exits), and hcbench's average cost of a hypercall
that exits to pyvmm's user space and back, answered in C by the fast path
(csrc/hcfast.c) and answered by Python (PYVMM_PY_HYPERCALLS=1), and of a
port write absorbed in the kernel by a KVM ioeventfd (what a shmstream kick
costs). Each guest measures itself with its TSC clock; every figure is the
median of --runs.

A second table compares an unmodified kernel-mode guest (solo5seq: Solo5's
privileged start-up sequence, no pyvmm note) at --cpl=0 and deprivileged
(docs/pvm.md): its compute time, the cost of one trapped and emulated
instruction (cli/sti), and its boot-to-exit wall time.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GUESTS = ROOT / "guests" / "bin"


def run_guest(cpl: int | str, name: str, *args: str, python: bool = False) -> dict[str, str]:
    argv = [sys.executable, "-m", "pyvmm", f"--cpl={cpl}", str(GUESTS / f"{name}.hvt"), *args]
    env = dict(os.environ, PYVMM_PY_HYPERCALLS="1") if python else None
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{name} at CPL {cpl} failed: {result.stdout}{result.stderr}")
    return dict(re.findall(r"^(\w+): (\S+)$", result.stdout, re.M))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute-kib", type=int, default=1024)
    parser.add_argument("--hypercalls", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--traps", type=int, default=2000, help="cli/sti pairs per run")
    args = parser.parse_args()

    from pyvmm.kvm.system import kvm_flavour

    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
        f"KVM {kvm_flavour()}; median of {args.runs} runs"
    )
    rows = {}
    for cpl in (0, 3):
        compute, hyper, hyper_py, kick, checksums = [], [], [], [], set()
        for _ in range(args.runs):
            out = run_guest(cpl, "compute", str(args.compute_kib), "1")
            compute.append(int(out["elapsed_us"]))
            checksums.add(out["checksum"])
            out = run_guest(cpl, "hcbench", str(args.hypercalls))
            hyper.append(int(out["hypercall_ns"]))
            kick.append(int(out["kick_ns"]))
            out = run_guest(cpl, "hcbench", str(args.hypercalls), python=True)
            hyper_py.append(int(out["hypercall_ns"]))
        if len(checksums) != 1:
            raise SystemExit(f"compute checksums differ at CPL {cpl}: {checksums}")
        rows[cpl] = (
            np.median(compute),
            np.median(hyper),
            np.median(hyper_py),
            np.median(kick),
            checksums.pop(),
        )

    print(
        f"{'CPL':>3} {'compute ' + str(args.compute_kib) + ' KiB (us)':>24} {'MB/s':>9} "
        f"{'hypercall C (us)':>17} {'hypercall Python (us)':>22} {'ioeventfd kick (us)':>20}"
    )
    for cpl, (compute_us, hyper_ns, hyper_py_ns, kick_ns, _) in rows.items():
        mbps = args.compute_kib * 1024 / max(compute_us, 1)
        print(
            f"{cpl:>3} {compute_us:>24.0f} {mbps:>9.1f} {hyper_ns / 1000:>17.2f} "
            f"{hyper_py_ns / 1000:>22.2f} {kick_ns / 1000:>20.2f}"
        )
    if rows[0][4] != rows[3][4]:
        raise SystemExit("compute checksums differ between CPL 0 and CPL 3")
    ratio = rows[0][0] / max(rows[3][0], 1)
    print(f"compute at CPL 3 is {ratio:.0f}x faster than at CPL 0 (same checksum {rows[3][4]})")
    deprivileged(args)
    return 0


def deprivileged(args) -> None:
    """solo5seq (an unmodified kernel-mode guest) at --cpl=0 and deprivileged."""
    kib = str(min(args.compute_kib, 65536))
    rows = {}
    for mode in ("0", "deprivileged"):
        compute, trap, boot, checksums = [], [], [], set()
        for _ in range(args.runs):
            out = run_guest(mode, "solo5seq", kib)
            compute.append(int(out["elapsed_us"]))
            checksums.add(out["checksum"])
            trap.append(int(run_guest(mode, "solo5seq", "traps", str(args.traps))["trap_ns"]))
            start = time.perf_counter()
            run_guest(mode, "solo5seq", "1")
            boot.append((time.perf_counter() - start) * 1000)
        if len(checksums) != 1:
            raise SystemExit(f"solo5seq checksums differ at --cpl={mode}: {checksums}")
        rows[mode] = (np.median(compute), np.median(trap), np.median(boot), checksums.pop())
    print()
    print(
        f"{'solo5seq --cpl=':>16} {'compute ' + kib + ' KiB (us)':>24} "
        f"{'trap (us)':>10} {'boot-to-exit (ms)':>18}"
    )
    for mode, (compute_us, trap_ns, boot_ms, _) in rows.items():
        print(f"{mode:>16} {compute_us:>24.0f} {trap_ns / 1000:>10.2f} {boot_ms:>18.1f}")
    if rows["0"][3] != rows["deprivileged"][3]:
        raise SystemExit("solo5seq checksums differ between CPL 0 and deprivileged")
    ratio = rows["0"][0] / max(rows["deprivileged"][0], 1)
    print(f"deprivileged computes {ratio:.0f}x faster than CPL 0 (same checksum)")


if __name__ == "__main__":
    sys.exit(main())
