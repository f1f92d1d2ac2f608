#!/usr/bin/env python3
"""Run Solo5's own hvt test programs under pyvmm and judge them as Solo5's
test suite (tests/tests.bats) does.

    scripts/solo5_check.py [--bindings hvt|pyvmm] [--tender pyvmm|solo5-hvt|PATH]
                           [--only NAME[,NAME...]] [--timeout S] [--mem MiB]
                           [--archive FILE] [--cache DIR] [-v] [TENDER ARGS...]

The programs come from scripts/solo5_build.py's cache (built from the
Solo5 release archive on first use, offline): ``--bindings hvt`` (the
default) runs them as Solo5 builds them, linked with Solo5's solo5_hvt.o;
``--bindings pyvmm`` runs the same objects relinked with
``-z solo5-abi=pyvmm``, pyvmm's guest runtime as their bindings
(docs/solo5-bindings.md). Every argument this script does not know is
passed on to the tender, before its device arguments, e.g.
``scripts/solo5_check.py --cpl=3`` or ``scripts/solo5_check.py --shm=off``.
``--tender solo5-hvt`` runs the same cases under the solo5-hvt built in the
cache, for comparison. Exit status: 0 if every case that tests.bats runs on
Linux passed (or failed as expected, below), 1 if one failed, 2 for a bad
argument or no Solo5 build.

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
- noexec: the unikernel run as a host program: status 127, "No such file
  or directory" or "required file not found" (it names an interpreter that
  does not exist);
- dumpcore: ``--dumpcore=DIR`` (solo5-hvt-debug's option), status 255 and
  the core file the output names in DIR (pyvmm writes it as
  solo5-hvt-debug does: docs/debugging.md).

Under pyvmm, where the hardware allows only another outcome, a case names
the one pyvmm gives, by the privilege mode the run used (pyvmm's
``--stats-json`` says which):

- xnow (a write to the program's own text): tests.bats' "host/guest
  translation fault" is solo5-hvt's report of the write reaching a
  read-only host mapping where virtualisation is in hardware (on a PVM
  host solo5-hvt gets another exit for it). pyvmm's page tables mark text
  read-only for the guest too, so the guest itself faults first: in user
  mode pyvmm reports it (status 1, "write to read-only memory"); at CPL 0
  or deprivileged the guest's trap handler does (255 + ABORT);
- exception, zeropage, notls with ``--bindings pyvmm`` in user mode (CPL 3,
  the default on a PVM host): the guest has no IDT there (it cannot load
  one at CPL 3), so the trap ends the guest and pyvmm reports the fault
  (status 1, "guest fault: ..." naming the address). At CPL 0 the runtime's
  trap handlers give tests.bats' 255 + ABORT.

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
(``ping -fq -c N``, started 1 s after the tender) run inside it; their
summary lines are kept (``Result.pings``). Nothing is sent outside that
namespace, and it is removed after the case.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

from scripts import solo5_build  # noqa: E402

PROG = "solo5-check"
BINDINGS = ("hvt", "pyvmm")

# The host side of tests.bats' taps (tests/setup-tests.sh).
TAPS = [("tap100", "10.0.0.1/24", None), ("tap101", "10.1.0.1/24", None), ("tap102", None, 9000)]
NET0_IP, NET1_IP = "10.0.0.2", "10.1.0.2"

Check = Callable[[int, str], bool]


def expect_success(status: int, out: str) -> bool:
    return status == 0 and "SUCCESS" in out


def expect_abort(status: int, out: str) -> bool:
    return status == 255 and "ABORT" in out


def status_and(status_want: int, *texts: str) -> Check:
    return lambda status, out: status == status_want and all(t in out for t in texts)


def quiet(status: int, out: str) -> bool:
    return expect_success(status, out) and "Solo5:" not in out


def net_mtu(status: int, out: str) -> bool:
    return "MTU is 9000" in out and expect_success(status, out)


def not_executable(status: int, out: str) -> bool:
    return status == 127 and (
        "No such file or directory" in out or "required file not found" in out
    )


def time_flaky(status: int, out: str) -> str | None:
    if status == 1 and "slept too little" in out:
        return "flaky, ignored (tests.bats)"
    return None


FAULT = "host/guest translation fault"
ABORT = "255 + ABORT"
SUCCESS = "0 + SUCCESS"
OPENBSD = "OpenBSD only"

#: What pyvmm gives where tests.bats' outcome cannot happen (module
#: docstring), by privilege mode: (check, what it expects).
Alternatives = dict[str, tuple[Check, str]]


def user_mode_fault(what: str) -> Alternatives:
    """CPL 3 has no IDT of the guest's: pyvmm reports the fault itself."""
    return {"user": (status_and(1, "pyvmm: guest fault: " + what), f"1 + 'guest fault: {what}'")}


