#!/usr/bin/env python3
"""Run Solo5's own test suite, tests/tests.bats, unmodified, with pyvmm as
both solo5-hvt and solo5-hvt-debug (or with the real ones, to compare).

    scripts/solo5_bats.py [--tender pyvmm|real] [--filter REGEX]
                          [--archive FILE] [--cache DIR] [--keep]

Solo5 comes from scripts/solo5_build.py's cache (built from the release
archive on first use, offline). tests.bats finds everything relative to
its own directory: ``../Makeconf.sh`` (configure's answers, CONFIG_HVT_TENDER
and CONFIG_HOST among them), ``../tenders/hvt/solo5-hvt`` and
``../tenders/hvt/solo5-hvt-debug``, and the test programs beside it. So a
copy of the built tree's ``tests/`` and ``Makeconf.sh`` is made in a
temporary directory, with the two tenders as symlinks: to pyvmm's native
launcher (pyvmm/_launcher in this checkout), which takes the name it was
invoked by (docs/debugging.md), or with ``--tender real`` to the solo5-hvt
and solo5-hvt-debug built from the same archive. Nothing of Solo5's is
changed or kept: the copy goes when the run ends (``--keep`` leaves it).

bats (Debian's package; installed with apt-get when missing) runs
``bats --tap --filter ' hvt$' tests.bats`` there, the hvt cases only, inside
a network namespace this script makes with what Solo5's
tests/setup-tests.sh creates on a host: tap100 (10.0.0.1/24), tap101
(10.1.0.1/24) and tap102 (up, MTU 9000). tests.bats' flood pings run
inside it with the tenders; nothing is sent outside it, and it is removed
afterwards, also on failure, Ctrl-C or SIGTERM/SIGHUP (status 128 + N).
``BATS_TMPDIR`` (the block images, test_dumpcore's core) is inside the
temporary directory.

The TAP output is printed as it comes, then one summary line::

    solo5-bats: pyvmm: 28 hvt cases: 23 passed, 1 failed (xnow hvt), 4 skipped

Exit status: 0 if no case failed, 1 if one did (or bats could not run),
2 for a bad argument, a missing archive or a missing tool.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # testkit/ (the test and demo kit, not shipped)

from scripts import solo5_build  # noqa: E402

PROG = "solo5-bats"
LAUNCHER = ROOT / "pyvmm" / "_launcher"
TENDER_NAMES = ("solo5-hvt", "solo5-hvt-debug")
#: The host side of tests.bats' taps, as Solo5's tests/setup-tests.sh makes them.
TAPS = [("tap100", "10.0.0.1/24", None), ("tap101", "10.1.0.1/24", None), ("tap102", None, 9000)]
HVT_FILTER = " hvt$"
#: A hang guard for the whole suite: each case has tests.bats' own 60 s.
SUITE_TIMEOUT = 3600.0
TAP_LINE = re.compile(r"^(ok|not ok) (\d+) (.*?)(?: # skip(?: (.*))?)?$")


class Stopped(BaseException):
    """A stop signal (SIGTERM, SIGHUP) raised where the script is, so the
    namespace and the temporary tree are removed on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_MAIN_PID = os.getpid()


def _on_stop(signum: int, frame: object) -> None:
    if os.getpid() != _MAIN_PID:
        # A forked child that inherited the handler (pyroute2 forks one per
        # namespace operation and ends it with SIGTERM): it must die as
        # without one, never run the script's clean-up as if it were it.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Stopped(signum)


def _kill_session(proc: subprocess.Popen[str]) -> None:
    """The hang guard: bats and everything it started (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class BatsError(Exception):
    """A one-line reason; the exit status is ``status``."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


@dataclass
class Summary:
    """What bats said, case by case (TAP), and the plan it announced."""

    planned: int = -1
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    #: name -> the reason bats gave ("" for none)
    skipped: dict[str, str] = field(default_factory=dict)
    #: name -> bats' comment lines after the case's ``not ok`` (its output)
    output: dict[str, list[str]] = field(default_factory=dict)

    @property
    def run(self) -> int:
        return len(self.passed) + len(self.failed) + len(self.skipped)

    def line(self, tender: str) -> str:
        failed = f" ({', '.join(self.failed)})" if self.failed else ""
        return (
            f"{tender}: {self.run} hvt cases: {len(self.passed)} passed, "
            f"{len(self.failed)} failed{failed}, {len(self.skipped)} skipped"
        )


def parse_tap(lines: list[str]) -> Summary:
    """The cases of a TAP stream (bats --tap): ``1..N`` then one
    ``ok``/``not ok`` line each, a skip marked ``# skip (REASON)``; a failed
    case's ``#`` lines that follow (bats' diagnostics, then the output
    tests.bats' teardown echoes) are kept."""
    summary = Summary()
    comments: list[str] = []
    for line in lines:
        if re.fullmatch(r"1\.\.\d+", line):
            summary.planned = int(line[3:])
            continue
        if line.startswith("#"):
            comments.append(line[2:] if line.startswith("# ") else line[1:])
            continue
        match = TAP_LINE.match(line)
        if match is None:
            continue
        verdict, _number, name, reason = match.group(1, 2, 3, 4)
        comments = []  # what follows belongs to this case
        if verdict == "not ok":
            summary.failed.append(name)
            comments = summary.output[name] = []
        elif reason is not None or line.endswith(" # skip"):
            summary.skipped[name] = (reason or "").removeprefix("(").removesuffix(")")
        else:
            summary.passed.append(name)
    return summary


