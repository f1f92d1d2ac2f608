"""One poll-set limit (csrc/fdwait.h): the stop eventfd, the shmstream wake
eventfd and one fd per manifest handle, waited on together, with a ready
bit for each even past the 64th fd; the poll hypercall's wait takes that
many, in C and in Python, and the fast path's struct holds as many; a set
past it is refused with one line when the hypercall table builds it,
before the guest runs, and by the fast path's configuration alike."""

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
ARG = 0x100000  # the poll hypercall's argument struct, above the low area


def test_the_limit_is_the_fixed_eventfds_and_one_fd_per_manifest_handle():
    assert LIMIT == lib.MFT_MAX_ENTRIES + lib.PYVMM_WAIT_FIXED_FDS == lib.MFT_MAX_ENTRIES + 2
    assert lib.PYVMM_FAST_MAX_POLL == LIMIT
    fast = ffi.new("struct pyvmm_fastpath *")
    assert len(fast.poll_fd) == len(fast.poll_handle) == LIMIT
    assert lib.PYVMM_WAIT_MASK_WORDS * 64 >= LIMIT


@pytest.fixture
def eventfds():
    fds: list[int] = []
    try:
        for _ in range(LIMIT + 1):
            fds.append(os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def mask_of(ready) -> int:
    return sum(word << (64 * i) for i, word in enumerate(ready))


@pytest.mark.parametrize("readable", [[LIMIT - 1], [0, 63, 64, LIMIT - 1], list(range(LIMIT))])
def test_the_largest_set_is_waited_on_with_a_bit_for_every_fd(eventfds, readable):
    for i in readable:
        os.eventfd_write(eventfds[i], 1)
    fds = ffi.new("int[]", eventfds[:LIMIT])
    ready = ffi.new("uint64_t[]", lib.PYVMM_WAIT_MASK_WORDS)
    assert lib.pyvmm_wait_readable(fds, LIMIT, 0, ready) == len(readable)
    assert mask_of(ready) == sum(1 << i for i in readable)


def test_a_set_past_the_limit_is_refused(eventfds):
    fds = ffi.new("int[]", eventfds)
    ready = ffi.new("uint64_t[]", lib.PYVMM_WAIT_MASK_WORDS)
    assert lib.pyvmm_wait_readable(fds, LIMIT + 1, 0, ready) == -22  # EINVAL
    assert lib.pyvmm_wait_readable(fds, -1, 0, ready) == -22


def test_a_small_set_writes_one_word_only():
    fd = os.eventfd(1, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        fds = ffi.new("int[]", [fd])
        ready = ffi.new("uint64_t[]", [0, 0xDEAD])
        assert lib.pyvmm_wait_readable(fds, 1, 0, ready) == 1
        assert list(ready) == [1, 0xDEAD]
    finally:
        os.close(fd)


class _PollOnly:
    """A net device as the poll hypercall and the fast path see it: a
    handle, a tap fd (an eventfd here) that poll waits on, a frame size."""

    max_frame = 1514

    def __init__(self, handle: int, fd: int) -> None:
        self.handle = handle
        self.fd = fd

    def poll_fd(self) -> int:
        return self.fd

    def fileno(self) -> int:
        return self.fd


def test_the_poll_hypercall_answers_with_a_device_on_every_manifest_handle(eventfds):
    """Python's poll with the stop eventfd and 64 net devices: the device
    on the last handle (the 65th fd) is reported ready."""
    (net,) = [kind for kind in kinds() if kind.type == DeviceType.NET]
    stop, taps = eventfds[0], eventfds[1 : 1 + lib.MFT_MAX_ENTRIES]
    devices = [(net, _PollOnly(handle, fd)) for handle, fd in enumerate(taps)]
    last = lib.MFT_MAX_ENTRIES - 1
    os.eventfd_write(taps[last], 1)
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        with GuestMemory(4 << 20) as memory:
            calls = Hypercalls(memory, Console(null), devices, stop)
            arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
            arg.timeout_nsecs, arg.ready_set, arg.ret = 0, 0, -1
            calls.poll(ARG)
            arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
            assert (arg.ret, arg.ready_set) == (lib.HVT_RET_OK, 1 << last)
            assert calls.fast_path().n_poll == 1 + lib.MFT_MAX_ENTRIES
    finally:
        os.close(null)


# -- past the limit: refused with one line, before the guest runs --------------

REFUSAL = (
    f"the poll hypercall would wait on {LIMIT + 1} fds (the stop eventfd, each IO "
    f"service's wake eventfd, each device's fd): at most {LIMIT}"
)


class _Woken:
    """An IO service as the poll set sees it: a wake eventfd, no handles."""

    key = "woken"
    owned: frozenset[int] = frozenset()
    poll_view = ffi.NULL
    kicks_at_exit = ffi.NULL

    def __init__(self, wake_fd: int) -> None:
        self.wake_fd = wake_fd


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
    devices = [(net, _PollOnly(handle, fd)) for handle, fd in enumerate(taps)]
    return Hypercalls(memory, console, devices, stop, [_Woken(fd) for fd in wakes])


def test_a_poll_set_at_the_limit_is_built(eventfds, console):
    with GuestMemory(4 << 20) as memory:
        calls = _table(memory, console, eventfds, lib.PYVMM_WAIT_FIXED_FDS - 1)
        assert calls.fast_path().n_poll == LIMIT


def test_a_poll_set_past_the_limit_is_refused_when_the_table_is_built(eventfds, console):
    with GuestMemory(4 << 20) as memory:
        with pytest.raises(HostError) as err:
            _table(memory, console, eventfds, lib.PYVMM_WAIT_FIXED_FDS)
    assert str(err.value) == REFUSAL


def test_the_fast_paths_configuration_refuses_it_too(eventfds):
    poll = [(fd, -1) for fd in eventfds]
    with GuestMemory(4 << 20) as memory:
        with pytest.raises(HostError) as err:
            fastpath.build(memory, [], poll)
    assert str(err.value) == REFUSAL
