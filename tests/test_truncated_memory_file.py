"""Guest memory mapped from a file that loses its pages under a running
guest ends the run with one guest-fault line and status 1, never a SIGBUS.

A restored snapshot's guest memory is its memory file, mapped privately:
every page, the hypercall structs on the guest's stack included. Here the
file is truncated while the restored guest waits in a poll hypercall; when
the wait ends (a stop signal), the C fast path writes the poll's results
into a page that is gone: that store, under the fast path's guard, hands
the hypercall to Python, whose guarded copy reports it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, guest, run_pyvmm

pytestmark = pytest.mark.kvm

WAIT = 30.0  # seconds: generous on a loaded 2-core machine


def in_a_poll(pid: int) -> bool:
    """Whether the process's main thread (the vCPU's) sleeps in poll."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return "poll" in f.read()
    except OSError:
        return False


def test_a_memory_file_truncated_under_a_restored_guest_is_a_guest_fault(tmp_path: Path) -> None:
    image = tmp_path / "imgshare.hvt"
    shutil.copyfile(guest("imgshare"), image)
    image.chmod(0o755)
    snapshot = tmp_path / "snap"
    taken = run_pyvmm(
        "--mem=16",
        "--snapshot-at=first-wait",
        f"--snapshot-dir={snapshot}",
        "--snapshot-stop",
        image,
    )
    assert taken.returncode == 0, taken.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyvmm", f"--restore={snapshot}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + WAIT
        while not in_a_poll(proc.pid):  # the restored guest waits for an hour
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        os.truncate(snapshot / "memory", 0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pyvmm: guest fault: poll hypercall at "), err
    assert "its pages are gone (the file they were mapped from was truncated)" in lines[0]
