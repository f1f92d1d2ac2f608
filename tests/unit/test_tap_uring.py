"""The IO thread's batched tap reads through io_uring (csrc/tap_io.c's
tap_uring_*, the shmstream links' RX path in csrc/iothread_shm.c), with the
socketpair backends of testkit/iorig.py.

The same checks as the readv path's (tests/unit/test_iothread.py): frames
intact and in order across ring wrap and chains; oversize frames dropped
and counted, the frames after them moved down so that no slot is lost;
the full ring's drops counted exactly; empty reads never published; every
threaded mode moving every frame in order; a hostile guest scribbling
over its rings while reads are in flight, the host writing only its own
fields; and the ring itself: restricted
(no registration after it is enabled), every read cancelled once the
thread stops (no write into the rings afterwards), no fd left behind.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import socket
import time

import numpy as np
import pytest

from pyvmm._native import ffi, lib
from testkit.iorig import MASK, NEAR_WRAP, SLOT_DATA, ShmRig

CHAIN = lib.TAP_URING_CHAIN
MODES = {"poll": lib.IO_MODE_POLL, "event": lib.IO_MODE_EVENT, "hybrid": lib.IO_MODE_HYBRID}
_PATTERN = bytes(i % 251 for i in range(70000))
_SYS_IO_URING_REGISTER = 427  # the same number on x86_64 and aarch64
_IORING_REGISTER_FILES = 2


def frame(seq: int, length: int) -> bytes:
    head = seq.to_bytes(8, "little")
    return (head + _PATTERN[seq % 251 : seq % 251 + length])[:length]


class UringRig(ShmRig):
    """ShmRig whose link reads its backend through io_uring; the ring is
    released once the thread is stopped, before the thread is destroyed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        err = lib.io_shm_use_uring(self.io)
        if err:
            super().close()
            pytest.skip(f"io_uring is not available here: {os.strerror(-err)}")

    def close(self) -> None:
        if self.io is not None and not self._hung:
            self.stop()
            lib.io_shm_release_uring(self.io)
        super().close()


@pytest.fixture
def rigs():
    made: list[UringRig] = []

    def make(*args, **kwargs) -> UringRig:
        rig = UringRig(*args, **kwargs)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


