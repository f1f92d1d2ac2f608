"""Tap frame I/O (csrc/tap_io.c), the one copy the fast path, the IO
thread's services and TapBackend share, over socketpair "taps" (one frame
per read or write, no network at all).

Covered: a frame read and counted; no frame waiting is AGAIN and counted;
a frame longer than the buffer dropped and counted, never cut short; the
turn a reader gives after TAP_IO_TURN such drops (TapBackend too); an
empty datagram is a frame; a write counted, a runt dropped without
reaching the tap, a full tap dropped, any other failure reported and
counted apart; TapBackend raising the failure's errno.
"""

from __future__ import annotations

import errno
import os
import socket

import pytest

from pyvmm._native import ffi, lib
from pyvmm.devices.net.tap import TapBackend

TURN = lib.TAP_IO_TURN
NAMES = ("frames", "bytes", "again", "oversize", "failed", "errors")


class Tally:
    """A tap_io_tally whose every pointer has its own cell."""

    def __init__(self) -> None:
        self.cells = ffi.new("uint64_t[]", len(NAMES))
        self.c = ffi.new("struct tap_io_tally *", {n: self.cells + i for i, n in enumerate(NAMES)})

    def counts(self) -> dict[str, int]:
        return {n: int(self.cells[i]) for i, n in enumerate(NAMES)}

    def only(self, **expected: int) -> dict[str, int]:
        """The counts as they must be: the named ones, every other 0."""
        return {n: expected.get(n, 0) for n in NAMES}


