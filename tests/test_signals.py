"""SIGINT, SIGTERM and SIGHUP end a guest cleanly: pyvmm exits promptly with 128 +
signal, one line on stderr, and releases what it held (here: the tap, which
another process can attach at once afterwards)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from conftest import guest, popen_pyvmm
from testkit.netns import NetNamespace

pytestmark = pytest.mark.kvm

STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]  # README: 128 + signal


def start_waiting_guest(ns: NetNamespace, shm: str = "event") -> subprocess.Popen:
    """The ping guest with no count waits in the poll hypercall forever
    (answered by Python with shmstream, by the C fast path with --shm=off)."""
    vm, _ = ns.start_pyvmm(f"--shm={shm}", "--net:service0=tap100", guest("ping"), "10.0.0.2")
    return vm


@pytest.mark.netns
@pytest.mark.parametrize("shm", ["event", "off"])
@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_signal_stops_guest_and_releases_tap(sig, shm):
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm = start_waiting_guest(ns, shm)
        vm.send_signal(sig)
        _, err = vm.communicate(timeout=30)
        assert vm.returncode == 128 + sig, err
        assert err.strip() == f"pyvmm: stopped by {sig.name} (Exiting on signal {sig.value})"
        # The tap was released: a new pyvmm can attach it right away.
        again = start_waiting_guest(ns)
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=30)
        assert again.returncode == 128 + signal.SIGTERM


@pytest.mark.parametrize("sig", STOP_SIGNALS)
@pytest.mark.parametrize("cpl", ["0", "3"])
def test_stop_signal_stops_a_cpu_bound_guest(cpl, sig):
    """A guest that never exits to pyvmm is still stopped: the signal
    interrupts KVM_RUN (or immediate_exit catches it just before)."""
    vm = popen_pyvmm(f"--cpl={cpl}", guest("spin"))
    assert vm.stdout.readline().strip() == "spinning"
    vm.send_signal(sig)
    _, err = vm.communicate(timeout=30)
    assert vm.returncode == 128 + sig
    assert err.strip() == f"pyvmm: stopped by {sig.name} (Exiting on signal {sig.value})"