def wait_until(condition, what: str, seconds: float = 30.0) -> None:
    """A bound for a hang only: a loaded machine is slow, never wrong."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds} s")
        time.sleep(0.002)


def test_one_pass_reads_every_waiting_frame_of_a_chain(rigs):
    rig = rigs(slots=64)
    frames = [frame(i, 60 + i) for i in range(5)]
    rig.backend_send(frames)
    assert rig.serve() == 5
    assert rig.guest_receive() == frames
    assert rig.count()["rx_frames"] == 5 and rig.count()["notify_suppressed"] == 1


@pytest.mark.parametrize("slots", [2, 8, 64, 256])
def test_frames_move_intact_and_in_order_across_chains_and_the_ring_wrap(rigs, slots: int):
    rig = rigs(slots=slots)
    sent = got = 0
    total = 3 * CHAIN + slots * 3 + 7
    while got < total:
        room = slots - (sent - got)
        batch = [frame(sent + i, 1 + (sent + i) * 97 % SLOT_DATA) for i in range(room)]
        batch = batch[: total - sent]
        rig.backend_send(batch)
        sent += len(batch)
        rig.service_until_idle()
        for f in rig.guest_receive():
            assert f == frame(got, len(f)), f"frame {got} out of order or changed"
            got += 1
    c = rig.count()
    assert c["rx_frames"] == total and c["rx_drops_full"] == c["rx_drops_oversize"] == 0
    assert rig.rx.prod == (NEAR_WRAP + total) & MASK
    assert rig.guards_intact()


def test_oversize_frames_are_counted_and_the_next_frames_take_their_slots(rigs):
    rig = rigs(slots=8)
    sizes = [10, SLOT_DATA + 1, SLOT_DATA, 5000, 20, 65536, 1]
    frames = [frame(i, n) for i, n in enumerate(sizes)]
    rig.backend_send(frames)
    rig.service_until_idle()
    good = [f for f in frames if len(f) <= SLOT_DATA]
    assert rig.guest_receive() == good
    c = rig.count()
    assert c["rx_drops_oversize"] == 3
    assert c["rx_frames"] == len(good) and c["rx_bytes"] == sum(map(len, good))
    assert rig.rx.prod == (NEAR_WRAP + len(good)) & MASK, "an oversize frame took a slot"
    assert rig.guards_intact()


@pytest.mark.parametrize("slots, extra", [(2, 3), (8, 13), (64, 100)])
def test_full_rx_ring_drops_and_counts_exactly(rigs, slots: int, extra: int):
    rig = rigs(slots=slots)
    n = slots + extra
    frames = [frame(i, 1 + (i * 53) % SLOT_DATA) for i in range(n)]
    rig.backend_send(frames)
    rig.service_until_idle()
    c = rig.count()
    assert c["rx_frames"] == slots and c["rx_drops_full"] == n - slots
    with pytest.raises(BlockingIOError):
        rig.host.recv(1)  # every frame was read from the backend
    assert rig.guest_receive() == frames[:slots], "the first frames are the ones kept"
    later = [frame(10_000 + i, 100) for i in range(slots)]
    rig.backend_send(later)
    rig.service_until_idle()
    assert rig.guest_receive() == later
    assert rig.count()["rx_drops_full"] == n - slots
    assert rig.guards_intact()


@pytest.mark.parametrize("case", ["empty-datagram", "eof"])
def test_zero_byte_reads_are_never_published_and_are_no_work(rigs, case: str):
    rig = rigs(slots=8)
    if case == "eof":
        rig.peer.close()
    else:
        rig.backend_send([b""])
    rig.serve()
    assert rig.serve() == 0, "the pass keeps finding 'frames'"
    assert rig.count()["rx_frames"] == 0
    assert rig.rx.prod == NEAR_WRAP, "an empty frame was published"
    if case == "empty-datagram":  # the link reads on, through readv
        rig.backend_send([frame(1, 50)])
        rig.service_until_idle()
        assert rig.guest_receive() == [frame(1, 50)]


@pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))
def test_threaded_mode_moves_every_frame_in_order(rigs, mode: int):
    rig = rigs(slots=16, mode=mode, budget_us=200)
    rig.start()
    n, sent, got = 3000, 0, 0
    deadline = time.monotonic() + 120
    while got < n:
        assert time.monotonic() < deadline, f"only {got} of {n} frames arrived"
        while sent < n and sent - got < rig.slots:
            rig.backend_send([frame(sent, 64 + sent % 1400)])
            sent += 1
        for f in rig.guest_receive():
            assert f == frame(got, len(f)), f"frame {got} out of order or changed"
            got += 1
    rig.stop()
    c = rig.count()
    assert c["rx_frames"] == n
    assert c["rx_drops_full"] == c["rx_drops_oversize"] == c["rx_bad_index"] == 0
    assert rig.guards_intact()


@pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))
def test_idle_event_thread_sleeps_with_reads_in_flight_and_wakes_for_a_frame(rigs, mode: int):
    rig = rigs(slots=16, mode=mode, budget_us=200)
    rig.start()
    rig.backend_send([frame(0, 100)])
    wait_until(lambda: rig.count()["rx_frames"] == 1, "the first frame")
    if mode != lib.IO_MODE_POLL:
        wait_until(lambda: rig.stats.sleeps >= 1, "the thread never slept while idle")
        sleeps = rig.stats.sleeps
        time.sleep(0.05)
        assert rig.stats.sleeps - sleeps <= 1, "an idle thread with reads in flight spins"
    rig.backend_send([frame(1, 100)])
    wait_until(lambda: rig.count()["rx_frames"] == 2, "a frame while reads were in flight")
    assert rig.guest_receive() == [frame(0, 100), frame(1, 100)]


def test_stopped_thread_leaves_no_read_in_flight(rigs):
    """After the thread stops, a frame sent to the backend stays in the
    backend: no cancelled read still writes into the ring."""
    rig = rigs(slots=64, mode=lib.IO_MODE_EVENT)
    rig.start()
    rig.backend_send([frame(0, 80)])
    wait_until(lambda: rig.count()["rx_frames"] == 1, "the first frame")
    rig.stop()
    before = bytes(rig.mem)
    rig.backend_send([frame(1, 80)])
    time.sleep(0.05)
    assert bytes(rig.mem) == before, "a read wrote into the ring after the thread stopped"
    assert rig.host.recv(4096) == frame(1, 80)


def test_ring_refuses_registration_once_enabled_and_closes_without_a_trace():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds_before = sorted(os.listdir("/proc/self/fd"))
    out = ffi.new("struct tap_uring **")
    fds = ffi.new("int[]", [a.fileno()])
    err = lib.tap_uring_open(fds, 1, out)
    if err:
        pytest.skip(f"io_uring is not available here: {os.strerror(-err)}")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        more = (ctypes.c_int * 1)(b.fileno())
        ring = lib.tap_uring_fd(out[0])
        r = libc.syscall(_SYS_IO_URING_REGISTER, ring, _IORING_REGISTER_FILES, more, 1)
        assert r == -1 and ctypes.get_errno() == errno.EACCES
    finally:
        lib.tap_uring_close(out[0])
    assert sorted(os.listdir("/proc/self/fd")) == fds_before
    a.close()
    b.close()


def test_chain_arguments_are_checked():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    out = ffi.new("struct tap_uring **")
    err = lib.tap_uring_open(ffi.new("int[]", [a.fileno()]), 1, out)
    if err:
        pytest.skip(f"io_uring is not available here: {os.strerror(-err)}")
    try:
        buf = ffi.new("uint8_t[]", 64)
        bufs = ffi.new("void *[]", [buf])
        tags = ffi.new("uint32_t[]", [0])
        u = out[0]
        assert lib.tap_uring_read_chain(u, 1, bufs, tags, 1, 64) == -errno.EINVAL
        assert lib.tap_uring_read_chain(u, 0, bufs, tags, 0, 64) == -errno.EINVAL
        assert lib.tap_uring_read_chain(u, 0, bufs, tags, CHAIN + 1, 64) == -errno.EINVAL
        assert lib.tap_uring_read_chain(u, 0, bufs, tags, 1, 64) == 0
        assert lib.tap_uring_read_chain(u, 0, bufs, tags, 1, 64) == -errno.EBUSY
        assert lib.tap_uring_kick(u) == 0
        b.send(b"hello")
        tap, tag, res = ffi.new("uint32_t *"), ffi.new("uint32_t *"), ffi.new("int32_t *")
        deadline = time.monotonic() + 30
        while not lib.tap_uring_reap(u, tap, tag, res):
            assert time.monotonic() < deadline
            lib.tap_uring_kick(u)
            time.sleep(0.001)
        assert (tap[0], tag[0], res[0]) == (0, 0, 5) and ffi.buffer(buf, 5)[:] == b"hello"
        assert lib.tap_uring_inflight(u, 0) == 0
    finally:
        lib.tap_uring_close(out[0])
        a.close()
        b.close()


def test_more_taps_than_a_ring_serves_are_refused():
    out = ffi.new("struct tap_uring **")
    fds = ffi.new("int[]", [0] * (lib.TAP_URING_MAX_TAPS + 1))
    assert lib.tap_uring_open(fds, lib.TAP_URING_MAX_TAPS + 1, out) == -errno.EINVAL
    assert lib.tap_uring_open(fds, 0, out) == -errno.EINVAL


@pytest.mark.parametrize("seed", range(12))
def test_hostile_guest_never_makes_uring_reads_write_outside_the_hosts_fields(rigs, seed: int):
    """The guest scribbles over every field of its rings between passes,
    with reads in flight; the host only ever writes what it owns (RX
    lengths and data, RX prod, TX cons) and keeps serving."""
    rnd = random.Random(seed)
    slots = rnd.choice([2, 8, 64])
    rig = rigs(slots=slots)
    writable = rig.host_writable()
    seq = 0
    for _ in range(60):
        step = rnd.randrange(6)
        if step == 0:
            rig.rx.cons = rnd.choice([0, MASK, rnd.getrandbits(32), (int(rig.rx.prod) + 1) & MASK])
        elif step == 1:
            rig.rx.cons = int(rig.rx.prod)  # an honest guest: everything consumed
        elif step == 2:
            ring = rig.rx if rnd.random() < 0.5 else rig.tx
            field = rnd.choice(["slots", "slot_size", "cons_sleeping", "prod"])
            setattr(ring, field, rnd.getrandbits(32))
        elif step == 3:
            sizes = [rnd.choice([1, 60, SLOT_DATA, SLOT_DATA + 1, 4000]) for _ in range(5)]
            rig.backend_send([frame(seq + i, n) for i, n in enumerate(sizes)])
            seq += len(sizes)
        for _ in range(rnd.randrange(1, 4)):
            before = rig.mem.copy()
            rig.serve()
            changed = np.flatnonzero(rig.mem != before)
            outside = changed[~writable[changed]]
            assert outside.size == 0, f"the host wrote at {outside[:8]} (not its fields)"
    assert rig.guards_intact()
    rig.close()  # stops, cancels what is in flight, closes the ring: no hang
