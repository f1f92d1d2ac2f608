"""The Python API under a stop signal: pyvmm.api runs the vCPU on its own
thread, and a process-directed SIGTERM or SIGINT taken by any other thread
still ends the run with 128 + signal."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from conftest import guest
from pyvmm.api import Guest

pytestmark = pytest.mark.kvm


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