XNOW_PYVMM: Alternatives = {
    "user": (status_and(1, "write to read-only memory"), "1 + 'write to read-only memory'"),
    "kernel": (expect_abort, ABORT + " (the guest's #PF handler)"),
    "deprivileged": (expect_abort, ABORT + " (the guest's #PF handler)"),
}


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
    skip: Callable[[int, str], str | None] | None = None
    #: pyvmm's outcome where tests.bats' cannot happen, by privilege mode.
    pyvmm: Alternatives = field(default_factory=dict)
    #: With --bindings pyvmm only (Solo5's own bindings have trap handlers).
    pyvmm_bindings: Alternatives = field(default_factory=dict)
    xfail: str = ""  # why it is expected to fail for now
    direct: bool = False  # run the file itself, no tender
    dumpcore: bool = False  # --dumpcore=DIR, and the core file checked


MAXDEV = [(f"storage{n}", 4096, None) for n in range(63)]

CASES = [
    Case("noexec", "test_hello", not_executable, "127 + 'No such file'", direct=True),
    Case("hello", "test_hello", expect_success, SUCCESS, ["Hello_Solo5"]),
    Case("quiet", "test_quiet", quiet, SUCCESS + ", no 'Solo5:'", ["--solo5:quiet"]),
    Case("output", "test_output", lambda s, o: s == 0, "0", ["Output_Solo5"]),
    Case("globals", "test_globals", expect_success, SUCCESS),
    Case(
        "exception",
        "test_exception",
        expect_abort,
        ABORT,
        pyvmm_bindings=user_mode_fault("access to 0x400000000, outside guest memory"),
    ),
    Case(
        "zeropage",
        "test_zeropage",
        expect_abort,
        ABORT,
        pyvmm_bindings=user_mode_fault("access to unmapped page zero at 0x8"),
    ),
    Case("rnow", "test_rnow", status_and(1, FAULT), "1 + fault", info=OPENBSD),
    Case("xnow", "test_xnow", status_and(1, FAULT), "1 + '" + FAULT + "'", pyvmm=XNOW_PYVMM),
    Case("xnor", "test_xnor", status_and(1, FAULT), "1 + fault", info=OPENBSD),
    Case("rnox", "test_rnox", status_and(1, FAULT), "1 + fault", info=OPENBSD),
    Case("wnox", "test_wnox", status_and(1, FAULT), "1 + fault", info=OPENBSD),
    Case(
        "notls",
        "test_notls",
        expect_abort,
        ABORT,
        pyvmm_bindings=user_mode_fault("access to unmapped page zero at 0x28"),
    ),
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
    Case(
        "dumpcore",
        "test_dumpcore",
        status_and(255),
        "255 + the core file",
        dumpcore=True,
    ),
    Case("mft_maxdevices", "test_mft_maxdevices", expect_success, SUCCESS, blocks=MAXDEV),
    Case(
        "buggyelf",
        "buggyelf",
        status_and(1, "note does not fall within valid size"),
        "1 + 'note does not fall within valid size'",
    ),
]
CASE_NAMES = {c.name: c for c in CASES}
NET_CASES = tuple(c.name for c in CASES if c.nets)


@dataclass
class Tender:
    """Who runs the unikernels: pyvmm (``argv`` empty) or a tender binary."""

    name: str
    argv: list[str]
    debug_argv: list[str]  # for dumpcore (solo5-hvt-debug)

    @property
    def is_pyvmm(self) -> bool:
        return not self.argv


@dataclass
class Result:
    case: Case
    verdict: str  # PASS, FAIL, SKIP, MISSING, XFAIL, XPASS
    status: int | None
    seconds: float
    output: str
    expected: str = ""  # what was checked: tests.bats' or pyvmm's outcome
    stats: dict | None = None  # pyvmm's --stats-json snapshot at exit
    pings: list[str] = field(default_factory=list)  # each ping's summary lines

    @property
    def privilege(self) -> str:
        return (self.stats or {}).get("privilege", "")


