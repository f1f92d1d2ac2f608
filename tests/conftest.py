"""Shared fixtures; and the rule that KVM tests may not skip where KVM exists.

Tests marked ``kvm`` skip only when /dev/kvm is absent. Where it is present,
a run in which any of them skipped (or none ran at all) fails, so a broken
fixture can never turn the integration suite into a silent pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUESTS = ROOT / "guests" / "bin"
HAVE_KVM = os.path.exists("/dev/kvm")

_kvm_skipped: list[str] = []
_kvm_ran: list[str] = []


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("kvm") and not HAVE_KVM:
            item.add_marker(pytest.mark.skip(reason="/dev/kvm is absent"))


def pytest_runtest_logreport(report):
    if "kvm" not in report.keywords:
        return
    if report.skipped:
        _kvm_skipped.append(report.nodeid)
    elif report.when == "call":
        _kvm_ran.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if not HAVE_KVM or session.config.option.collectonly:
        return
    selected = [i for i in session.items if i.get_closest_marker("kvm")]
    if not selected:
        return
    if _kvm_skipped:
        sys.stderr.write(
            "\nFAIL: /dev/kvm is present but these KVM tests skipped:\n  "
            + "\n  ".join(_kvm_skipped)
            + "\n"
        )
        session.exitstatus = 1


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


@pytest.fixture
def disk(tmp_path) -> Path:
    """A 1 MiB zeroed disk image for block tests."""
    path = tmp_path / "disk.img"
    with open(path, "wb") as f:
        f.truncate(1 << 20)
    return path


def have_tool(name: str) -> bool:
    return shutil.which(name) is not None
