"""A scripted gdb session's wall time: pyvmm's stub beside solo5-hvt-debug's.

    python3 bench/gdb_session.py [--runs 5]

The session tests/test_gdb.py runs on Solo5's test_hello (its stock hvt
build from scripts/solo5_build.py's cache): gdb in batch mode connects,
breaks at solo5_app_main, continues, prints the backtrace and the
registers and continues to the end. Timed from the tender's start to its
exit, median of --runs, for solo5-hvt-debug (level 0: under kvm_pvm, KVM's
emulator) and pyvmm at --cpl=0 and deprivileged; beside it the same run
without a debugger (solo5-hvt-debug's: solo5-hvt-debug without --gdb), which
is the tender's own start and exit. solo5-hvt-debug listens
on every address, so the whole bench runs in a network namespace of its
own (``unshare -n``, only its loopback up), which ends with it.

A second table runs the same session on pyvmm's compute guest
(guests/bin/compute.hvt, a checksum over --compute-kib KiB, which
solo5-hvt-debug runs too): there the guest's own instructions count, which
kvm_pvm emulates at level 0 and runs natively deprivileged.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PORT = 1234
SESSION = ("break solo5_app_main", "continue", "bt", "info registers", "continue")
_INNER = "PYVMM_BENCH_GDB_NETNS"


def listening(port: int) -> bool:
    """Whether a socket listens on ``port`` here (/proc/net/tcp, state 0A):
    asked without connecting, since a tender takes one connection only."""
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def session(tender: list[str], kernel: Path, args: list[str], expect: str) -> float:
    started = time.monotonic()
    proc = subprocess.Popen(
        [*tender, str(kernel), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    while not listening(PORT):
        if proc.poll() is not None:
            raise SystemExit(f"{tender[0]} ended before listening: {proc.stdout.read()}")
        time.sleep(0.002)
    argv = ["gdb", "-nx", "-batch", "-ex", f"target remote localhost:{PORT}"]
    for command in SESSION:
        argv += ["-ex", command]
    gdb = subprocess.run([*argv, str(kernel)], capture_output=True, text=True, timeout=600)
    out, _ = proc.communicate(timeout=600)
    elapsed = time.monotonic() - started
    if "Breakpoint 1, solo5_app_main" not in gdb.stdout or expect not in out:
        raise SystemExit(f"{tender[0]}: the session failed:\n{gdb.stdout}{gdb.stderr}{out}")
    return elapsed


def plain(tender: list[str], kernel: Path, args: list[str]) -> float:
    """The same run without a debugger (the tender's own start and exit)."""
    started = time.monotonic()
    subprocess.run([*tender, str(kernel), *args], capture_output=True, timeout=600)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compute-kib", type=int, default=1024)
    args = parser.parse_args()
    if os.environ.get(_INNER) != "1":  # into a network namespace of its own
        env = dict(os.environ, **{_INNER: "1"})
        script = f"ip link set lo up && exec {sys.executable} {' '.join(sys.argv)}"
        return subprocess.run(["unshare", "-n", "sh", "-c", script], env=env).returncode

    from pyvmm.kvm.system import kvm_flavour
    from scripts import solo5_build

    build = solo5_build.ensure(log=lambda message: None)
    pyvmm = [sys.executable, "-m", "pyvmm", "--mem=64"]
    gdb_port = ["--gdb", f"--gdb-port={PORT}"]
    tenders = {  # name: (the tender, its debugging options)
        "solo5-hvt-debug (level 0)": ([str(build.solo5_hvt_debug), "--mem=64"], gdb_port),
        "pyvmm --cpl=0": ([*pyvmm, "--cpl=0"], gdb_port[1:]),
        "pyvmm --cpl=deprivileged": ([*pyvmm, "--cpl=deprivileged"], gdb_port[1:]),
    }
    kernels = [  # the kernel, its arguments, what its output must hold
        (build.hvt_tests / "test_hello.hvt", ["Hello_Solo5"], "Hello, World"),
        (ROOT / "guests/bin/compute.hvt", [str(args.compute_kib)], "SUCCESS"),
    ]
    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
        f"KVM {kvm_flavour()}; median of {args.runs} runs"
    )
    for kernel, kernel_args, expect in kernels:
        print(f"\n{kernel.name} {' '.join(kernel_args)}")
        print(f"{'tender':28} {'gdb session':>12} {'run without gdb':>16}")
        for name, (tender, debug) in tenders.items():
            times = [
                session([*tender, *debug], kernel, kernel_args, expect) for _ in range(args.runs)
            ]
            alone = [plain(tender, kernel, kernel_args) for _ in range(args.runs)]
            median, without = statistics.median(times) * 1000, statistics.median(alone) * 1000
            print(f"{name:28} {median:9.0f} ms {without:13.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