def tender_argv(
    tender: Tender, mem: int, extra: list[str], case: Case, kernel: Path, devs: list[str]
) -> list[str]:
    if case.direct:  # as bats' run does it: through bash, which reports the failure
        return ["bash", "-c", '"$0" "$@"', str(kernel), *case.args]
    if tender.is_pyvmm:
        head = [sys.executable, "-m", "pyvmm"]
    else:
        head = tender.debug_argv if case.dumpcore else tender.argv
    return [*head, f"--mem={mem}", *devs, *extra, "--", str(kernel), *case.args]


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


def ping_summary(text: str) -> str:
    """ping -q's two summary lines (packets, then round-trip times)."""
    keep = [line for line in text.splitlines() if "packets transmitted" in line or "rtt" in line]
    return " / ".join(keep) if keep else text.strip()[-200:]


def core_written(out: str, where: Path) -> bool:
    """tests.bats: the core file's name ends the output, and it exists."""
    found = re.findall(r"core\.\S+?\.\d+", out)
    return bool(found) and (where / found[-1]).is_file()


def judge(case: Case, bindings: str, status: int, out: str, privilege: str) -> tuple[bool, str]:
    """(passed, what was expected): tests.bats' criterion, or pyvmm's
    outcome where the run's privilege mode cannot give that one."""
    alternatives = dict(case.pyvmm)
    if bindings == "pyvmm":
        alternatives.update(case.pyvmm_bindings)
    if privilege in alternatives:
        check, expected = alternatives[privilege]
        return check(status, out), f"{expected} (pyvmm, {privilege} mode)"
    return case.check(status, out), case.expected


