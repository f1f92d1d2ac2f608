"""What a security review of pyvmm found and confirmed, each with the guest
or file that showed it (the review's reproductions): a stop signal while the console write blocks,
and a stop signal taken by another thread than the API's vCPU thread.
The loader, IO-service and hypercall-struct cases are unit tests
(tests/unit/test_loader_limits.py, test_hypercall_copy.py,
test_ioservice_setup.py)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import termios
import threading
import time

import pytest

from conftest import ROOT, guest
from pyvmm.api import Guest

pytestmark = pytest.mark.kvm

STOPS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


def _pipe_fill(fd: int) -> int:
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, "little")


@pytest.mark.parametrize("sandbox", [True, False], ids=["sandbox", "no-sandbox"])
@pytest.mark.parametrize("signum", STOPS, ids=[s.name for s in STOPS])
def test_stop_signal_ends_a_run_whose_console_output_blocks(signum, sandbox):
    """chatty prints without end into a pipe nobody reads: once the pipe is
    full pyvmm waits on it, and a stop signal must still end it, at once,
    with 128 + signal and the one line (it used to sleep in write for ever)."""
    read_end, write_end = os.pipe()
    args = [] if sandbox else ["--no-sandbox"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyvmm", *args, str(guest("chatty"))],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    os.close(write_end)
    try:
        size = fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ)
        deadline = time.monotonic() + 30
        while _pipe_fill(read_end) < size and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _pipe_fill(read_end) == size, "the guest never filled the pipe"
        time.sleep(0.2)  # well inside the blocked write by now
        sent = time.monotonic()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=10)
        assert time.monotonic() - sent < 5
        assert proc.returncode == 128 + signum, err
        assert err.splitlines() == [f"pyvmm: stopped by {signum.name} (Exiting on signal {signum})"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(read_end)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_api_stop_signal_taken_by_another_thread_kicks_the_vcpu_thread(signum):
    """pyvmm.api runs the vCPU on its own thread; a process-directed stop
    signal may be taken by any thread (here the main thread, on purpose).
    The C handler must kick the vCPU thread out of KVM_RUN: spin makes no
    hypercall, so without the kick it would never see the flag."""
    g = Guest(str(guest("spin")), mem=32)
    g.start()
    try:
        vmm = g._vmm
        assert vmm is not None and vmm.running.wait(30)
        time.sleep(0.3)  # the guest spins inside KVM_RUN
        signal.pthread_kill(threading.main_thread().ident, signum)
        assert g.wait(timeout=10) == 128 + signum
    finally:
        if not g._done.is_set():
            g.stop()
            g.wait(timeout=30)
