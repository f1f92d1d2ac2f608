#!/usr/bin/env python3
"""Run upstream Solo5's own hvt test unikernels under pyvmm and judge them as
Solo5's test suite (tests/tests.bats) does.

    scripts/solo5_check.py [--solo5-dir DIR] [--tender pyvmm|solo5-hvt|PATH]
                           [--only NAME[,NAME...]] [--timeout S] [--mem MiB]
                           [-v] [TENDER ARGS...]

Every argument this script does not know is passed on to the tender, before
its device arguments, e.g. ``scripts/solo5_check.py --cpl=3`` or
``scripts/solo5_check.py --shm=off``. ``--tender solo5-hvt`` runs the same
cases under DIR/bin/solo5-hvt, for comparison. Exit status: 0 if every case
that tests.bats runs on Linux passed, 1 if one failed, 2 if DIR is missing.

Each case is one ``@test "... hvt"`` of tests.bats, with its tender
arguments (``--mem=4096`` as ``hvt_run`` gives, the devices) and its pass
criterion (status and output, stdout and stderr together as bats' ``run``
sees them):

- expect_success: status 0 and ``SUCCESS`` in the output;
- expect_abort: status 255 and ``ABORT`` in the output;
- the tender refusing an image or a device: status 1 and tests.bats' message;
- quiet: also no ``Solo5:`` in the output; net_mtu: also ``MTU is 9000``;
- time: status 1 with "slept too little" is skipped as flaky (tests.bats
  does so on Debian hosts);
- dumpcore: status 255 (tests.bats also looks for the core file that
  ``solo5-hvt-debug --dumpcore`` writes; pyvmm has no such option).

Cases that tests.bats runs only on OpenBSD (rnow, xnor, rnox, wnox) are run
and shown, marked "info", and do not count. Each run gets ``--timeout``
seconds (60, as tests.bats); a run still going then is stopped and shown
as status 124, as timeout(1) reports it.

Devices are made fresh for each case: block images in a temporary
directory (4 MiB of zeros as ``setup_block``; the misaligned, odd and too
small ones and the 63 images of mft_maxdevices as tests.bats makes them),
and for the net cases a throw-away network namespace
(testkit.netns.NetNamespace) holding tap100 (10.0.0.1/24), tap101
(10.1.0.1/24) and tap102 (MTU 9000), with tests.bats' flood pings
(``ping -fq -c N``, started 1 s after the tender) run inside it. Nothing is
sent outside that namespace, and it is removed after the case.

How DIR (/var/cache/pyvmm-solo5) was built, from Solo5 v0.12.1 (the newest
release tag; no Solo5 code or binary is kept in this repository), as root
on Debian 12, with the Solo5 repository's git directory at $GITDIR:

    apt-get install -y pkg-config libseccomp-dev
    D=/var/cache/pyvmm-solo5
    mkdir -p $D/src $D/bin $D/tests
    git --git-dir=$GITDIR archive v0.12.1 | tar -x -C $D/src
    cd $D/src
    # a git archive is no git tree and has no release version.h.distrib:
    printf '#ifndef __VERSION_H__\\n#define __VERSION_H__\\n'\\
    '#define SOLO5_VERSION "v0.12.1"\\n#endif\\n' > include/version.h.distrib
    ./configure.sh && make -j2
    cp tenders/hvt/solo5-hvt tenders/hvt/solo5-hvt-debug \\
       elftool/solo5-elftool $D/bin/
    cp tests/test_*/*.hvt tests/tests.bats $D/tests/

DIR/BUILD.md has the same commands, plus those of DIR/adapter/build.sh,
which builds pyvmm's guests/udpsink.c and guests/hello.c against Solo5's
headers and bindings (with a small rt.h adapter kept in DIR/adapter) into
DIR/bin/udpsink-solo5.hvt and DIR/bin/hello-solo5.hvt; this script does
not run those.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # testkit/ (the test and demo kit, not shipped)

DEFAULT_DIR = "/var/cache/pyvmm-solo5"
PROG = "solo5-check"

# The host side of tests.bats' taps (tests/setup-tests.sh).
TAPS = [("tap100", "10.0.0.1/24", None), ("tap101", "10.1.0.1/24", None), ("tap102", None, 9000)]
NET0_IP, NET1_IP = "10.0.0.2", "10.1.0.2"

Check = Callable[[int, str], bool]


def expect_success(status: int, out: str) -> bool:
    return status == 0 and "SUCCESS" in out


def expect_abort(status: int, out: str) -> bool:
    return status == 255 and "ABORT" in out


def status_and(status_want: int, text: str) -> Check:
    return lambda status, out: status == status_want and text in out


def quiet(status: int, out: str) -> bool:
    return expect_success(status, out) and "Solo5:" not in out


def net_mtu(status: int, out: str) -> bool:
    return "MTU is 9000" in out and expect_success(status, out)


def time_flaky(status: int, out: str) -> str | None:
    if status == 1 and "slept too little" in out:
        return "flaky, ignored (tests.bats)"
    return None


FAULT = "host/guest translation fault"


@dataclass
class Case:
    name: str
    kernel: str
    check: Check
    expected: str
    args: list[str] = field(default_factory=list)  # the guest's command line
    # block devices: (name, image size in bytes, sector size or None)
    blocks: list[tuple[str, int, int | None]] = field(default_factory=list)
    nets: list[tuple[str, str]] = field(default_factory=list)  # (device, tap)
    pings: list[list[str]] = field(default_factory=list)  # ping arguments
    info: str = ""  # why the case does not count
    kernel_path: str = ""  # set from --solo5-dir
    skip: Callable[[int, str], str | None] | None = None


SUCCESS = "0 + SUCCESS"
ABORT = "255 + ABORT"
MAXDEV = [(f"storage{n}", 4096, None) for n in range(63)]
OPENBSD = "OpenBSD only"

CASES = [
    Case("hello", "test_hello", expect_success, SUCCESS, ["Hello_Solo5"]),
    Case("quiet", "test_quiet", quiet, SUCCESS + ", no 'Solo5:'", ["--solo5:quiet"]),
    Case("output", "test_output", lambda s, o: s == 0, "0", ["Output_Solo5"]),
    Case("globals", "test_globals", expect_success, SUCCESS),
    Case("exception", "test_exception", expect_abort, ABORT),
    Case("zeropage", "test_zeropage", expect_abort, ABORT),
    Case("rnow", "test_rnow", status_and(1, FAULT), "1 + fault", info=OPENBSD),
    Case("xnow", "test_xnow", status_and(1, FAULT), "1 + '" + FAULT + "'"),
    Case("xnor", "test_xnor", status_and(1, FAULT), "1 + fault", info=OPENBSD),
    Case("rnox", "test_rnox", status_and(1, FAULT), "1 + fault", info=OPENBSD),
    Case("wnox", "test_wnox", status_and(1, FAULT), "1 + fault", info=OPENBSD),
    Case("notls", "test_notls", expect_abort, ABORT),
    Case("tls", "test_tls", expect_success, SUCCESS),
    Case("ssp", "test_ssp", expect_abort, ABORT),
    Case("fpu", "test_fpu", expect_success, SUCCESS),
    Case("time", "test_time", expect_success, SUCCESS, skip=time_flaky),
    Case("blk", "test_blk", expect_success, SUCCESS, blocks=[("storage", 4 << 20, None)]),
    Case(
        "blk 4096",
        "test_blk",
        expect_success,
        SUCCESS,
        blocks=[("storage", 4 << 20, 4096)],
    ),
    Case(
        "blk misaligned",
        "test_blk",
        status_and(1, "Backing storage size must be block aligned"),
        "1 + 'must be block aligned'",
        blocks=[("storage", 3 * 2048, 4096)],
    ),
    Case(
        "blk odd",
        "test_blk",
        status_and(1, "Block size must be a multiple of 2"),
        "1 + 'multiple of 2'",
        blocks=[("storage", 3 * 521, 521)],
    ),
    Case(
        "blk too small",
        "test_blk",
        status_and(1, "Block size must be a multiple of 2 greater than or equal 512"),
        "1 + '... >= 512'",
        blocks=[("storage", 256, 256)],
    ),
    Case(
        "net",
        "test_net",
        expect_success,
        SUCCESS,
        ["limit"],
        nets=[("service0", "tap100")],
        pings=[["-fq", "-c", "100000", NET0_IP]],
    ),
    Case(
        "net_2if",
        "test_net_2if",
        expect_success,
        SUCCESS,
        ["limit"],
        nets=[("service0", "tap100"), ("service1", "tap101")],
        pings=[["-fq", "-c", "50000", NET0_IP], ["-fq", "-c", "50000", NET1_IP]],
    ),
    Case(
        "net_mtu",
        "test_net_mtu",
        net_mtu,
        SUCCESS + ", 'MTU is 9000'",
        nets=[("service0", "tap102")],
    ),
    Case(
        "net_ring",
        "test_net_ring",
        expect_success,
        SUCCESS,
        nets=[("service0", "tap100")],
        pings=[["-fq", "-c", "10000", "-p", "deadbeef", NET0_IP]],
    ),
    Case("dumpcore", "test_dumpcore", lambda s, o: s == 255, "255 (no core check)"),
    Case("mft_maxdevices", "test_mft_maxdevices", expect_success, SUCCESS, blocks=MAXDEV),
    Case(
        "buggyelf",
        "buggyelf",
        status_and(1, "note does not fall within valid size"),
        "1 + 'note does not fall within valid size'",
    ),
]


@dataclass
class Result:
    case: Case
    verdict: str  # PASS, FAIL, SKIP, MISSING
    status: int | None
    seconds: float
    output: str


def tender_argv(tender: str, mem: int, extra: list[str], case: Case, devs: list[str]) -> list[str]:
    head = [sys.executable, "-m", "pyvmm"] if tender == "pyvmm" else [tender]
    return [*head, f"--mem={mem}", *devs, *extra, "--", case.kernel_path, *case.args]


def block_args(case: Case, tmp: Path) -> list[str]:
    args = []
    for name, size, sector in case.blocks:
        image = tmp / f"{name}.img"
        with open(image, "wb") as f:
            f.truncate(size)
        args.append(f"--block:{name}={image}")
        if sector is not None:
            args.append(f"--block-sector-size:{name}={sector}")
    return args


def wait(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, str]:
    """The exit status and output; on timeout the process (group) is killed
    and the status is 124, as timeout(1) reports it."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=2)
                break
            except subprocess.TimeoutExpired:
                continue
        out, _ = proc.communicate()
        status = 124
    text = out.decode(errors="replace")
    if status < 0:  # killed by a signal: as a shell reports it
        status = 128 - status
    return status, text


