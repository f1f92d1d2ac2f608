"""A stop signal ends a run whose console output blocks: a guest printing
into a pipe nobody reads fills it, pyvmm waits in the write, and SIGTERM,
SIGINT or SIGHUP still ends it at once with 128 + signal and the one line,
with and without the sandbox."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import termios
import time

import pytest

from conftest import ROOT, guest

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
    with 128 + signal and the one line (not sleep in the write for ever)."""
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
