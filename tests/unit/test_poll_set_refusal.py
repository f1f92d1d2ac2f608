"""A poll set past the one limit (csrc/fdwait.h) is refused with one line
when the hypercall table builds it, before the guest runs, and by the fast
path's configuration alike; the limit itself is pinned in
tests/unit/test_poll_set_limit.py."""

from __future__ import annotations

import os

import pytest

from pyvmm._native import ffi, lib
from pyvmm.common.errors import HostError
from pyvmm.devices import kinds
from pyvmm.devices.console import Console
from pyvmm.hvt import fastpath
from pyvmm.hvt.hypercalls import Hypercalls
from pyvmm.kvm.memory import GuestMemory
from pyvmm.loader.manifest import DeviceType

LIMIT = lib.PYVMM_WAIT_MAX_FDS
REFUSAL = (
    f"the poll hypercall would wait on {LIMIT + 1} fds (the stop eventfd, each IO "
    f"service's wake eventfd, each device's fd): at most {LIMIT}"
)


class _Woken:
    """An IO service as the poll set sees it: a wake eventfd, no handles."""

    key = "woken"
    owned: frozenset[int] = frozenset()
    poll_view = ffi.NULL

    def __init__(self, wake_fd: int) -> None:
        self.wake_fd = wake_fd


class _Polled:
    """A net device as the poll set sees it: a handle and the fd to wait on."""

    max_frame = 1514

    def __init__(self, handle: int, fd: int) -> None:
        self.handle = handle
        self.fd = fd

    def poll_fd(self) -> int:
        return self.fd

    def fileno(self) -> int:
        return self.fd


@pytest.fixture
def fds():
    made = [os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK) for _ in range(LIMIT + 1)]
    try:
        yield made
    finally:
        for fd in made:
            os.close(fd)


@pytest.fixture
def console():
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        yield Console(null)
    finally:
        os.close(null)


def _table(memory, console, fds, wakers: int) -> Hypercalls:
    """The stop eventfd, ``wakers`` services' wake eventfds, and a net
    device on every manifest handle."""
    (net,) = [kind for kind in kinds() if kind.type == DeviceType.NET]
    stop, wakes = fds[0], fds[1 : 1 + wakers]
    taps = fds[1 + wakers : 1 + wakers + lib.MFT_MAX_ENTRIES]
    devices = [(net, _Polled(handle, fd)) for handle, fd in enumerate(taps)]
    return Hypercalls(memory, console, devices, stop, [_Woken(fd) for fd in wakes])


def test_a_poll_set_at_the_limit_is_built(fds, console):
    with GuestMemory(4 << 20) as memory:
        calls = _table(memory, console, fds, lib.PYVMM_WAIT_FIXED_FDS - 1)
        assert calls.fast_path().n_poll == LIMIT


def test_a_poll_set_past_the_limit_is_refused_when_the_table_is_built(fds, console):
    with GuestMemory(4 << 20) as memory:
        with pytest.raises(HostError) as err:
            _table(memory, console, fds, lib.PYVMM_WAIT_FIXED_FDS)
    assert str(err.value) == REFUSAL


def test_the_fast_paths_configuration_refuses_it_too(fds):
    poll = [(fd, -1) for fd in fds]
    with GuestMemory(4 << 20) as memory:
        with pytest.raises(HostError) as err:
            fastpath.build(memory, [], poll)
    assert str(err.value) == REFUSAL