def run_case(
    case: Case,
    kernel: Path,
    tender: Tender,
    bindings: str,
    mem: int,
    extra: list[str],
    timeout: float,
) -> Result:
    if not kernel.exists():
        return Result(case, "MISSING", None, 0.0, f"{kernel} not found")
    with tempfile.TemporaryDirectory(prefix="solo5-check-") as tmpdir:
        tmp = Path(tmpdir)
        devs = block_args(case, tmp)
        devs += [f"--net:{dev}={tap}" for dev, tap in case.nets]
        run_extra = list(extra)
        stats_file = tmp / "stats.json"
        if tender.is_pyvmm and not case.direct:
            run_extra.append(f"--stats-json={stats_file}")
        if case.dumpcore:
            run_extra.append(f"--dumpcore={tmp}")
        argv = tender_argv(tender, mem, run_extra, case, kernel, devs)
        popen_kw = {
            "stdout": subprocess.PIPE,
            "stderr": subprocess.STDOUT,
            "stdin": subprocess.DEVNULL,
            "cwd": str(ROOT),
            "start_new_session": True,
        }
        start = time.monotonic()
        pings: list[str] = []
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
                pingers = []
                if case.pings:
                    time.sleep(1.0)  # as tests.bats: "sleep 1; ping ..."
                    for ping in case.pings:
                        deadline = ["-w", str(int(timeout))]
                        pingers.append(
                            ns.popen(
                                ["ping", *deadline, *ping],
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT,
                                text=True,
                            )
                        )
                status, out = wait(proc, max(1.0, timeout - (time.monotonic() - start)))
                for pinger in pingers:
                    try:
                        text, _ = pinger.communicate(timeout=5)
                    except subprocess.TimeoutExpired:
                        pinger.kill()
                        text, _ = pinger.communicate()
                    pings.append(ping_summary(text or ""))
                # the namespace ends with the ``with``
        seconds = time.monotonic() - start
        stats = None
        try:
            lines = stats_file.read_text().splitlines()
            stats = json.loads(lines[-1]) if lines else None
        except (OSError, ValueError):
            pass
        core_ok = not case.dumpcore or core_written(out, tmp)
    privilege = (stats or {}).get("privilege", "")
    result = Result(case, "", status, seconds, out, stats=stats, pings=pings)
    reason = case.skip(status, out) if case.skip else None
    if reason:
        result.verdict, result.output = "SKIP", out + f"\n[{reason}]"
        return result
    passed, result.expected = judge(case, bindings, status, out, privilege)
    passed = passed and core_ok
    if case.xfail:
        result.verdict = "XPASS" if passed else "XFAIL"
        result.expected += f" (expected to fail: {case.xfail})"
    else:
        result.verdict = "PASS" if passed else "FAIL"
    return result


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def print_table(results: list[Result], tender_name: str) -> None:
    rows = [("test", "expected", f"{tender_name}", "time", "last output line")]
    for r in results:
        status = "-" if r.status is None else str(r.status)
        verdict = r.verdict + (" (info: " + r.case.info + ")" if r.case.info else "")
        rows.append(
            (
                r.case.name,
                r.expected or r.case.expected,
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


def programs(build: solo5_build.Solo5Build, bindings: str) -> Path:
    """The directory of the test programs linked with ``bindings``."""
    if bindings == "pyvmm":
        assert build.pyvmm_tests is not None
        return build.pyvmm_tests
    return build.hvt_tests


def make_tender(choice: str, build: solo5_build.Solo5Build) -> Tender:
    if choice == "pyvmm":
        return Tender("pyvmm", [], [])
    if choice == "solo5-hvt":
        return Tender("solo5-hvt", [str(build.solo5_hvt)], [str(build.solo5_hvt_debug)])
    return Tender(Path(choice).name, [choice], [choice])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run Solo5's hvt test programs under pyvmm with tests.bats' criteria.",
        epilog="Unknown arguments are passed on to the tender (e.g. --cpl=3, --shm=off).",
    )
    parser.add_argument(
        "--bindings",
        choices=BINDINGS,
        default="hvt",
        help="the programs as Solo5 links them (hvt, default) or relinked with "
        "-z solo5-abi=pyvmm (pyvmm)",
    )
    parser.add_argument(
        "--tender",
        default="pyvmm",
        help="pyvmm (default), solo5-hvt (the one built in the cache) or a tender's path",
    )
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per run (60)")
    parser.add_argument("--mem", type=int, default=4096, help="MiB, as tests.bats (4096)")
    parser.add_argument("--archive", help="Solo5's release archive (scripts/solo5_build.py)")
    parser.add_argument("--cache", help="where Solo5 is built (scripts/solo5_build.py)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show each run's output")
    args, extra = parser.parse_known_args(argv)
    if extra[:1] == ["--"]:
        extra = extra[1:]

    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = wanted - set(CASE_NAMES)
    if unknown:
        print(f"{PROG}: unknown case(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    cases = [c for c in CASES if not wanted or c.name in wanted]
    if any(c.nets for c in cases) and (os.geteuid() != 0 or not shutil.which("ping")):
        print(f"{PROG}: the net cases need root and ping", file=sys.stderr)
        return 2
    if args.tender not in ("pyvmm", "solo5-hvt") and not os.access(args.tender, os.X_OK):
        print(f"{PROG}: tender {args.tender} is not an executable", file=sys.stderr)
        return 2
    try:
        build = solo5_build.ensure(args.archive, args.cache, bindings=args.bindings == "pyvmm")
    except solo5_build.BuildError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    tender = make_tender(args.tender, build)
    folder = programs(build, args.bindings)
    tender_name = f"{tender.name} ({args.bindings})"
    if extra:
        tender_name += " " + " ".join(extra)

    results = []
    for case in cases:
        kernel = folder / f"{case.kernel}.hvt"
        print(f"{PROG}: {case.name} ...", end="", flush=True, file=sys.stderr)
        result = run_case(case, kernel, tender, args.bindings, args.mem, extra, args.timeout)
        print(f" {result.verdict} ({result.seconds:.1f}s)", file=sys.stderr)
        if args.verbose:
            tail = result.output.splitlines()[-15:] + [f"ping: {p}" for p in result.pings]
            print("\n".join("    | " + line for line in tail), file=sys.stderr)
        results.append(result)

    print_table(results, tender_name)
    counted = [r for r in results if not r.case.info]
    failed = [r for r in counted if r.verdict in ("FAIL", "MISSING", "XPASS")]
    passed = sum(r.verdict == "PASS" for r in counted)
    xfailed = sum(r.verdict == "XFAIL" for r in counted)
    skipped = sum(r.verdict == "SKIP" for r in counted)
    print(
        f"{tender_name}: {passed} passed, {len(failed)} failed, {xfailed} expected failures, "
        f"{skipped} skipped of {len(counted)} cases (+{len(results) - len(counted)} info)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
