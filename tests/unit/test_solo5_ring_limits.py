"""The Solo5-ring service's limits, driven through io_test_service on the
calling thread with a real GuestMemory view: a READ submission (the host
writes) into the low area or a read-only range is a bad entry, committed
EINVAL like one outside memory, and leaves that memory alone; a WRITE may
come from anywhere in memory but not be longer than the tap's largest
frame; a frame longer than a READ's buffer is dropped and counted, never
committed cut short (as the hypercall path does; a security review found
each of these open)."""

from __future__ import annotations

import pytest

from pyvmm._native import lib
from pyvmm.kvm.memory import GuestMemory, Protection
from testkit.iorig import Solo5Rig
from testkit.native import lib as kit

MIB = 1 << 20
LOW = lib.PYVMM_LOW_AREA_END
RO = 0x180000  # one read-only page
BUF = 0x200000  # ordinary guest memory
MAX_FRAME = 1514


def guest_memory_rig() -> Solo5Rig:
    """Solo5's ring over a real GuestMemory with a read-only page, the
    guest's first 3 MiB of it usable, taps' frames up to MAX_FRAME."""
    mem = GuestMemory(4 * MIB)
    mem.protect(RO, 0x1000, Protection(read=True, write=False))
    return Solo5Rig(mem, usable=3 * MIB, max_frame=MAX_FRAME)


@pytest.fixture
def rig():
    r = guest_memory_rig()
    yield r
    r.close()


@pytest.mark.parametrize(
    "gpa,length",
    [
        (0x8000, 2048),  # a page table
        (0x10000, 64),  # the boot info
        (LOW - 16, 64),  # straddles the end of the low area
        (RO, 64),  # a read-only page
        (3 * MIB - 16, 64),  # past usable memory (the ring area)
    ],
)
def test_a_read_into_memory_the_host_may_not_write_is_a_bad_entry(rig, gpa, length):
    before = rig.mem.read(gpa, min(length, 3 * MIB - gpa))
    rig.peer.send(b"x" * 60)
    rig.submit(lib.SOLO5_RING_OP_READ, gpa, length, 7)
    assert kit.io_test_service(rig.io) == 1
    assert rig.commit(0) == (7, lib.HVT_RET_EINVAL, 0)
    assert rig.counters.bad_entries == 1 and rig.counters.reads == 0
    assert rig.mem.read(gpa, len(before)) == before
    # The frame is still there for a good read.
    rig.submit(lib.SOLO5_RING_OP_READ, BUF, 2048, 8)
    kit.io_test_service(rig.io)
    assert rig.commit(1) == (8, lib.HVT_RET_OK, 60)


def test_a_write_may_come_from_the_low_area(rig):
    rig.submit(lib.SOLO5_RING_OP_WRITE, 0x10000, 64)
    assert kit.io_test_service(rig.io) == 1
    assert rig.counters.writes == 1 and rig.counters.bad_entries == 0
    assert len(rig.peer.recv(4096)) == 64


def test_a_write_longer_than_the_largest_frame_is_a_bad_entry(rig):
    rig.submit(lib.SOLO5_RING_OP_WRITE, BUF, MAX_FRAME + 1)
    rig.submit(lib.SOLO5_RING_OP_WRITE, BUF, MAX_FRAME)
    assert kit.io_test_service(rig.io) == 2
    assert rig.counters.bad_entries == 1 and rig.counters.writes == 1
    assert len(rig.peer.recv(4096)) == MAX_FRAME
    with pytest.raises(BlockingIOError):
        rig.peer.recv(4096)


def test_a_frame_longer_than_the_read_buffer_is_dropped_not_cut(rig):
    rig.peer.send(b"L" * 200)
    rig.peer.send(b"s" * 50)
    rig.submit(lib.SOLO5_RING_OP_READ, BUF, 100, 1)
    rig.submit(lib.SOLO5_RING_OP_READ, BUF + 4096, 100, 2)
    kit.io_test_service(rig.io)
    assert rig.commit(0) == (1, lib.HVT_RET_OK, 50)
    assert rig.mem.read(BUF, 50) == b"s" * 50
    assert rig.commit(1) == (2, lib.HVT_RET_AGAIN, 0)
    assert rig.counters.read_drops_oversize == 1
    assert rig.counters.reads == 1 and rig.counters.bad_entries == 0


def test_a_read_of_exactly_the_buffer_size_is_delivered(rig):
    rig.peer.send(b"e" * 100)
    rig.submit(lib.SOLO5_RING_OP_READ, BUF, 100, 3)
    kit.io_test_service(rig.io)
    assert rig.commit(0) == (3, lib.HVT_RET_OK, 100)
    assert rig.counters.read_drops_oversize == 0