def run_case(case: Case, tender: str, mem: int, extra: list[str], timeout: float) -> Result:
    if not Path(case.kernel_path).exists():
        return Result(case, "MISSING", None, 0.0, f"{case.kernel_path} not found")
    with tempfile.TemporaryDirectory(prefix="solo5-check-") as tmpdir:
        devs = block_args(case, Path(tmpdir))
        devs += [f"--net:{dev}={tap}" for dev, tap in case.nets]
        argv = tender_argv(tender, mem, extra, case, devs)
        popen_kw = {
            "stdout": subprocess.PIPE,
            "stderr": subprocess.STDOUT,
            "stdin": subprocess.DEVNULL,
            "cwd": str(ROOT),
            "start_new_session": True,
        }
        start = time.monotonic()
        if not case.nets:
            proc = subprocess.Popen(argv, **popen_kw)
            status, out = wait(proc, timeout)
        else:
            from testkit.netns import NetNamespace

            with NetNamespace(prefix="pyvmm-s5check-") as ns:
                for tap, address, mtu in TAPS:
                    ns.add_tap(tap, address=address, mtu=mtu)
                start = time.monotonic()
                proc = ns.popen(argv, **popen_kw)
                pings = []
                if case.pings:
                    time.sleep(1.0)  # as tests.bats: "sleep 1; ping ..."
                    for ping in case.pings:
                        deadline = ["-w", str(int(timeout))]
                        pings.append(
                            ns.popen(
                                ["ping", *deadline, *ping],
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            )
                        )
                status, out = wait(proc, max(1.0, timeout - (time.monotonic() - start)))
                # the pings and the namespace end with the ``with``
        seconds = time.monotonic() - start
    reason = case.skip(status, out) if case.skip else None
    if reason:
        return Result(case, "SKIP", status, seconds, out + f"\n[{reason}]")
    verdict = "PASS" if case.check(status, out) else "FAIL"
    return Result(case, verdict, status, seconds, out)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def print_table(results: list[Result], tender_name: str) -> None:
    rows = [("test", "expected (tests.bats)", f"{tender_name}", "time", "last output line")]
    for r in results:
        status = "-" if r.status is None else str(r.status)
        verdict = r.verdict + (" (info: " + r.case.info + ")" if r.case.info else "")
        rows.append(
            (
                r.case.name,
                r.case.expected,
                f"{verdict}, status {status}",
                f"{r.seconds:.1f}s",
                last_line(r.output)[:70],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for i, row in enumerate(rows):
        cells = [row[j].ljust(widths[j]) for j in range(4)]
        print(" | ".join([*cells, row[4]]).rstrip())
        if i == 0:
            print("-+-".join("-" * w for w in widths) + "-+-" + "-" * 16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run Solo5's hvt test unikernels under pyvmm with tests.bats' criteria.",
        epilog="Unknown arguments are passed on to the tender (e.g. --cpl=3, --shm=off).",
    )
    parser.add_argument("--solo5-dir", default=DEFAULT_DIR, help=f"default {DEFAULT_DIR}")
    parser.add_argument(
        "--tender",
        default="pyvmm",
        help="pyvmm (default), solo5-hvt (DIR/bin/solo5-hvt) or a tender's path",
    )
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per run (60)")
    parser.add_argument("--mem", type=int, default=4096, help="MiB, as tests.bats (4096)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show each run's output")
    args, extra = parser.parse_known_args(argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]

    solo5 = Path(args.solo5_dir)
    tests = solo5 / "tests"
    if not solo5.is_dir() or not any(tests.glob("*.hvt")):
        print(
            f"{PROG}: no Solo5 build at {solo5} (no {tests}/*.hvt); "
            f"build it as the docstring of {Path(__file__).name} says",
            file=sys.stderr,
        )
        return 2

    tender = args.tender
    if tender == "solo5-hvt":
        tender = str(solo5 / "bin" / "solo5-hvt")
    if tender != "pyvmm" and not os.access(tender, os.X_OK):
        print(f"{PROG}: tender {tender} is not an executable", file=sys.stderr)
        return 2
    tender_name = "pyvmm" if tender == "pyvmm" else Path(tender).name
    if extra:
        tender_name += " " + " ".join(extra)

    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = wanted - {c.name for c in CASES}
    if unknown:
        print(f"{PROG}: unknown case(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    cases = [c for c in CASES if not wanted or c.name in wanted]
    if any(c.nets for c in cases) and (os.geteuid() != 0 or not shutil.which("ping")):
        print(f"{PROG}: the net cases need root and ping", file=sys.stderr)
        return 2

    results = []
    for case in cases:
        case.kernel_path = str(tests / f"{case.kernel}.hvt")
        print(f"{PROG}: {case.name} ...", end="", flush=True, file=sys.stderr)
        result = run_case(case, tender, args.mem, extra, args.timeout)
        print(f" {result.verdict} ({result.seconds:.1f}s)", file=sys.stderr)
        if args.verbose:
            tail = result.output.splitlines()[-15:]
            print("\n".join("    | " + line for line in tail), file=sys.stderr)
        results.append(result)

    print_table(results, tender_name)
    counted = [r for r in results if not r.case.info]
    failed = [r for r in counted if r.verdict in ("FAIL", "MISSING")]
    passed = sum(r.verdict == "PASS" for r in counted)
    skipped = sum(r.verdict == "SKIP" for r in counted)
    print(
        f"{tender_name}: {passed} passed, {len(failed)} failed, {skipped} skipped "
        f"of {len(counted)} cases (+{len(results) - len(counted)} info)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