@pytest.fixture
def pair():
    """(tap end, peer end): non-blocking SOCK_SEQPACKET, one frame per call."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a.setblocking(False)
    b.setblocking(False)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def read(fd: int, size: int, tally: Tally, one: bool = False) -> tuple[int, bytes | None]:
    buf = ffi.new("uint8_t[]", size + 16)
    ffi.buffer(buf)[:] = b"\xee" * (size + 16)
    length = ffi.new("uint32_t *", 0xFFFF_FFFF)
    call = lib.tap_io_read_one if one else lib.tap_io_read
    r = call(fd, buf, size, length, tally.c)
    # Nothing past the caller's buffer is touched, whatever came.
    assert bytes(ffi.buffer(buf + size, 16)) == b"\xee" * 16
    if r != lib.TAP_IO_FRAME:
        assert length[0] == 0xFFFF_FFFF  # no length for what is no frame
        return r, None
    return r, bytes(ffi.buffer(buf, length[0]))


def test_a_frame_is_read_and_counted(pair):
    tap, peer = pair
    tally = Tally()
    peer.send(b"frame-one")
    assert read(tap.fileno(), 100, tally) == (lib.TAP_IO_FRAME, b"frame-one")
    assert tally.counts() == tally.only(frames=1, bytes=9)


def test_no_frame_waiting_is_again_and_counted(pair):
    tap, _ = pair
    tally = Tally()
    assert read(tap.fileno(), 100, tally) == (lib.TAP_IO_AGAIN, None)
    assert tally.counts() == tally.only(again=1)


def test_a_frame_longer_than_the_buffer_is_dropped_never_cut_short(pair):
    tap, peer = pair
    tally = Tally()
    peer.send(b"L" * 101)
    peer.send(b"S" * 100)
    assert read(tap.fileno(), 100, tally, one=True) == (lib.TAP_IO_OVERSIZE, None)
    assert read(tap.fileno(), 100, tally, one=True) == (lib.TAP_IO_FRAME, b"S" * 100)
    assert tally.counts() == tally.only(frames=1, bytes=100, oversize=1)


def test_a_reader_gives_a_turn_after_so_many_drops(pair):
    tap, peer = pair
    tally = Tally()
    for _ in range(TURN + 3):
        peer.send(b"L" * 200)
    peer.send(b"short")
    assert read(tap.fileno(), 100, tally) == (lib.TAP_IO_AGAIN, None)
    assert tally.counts() == tally.only(oversize=TURN, again=1)
    assert read(tap.fileno(), 100, tally) == (lib.TAP_IO_FRAME, b"short")
    assert tally.counts() == tally.only(oversize=TURN + 3, again=1, frames=1, bytes=5)


def test_an_empty_datagram_is_a_frame_of_no_bytes(pair):
    tap, peer = pair
    tally = Tally()
    peer.send(b"")
    assert read(tap.fileno(), 100, tally) == (lib.TAP_IO_FRAME, b"")
    assert tally.counts() == tally.only(frames=1)


def test_a_read_that_fails_is_reported_and_counted_apart():
    tally = Tally()
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)  # not readable: EBADF
    try:
        assert read(null, 100, tally) == (lib.TAP_IO_FAILED, None)
    finally:
        os.close(null)
    assert ffi.errno == errno.EBADF
    assert tally.counts() == tally.only(errors=1)


def test_a_write_is_sent_and_counted(pair):
    tap, peer = pair
    tally = Tally()
    assert lib.tap_io_write(tap.fileno(), b"x" * 60, 60, 14, tally.c) == lib.TAP_IO_FRAME
    assert peer.recv(100) == b"x" * 60
    assert tally.counts() == tally.only(frames=1, bytes=60)


def test_a_runt_is_dropped_before_it_reaches_the_tap(pair):
    tap, peer = pair
    tally = Tally()
    assert lib.tap_io_write(tap.fileno(), b"x" * 13, 13, 14, tally.c) == lib.TAP_IO_DROPPED
    with pytest.raises(BlockingIOError):
        peer.recv(100)
    assert tally.counts() == tally.only(failed=1)
    # With no minimum, the same frame goes out.
    assert lib.tap_io_write(tap.fileno(), b"x" * 13, 13, 0, tally.c) == lib.TAP_IO_FRAME
    assert peer.recv(100) == b"x" * 13


def test_a_full_tap_drops_the_frame(pair):
    tap, _ = pair
    tally = Tally()
    sent = 0
    while lib.tap_io_write(tap.fileno(), b"f" * 1000, 1000, 0, tally.c) == lib.TAP_IO_FRAME:
        sent += 1
        assert sent < 1_000_000, "the peer's queue never filled"
    assert tally.counts() == tally.only(frames=sent, bytes=1000 * sent, failed=1)


def test_any_other_write_failure_is_reported_and_counted_apart(pair):
    tap, peer = pair
    tally = Tally()
    peer.close()
    assert lib.tap_io_write(tap.fileno(), b"x" * 60, 60, 14, tally.c) == lib.TAP_IO_FAILED
    assert ffi.errno == errno.EPIPE
    assert tally.counts() == tally.only(errors=1)


def test_tap_backend_reads_and_gives_a_turn_as_the_fast_path(pair):
    tap_end, peer = pair
    tap = TapBackend(os.dup(tap_end.fileno()), "t0", 1500)
    try:
        for _ in range(TURN + 1):
            peer.send(b"L" * 200)
        peer.send(b"short")
        buf = bytearray(100)
        assert tap.read_into(buf) is None
        assert tap.rx_dropped == TURN
        assert tap.read_into(memoryview(buf)) == 5
        assert bytes(buf[:5]) == b"short"
        assert tap.rx_dropped == TURN + 1
        assert tap.read_into(buf) is None
    finally:
        tap.close()


def test_tap_backend_write_drops_or_raises_the_errno(pair):
    tap_end, peer = pair
    tap = TapBackend(os.dup(tap_end.fileno()), "t0", 1500)
    try:
        assert tap.write(b"x" * 60) is True
        assert peer.recv(100) == b"x" * 60
        assert tap.write(memoryview(b"x" * 5)) is False
        assert tap.tx_dropped == 1
        peer.close()
        with pytest.raises(OSError) as failure:
            tap.write(b"x" * 60)
        assert failure.value.errno == errno.EPIPE
        assert tap.tx_dropped == 1
    finally:
        tap.close()
