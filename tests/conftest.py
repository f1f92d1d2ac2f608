"""Shared fixtures, and the rules that keep a green run honest.

- ``kvm`` tests skip only where /dev/kvm is absent. Where it is present, a
  run fails if any of them skipped, or if the run collected KVM tests and
  none of them ran (``-m "not kvm"`` on a KVM host fails: run tests/unit
  for the unit tests alone, docs/testing.md).
- ``netns`` tests (their own network namespace with a tap) skip only where
  the run is not root or lacks /dev/net/tun; where both are there, a
  skipped one fails the run.
- A skip whose reason says a tool is not installed fails the run:
  scripts/setup installs every tool the suite needs.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.netns import can_create_namespaces

ROOT = Path(__file__).resolve().parent.parent
GUESTS = ROOT / "guests" / "bin"
HAVE_KVM = os.path.exists("/dev/kvm")
HAVE_NETNS = can_create_namespaces()
# How a skip names a missing tool: see need_tool().
MISSING_TOOL = re.compile(r"\bis not installed\b")

# tests/aarch64 boots aarch64 guests on arm64 KVM: scripts/test-aarch64 runs
# it inside an emulated arm64 machine (.ci/run does, after this suite). On
# any other host it is not collected at all (tests/unit/test_aarch64.py is
# what an x86_64 host checks of the port), so a green run has no skips.
collect_ignore = [] if platform.machine() == "aarch64" else ["aarch64"]

_kvm_collected: list[str] = []
_kvm_skipped: list[str] = []
_kvm_ran: list[str] = []
_netns_skipped: list[str] = []
_tool_skipped: list[str] = []


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("kvm"):
            _kvm_collected.append(item.nodeid)
            if not HAVE_KVM:
                item.add_marker(pytest.mark.skip(reason="/dev/kvm is absent"))
        if item.get_closest_marker("netns") and not HAVE_NETNS:
            item.add_marker(pytest.mark.skip(reason="needs root and /dev/net/tun"))


def pytest_deselected(items):
    # -m / -k deselection: a KVM test deselected on a KVM host still counts
    # as collected, so a run that leaves them all out fails.
    _kvm_collected.extend(i.nodeid for i in items if i.get_closest_marker("kvm"))


def pytest_runtest_logreport(report):
    # An expected failure (xfail, a known bug) ran: pytest reports it as skipped.
    skipped = report.skipped and not hasattr(report, "wasxfail")
    if skipped:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        if MISSING_TOOL.search(reason):
            _tool_skipped.append(f"{report.nodeid}: {reason}")
        if "netns" in report.keywords and HAVE_NETNS:
            _netns_skipped.append(report.nodeid)
    if "kvm" not in report.keywords:
        return
    if skipped:
        _kvm_skipped.append(report.nodeid)
    elif report.when == "call":
        _kvm_ran.append(report.nodeid)


def _fail_run(session, what: str, nodeids: list[str]) -> None:
    sys.stderr.write(f"\nFAIL: {what}:\n  " + "\n  ".join(nodeids) + "\n")
    session.exitstatus = 1


def pytest_sessionfinish(session, exitstatus):
    if session.config.option.collectonly:
        return
    if _tool_skipped:
        _fail_run(session, "tests skipped for a missing tool (scripts/setup has it)", _tool_skipped)
    if _netns_skipped:
        _fail_run(session, "root with /dev/net/tun, yet these netns tests skipped", _netns_skipped)
    if not HAVE_KVM:
        return
    if _kvm_skipped:
        _fail_run(session, "/dev/kvm is present but these KVM tests skipped", _kvm_skipped)
    elif _kvm_collected and not _kvm_ran:
        _fail_run(
            session,
            "/dev/kvm is present and KVM tests were collected, but none ran",
            _kvm_collected[:5] + (["..."] if len(_kvm_collected) > 5 else []),
        )


def guest(name: str) -> Path:
    """Path of a built guest; a missing one is a failure, not a skip."""
    path = GUESTS / f"{name}.hvt"
    if not path.exists():
        pytest.fail(f"{path} is missing: run 'make -C guests' first")
    return path


def engine_env(engine: str) -> dict[str, str] | None:
    """The environment that makes pyvmm answer hypercalls with ``engine``:
    "c" (the fast path, the default) or "python" (PYVMM_PY_HYPERCALLS=1)."""
    return dict(os.environ, PYVMM_PY_HYPERCALLS="1") if engine == "python" else None


def run_pyvmm(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run the pyvmm command as a user would, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "pyvmm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        **kwargs,
    )


def popen_pyvmm(*args: str, **kwargs) -> subprocess.Popen:
    """Start the pyvmm command (stdout and stderr piped, text), for a test
    that acts on it while it runs."""
    return subprocess.Popen(
        [sys.executable, "-m", "pyvmm", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        **kwargs,
    )


@pytest.fixture
def disk(tmp_path) -> Path:
    """A 1 MiB zeroed disk image for block tests."""
    path = tmp_path / "disk.img"
    with open(path, "wb") as f:
        f.truncate(1 << 20)
    return path


def need_tool(name: str) -> str:
    """The path of a tool the test needs; a skip naming it if it is missing,
    which fails the run (pytest_sessionfinish): scripts/setup installs it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


@pytest.fixture
def loop_device(tmp_path) -> tuple[str, Path]:
    """A loop block device over a zeroed 1 MiB image: (device path, image),
    detached afterwards. losetup missing fails the run (need_tool)."""
    losetup = need_tool("losetup")
    image = tmp_path / "loop.img"
    image.write_bytes(bytes(1 << 20))
    found = subprocess.run(
        [losetup, "--find", "--show", str(image)], capture_output=True, text=True
    )
    if found.returncode != 0:
        pytest.skip(f"no loop devices here: {found.stderr.strip()}")
    device = found.stdout.strip()
    try:
        yield device, image
    finally:
        subprocess.run([losetup, "--detach", device], check=True)
