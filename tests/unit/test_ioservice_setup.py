"""An IO service whose set-up fails leaves no fd behind (the kick and wake
eventfds were once opened before the try that closes them)."""

from __future__ import annotations

import os

import pytest

from pyvmm.common.errors import HostError
from pyvmm.devices.iothread import IoConfig, IoService


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


class Refusing:
    """A VM whose ioeventfd registration fails (as KVM may: EEXIST, ENOSPC)."""

    def add_ioeventfd(self, fd, port, length, pio=False):
        raise HostError("KVM_IOEVENTFD: No space left on device")


class Accepting:
    def add_ioeventfd(self, fd, port, length, pio=False):
        pass


@pytest.mark.parametrize("wake", [False, True])
def test_a_failed_ioeventfd_registration_closes_the_eventfds(wake) -> None:
    before = open_fds()
    with pytest.raises(HostError):
        IoService()._open(IoConfig(), Refusing(), 0x600, wake=wake)
    assert open_fds() == before


def test_a_failed_thread_creation_closes_the_eventfds(monkeypatch) -> None:
    import pyvmm.devices.iothread as iothread

    def no_thread(*args):
        raise HostError("cannot create the IO thread: out of memory or file descriptors")

    monkeypatch.setattr(iothread, "IoThread", no_thread)
    before = open_fds()
    with pytest.raises(HostError):
        IoService()._open(IoConfig(), Accepting(), 0x600, wake=True)
    assert open_fds() == before


class Recording:
    """A VM that records the doorbells registered with it."""

    def __init__(self) -> None:
        self.doorbells: list[int] = []

    def add_ioeventfd(self, fd, port, length, pio=False):
        self.doorbells.append(port)


@pytest.mark.parametrize(
    "port, doorbell, registered, kick_fd",
    [(0x600, True, True, True), (0x600, False, False, True), (None, True, False, False)],
    ids=["kvm-absorbs-the-kicks", "kicks-exit", "never-kicked"],
)
def test_a_doorbell_is_registered_only_where_kvm_takes_the_kicks(
    port, doorbell, registered, kick_fd
) -> None:
    """Kicks served at their exit keep the eventfd (a kick the vCPU thread
    hands to the IO thread goes through it) but no ioeventfd."""
    vm = Recording()
    service = IoService()
    service._open(IoConfig(), vm, port, wake=False, doorbell=doorbell)
    try:
        assert bool(vm.doorbells) == registered
        assert (service.kick_fd >= 0) == kick_fd
    finally:
        service._stack.close()


def test_kicks_at_exit_need_a_solo5_ring_said_in_one_line() -> None:
    from pyvmm.devices.iothread import IoThread

    thread = IoThread(IoConfig(), -1, -1)
    try:
        refusal = "^IO thread: cannot serve kicks at their exit: Invalid"
        with pytest.raises(HostError, match=refusal):
            thread.solo5_kicks_at_exit()
    finally:
        thread.close()
