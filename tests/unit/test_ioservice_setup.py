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