def ensure_bats() -> str:
    """bats' path, installing Debian's package if it is missing."""
    found = shutil.which("bats")
    if found:
        return found
    if os.geteuid() != 0:
        raise BatsError("bats is not installed (apt-get install bats, as root)", 2)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    done = subprocess.run(
        ["apt-get", "install", "-y", "-qq", "bats"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    found = shutil.which("bats")
    if done.returncode != 0 or not found:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BatsError(f"apt-get install bats failed: {tail}", 2)
    return found


def tender_targets(choice: str, build: solo5_build.Solo5Build) -> dict[str, Path]:
    """What each of tests.bats' tender names points to."""
    if choice == "pyvmm":
        targets = {name: LAUNCHER for name in TENDER_NAMES}
    else:
        targets = {name: build.src / "tenders" / "hvt" / name for name in TENDER_NAMES}
    for path in targets.values():
        if not os.access(path, os.X_OK):
            hint = " (python3 setup.py build_ext --inplace)" if choice == "pyvmm" else ""
            raise BatsError(f"no tender at {path}{hint}", 2)
    return targets


def make_tree(work: Path, build: solo5_build.Solo5Build, targets: dict[str, Path]) -> Path:
    """The layout tests.bats expects around itself, in ``work``; the
    directory of the copied tests.bats."""
    tests = work / "tests"
    shutil.copytree(build.src / "tests", tests, symlinks=True)
    shutil.copy2(build.src / "Makeconf.sh", work / "Makeconf.sh")
    hvt = work / "tenders" / "hvt"
    hvt.mkdir(parents=True)
    for name, target in targets.items():
        (hvt / name).symlink_to(target)
    # The other targets' tools, for a --filter that reaches their cases.
    (work / "tenders" / "spt").mkdir()
    (work / "tenders" / "spt" / "solo5-spt").symlink_to(build.src / "tenders/spt/solo5-spt")
    (work / "elftool").mkdir()
    (work / "elftool" / "solo5-elftool").symlink_to(build.src / "elftool/solo5-elftool")
    return tests


def run_bats(bats: str, tests: Path, bats_tmp: Path, regex: str) -> tuple[int, list[str]]:
    """bats over the copied tests.bats inside a fresh namespace with
    tests.bats' taps; its status and TAP lines (printed as they come)."""
    from testkit.netns import NetNamespace

    env = dict(os.environ, TMPDIR=str(bats_tmp), BATS_TMPDIR=str(bats_tmp))
    lines: list[str] = []
    with NetNamespace(prefix="pyvmm-s5bats-") as ns:
        for tap, address, mtu in TAPS:
            ns.add_tap(tap, address=address, mtu=mtu)
        proc = ns.popen(
            [bats, "--tap", "--filter", regex, "tests.bats"],
            cwd=str(tests),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        guard = threading.Timer(SUITE_TIMEOUT, _kill_session, (proc,))
        guard.daemon = True
        guard.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                print(line, end="", flush=True)
                lines.append(line.rstrip("\n"))
            status = proc.wait()
        finally:
            guard.cancel()
            if proc.poll() is None:
                _kill_session(proc)
                proc.wait()
    if status == -signal.SIGKILL:
        raise BatsError(f"bats still running after {SUITE_TIMEOUT:.0f} s: stopped")
    return status, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run Solo5's tests.bats (hvt cases) with pyvmm or the real solo5-hvt.",
    )
    parser.add_argument(
        "--tender",
        choices=("pyvmm", "real"),
        default="pyvmm",
        help="pyvmm as solo5-hvt and solo5-hvt-debug (default), or the real ones",
    )
    parser.add_argument(
        "--filter", default=HVT_FILTER, help=f"bats' --filter (default {HVT_FILTER!r})"
    )
    parser.add_argument("--archive", help="Solo5's release archive (scripts/solo5_build.py)")
    parser.add_argument("--cache", help="where Solo5 is built (scripts/solo5_build.py)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary tree")
    args = parser.parse_args(argv)
    name = "pyvmm" if args.tender == "pyvmm" else "solo5-hvt"
    try:
        bats = ensure_bats()
        build = solo5_build.ensure(
            args.archive,
            args.cache,
            bindings=False,
            log=lambda message: print(f"{PROG}: {message}", file=sys.stderr),
        )
        targets = tender_targets(args.tender, build)
        work = Path(tempfile.mkdtemp(prefix="pyvmm-solo5-bats-"))
        try:
            bats_tmp = work / "tmp"
            bats_tmp.mkdir()
            tests = make_tree(work, build, targets)
            status, lines = run_bats(bats, tests, bats_tmp, args.filter)
        finally:
            if args.keep:
                print(f"{PROG}: kept {work}", file=sys.stderr)
            else:
                shutil.rmtree(work, ignore_errors=True)
    except (BatsError, solo5_build.BuildError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return err.status
    except (OSError, subprocess.SubprocessError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Stopped as stop:
        print(f"{PROG}: stopped by signal {stop.signum}", file=sys.stderr)
        return 128 + stop.signum
    summary = parse_tap(lines)
    print(f"{PROG}: {summary.line(name)}", flush=True)
    if summary.planned < 0 or summary.run != summary.planned:
        print(f"{PROG}: bats planned {summary.planned} cases, reported {summary.run}")
        return 1
    return 0 if status == 0 and not summary.failed else 1


if __name__ == "__main__":
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, _on_stop)
    sys.exit(main())
