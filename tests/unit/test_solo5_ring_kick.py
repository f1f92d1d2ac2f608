"""A kick of Solo5's ring served by the vCPU thread at its exit
(io_solo5_kick, csrc/iothread_solo5.c): everything submitted is answered
before the call returns, the ring is held by one side at a time, a kick
that meets the IO thread serving hands itself over through the kick
eventfd, and guest memory lost under the ring gives the ring back."""

from __future__ import annotations

import errno
import mmap
import os

import pytest

from pyvmm._native import ffi, lib
from testkit.iorig import IoRig, Solo5Rig
from testkit.native import lib as kit

READ, WRITE = lib.SOLO5_RING_OP_READ, lib.SOLO5_RING_OP_WRITE
ENTRIES = lib.SOLO5_RING_ENTRIES
BUF = 0x1000


@pytest.fixture
def rig():
    made = Solo5Rig(size=64 * 1024, kick=True)
    yield made
    made.close()


def kick_signalled(rig: IoRig) -> int:
    """What the kick eventfd holds (read, so cleared); 0: nothing."""
    try:
        return int.from_bytes(os.read(rig.kick, 8), "little")
    except BlockingIOError:
        return 0


def test_a_kick_answers_a_waiting_read_before_it_returns(rig):
    rig.peer.send(b"f" * 100)
    rig.submit(READ, BUF, 2048, 7)
    assert lib.io_solo5_kick(rig.io) == 1
    assert rig.ring.com_tail == 1 and rig.ring.ent_head == 1
    assert rig.commit(0) == (7, lib.HVT_RET_OK, 100)
    assert bytes(ffi.buffer(rig.mem + BUF, 100)) == b"f" * 100
    assert rig.counters.kicks_inline == 1 and rig.counters.kicks_passed == 0
    assert kick_signalled(rig) == 0  # the IO thread was not woken
    assert lib.pyvmm_guard_in_force() == 0  # the kick's guard is left


def test_a_read_with_no_frame_is_answered_again_at_once(rig):
    rig.submit(READ, BUF, 2048, 3)
    assert lib.io_solo5_kick(rig.io) == 1
    assert rig.commit(0) == (3, lib.HVT_RET_AGAIN, 0)
    assert rig.counters.reads_again == 1


def test_a_kick_with_nothing_submitted_is_still_counted(rig):
    assert lib.io_solo5_kick(rig.io) == 1
    assert rig.ring.ent_head == 0 and rig.ring.com_tail == 0
    assert rig.counters.kicks_inline == 1


def test_one_kick_serves_a_whole_ring_of_submissions_batch_after_batch():
    """More than one batch (IO_BATCH), up to every entry the ring holds:
    the guest is stopped in the kick's exit, so nothing else would serve
    what is left before it spins for it."""
    rig = Solo5Rig(size=64 * 1024, max_frame=2048)
    try:
        rig.mem[BUF : BUF + 60] = b"w" * 60
        for i in range(ENTRIES):
            rig.submit(WRITE, BUF, 60, i)
        assert lib.io_solo5_kick(rig.io) == 1
        assert rig.ring.ent_head == ENTRIES
        # Every entry went to the tap (the socketpair's queue is shorter than
        # the ring: what it refused is counted, never lost track of).
        c = rig.counters
        assert c.writes + c.write_failures == ENTRIES and c.writes > lib.IO_BATCH
        got = 0
        while True:
            try:
                got += len(rig.peer.recv(100)) == 60
            except BlockingIOError:
                break
        assert got == c.writes
    finally:
        rig.close()


def test_a_kick_stops_at_a_read_that_waits_for_commit_room(rig):
    """A full commit ring: the read waits (counted once), nothing behind it
    is served, and the guest kicks again once it took commits."""
    lib.io_solo5_set_indices(rig.io, 0, ENTRIES)  # every commit unread
    rig.ring.com_head = 0
    rig.submit(READ, BUF, 2048, 1)
    rig.submit(WRITE, BUF, 60, 2)
    assert lib.io_solo5_kick(rig.io) == 1
    assert rig.ring.ent_head == 0
    assert rig.counters.commit_stalls == 1


def test_the_kick_after_a_stall_serves_everything_again(rig):
    """The stall of the kick before does not cut the next one short: the
    read and every entry behind it (more than a batch) are served."""
    lib.io_solo5_set_indices(rig.io, 0, ENTRIES)
    rig.ring.com_head = 0
    rig.submit(READ, BUF, 2048, 1)
    assert lib.io_solo5_kick(rig.io) == 1
    assert rig.ring.ent_head == 0
    rig.ring.com_head = ENTRIES  # the guest took every commit
    rig.mem[BUF : BUF + 60] = b"w" * 60
    behind = lib.IO_BATCH + 10
    for i in range(behind):
        rig.submit(WRITE, BUF, 60, 10 + i)
    assert lib.io_solo5_kick(rig.io) == 1
    assert rig.ring.ent_head == 1 + behind
    assert rig.commit(0)[:2] == (1, lib.HVT_RET_AGAIN)


def test_a_kick_that_meets_the_ring_held_hands_itself_to_the_io_thread(rig):
    rig.submit(READ, BUF, 2048, 5)
    kit.io_test_solo5_hold(rig.io, 1)
    assert lib.io_solo5_kick(rig.io) == 0
    assert rig.ring.ent_head == 0  # not served here
    assert rig.counters.kicks_passed == 1 and rig.counters.kicks_inline == 0
    assert kick_signalled(rig) == 1
    kit.io_test_solo5_hold(rig.io, 0)
    assert lib.io_solo5_kick(rig.io) == 1
    assert rig.ring.ent_head == 1


def test_the_io_thread_leaves_a_held_ring_for_its_next_pass(rig):
    """Held by a kick being served: the pass serves nothing but reports work
    (so it looks again rather than sleeping), and the thread does not
    announce sleep on it."""
    rig.submit(READ, BUF, 2048, 5)
    kit.io_test_solo5_hold(rig.io, 1)
    assert kit.io_test_service(rig.io) == 1
    assert rig.ring.ent_head == 0
    assert kit.io_test_prepare_sleep(rig.io) == 0
    assert rig.ring.needs_kick == 0
    kit.io_test_solo5_hold(rig.io, 0)
    assert kit.io_test_service(rig.io) == 1
    assert rig.ring.ent_head == 1


def test_each_side_gives_the_ring_back():
    """After a kick, a pass, a sleep's announcement and a drain, the other
    side takes the ring: none of them keeps it."""
    rig = Solo5Rig(size=64 * 1024, kick=True)
    try:
        steps = [
            lambda: lib.io_solo5_kick(rig.io),
            lambda: kit.io_test_service(rig.io),
            lambda: kit.io_test_prepare_sleep(rig.io),
            lambda: kit.io_test_drain(rig.io),
        ]
        for step in steps:
            step()
            before = rig.counters.kicks_inline
            assert lib.io_solo5_kick(rig.io) == 1
            assert rig.counters.kicks_inline == before + 1
        assert rig.counters.kicks_passed == 0
    finally:
        rig.close()


def test_a_drain_on_a_held_ring_leaves_the_stall_to_the_kick(rig):
    """A drain that finds the ring held changes nothing (the kick being
    served drains it itself): the stalled read still lets the thread sleep.
    A drain on a free ring clears the stall, and the read keeps it awake."""
    lib.io_solo5_set_indices(rig.io, 0, ENTRIES)
    rig.ring.com_head = 0
    rig.submit(READ, BUF, 2048, 1)
    assert kit.io_test_service(rig.io) == 0  # stalls
    kit.io_test_solo5_hold(rig.io, 1)
    kit.io_test_drain(rig.io)
    kit.io_test_solo5_hold(rig.io, 0)
    assert kit.io_test_prepare_sleep(rig.io) == 1
    kit.io_test_drain(rig.io)
    assert kit.io_test_prepare_sleep(rig.io) == 0


def test_a_thread_that_serves_no_solo5_ring_refuses_a_kick():
    plain = IoRig()
    try:
        assert lib.io_solo5_kick(plain.io) == -errno.EINVAL
    finally:
        plain.close()


class _FileMemory:
    """Guest memory mapped from a file that can lose its pages (a restored
    snapshot's memory is such a mapping): a view over a memfd. Only C
    touches it once it may be gone."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("solo5-kick", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self._map = mmap.mmap(self.fd, size)
        self._buf = ffi.from_buffer(self._map)
        host = int(ffi.cast("uintptr_t", self._buf))
        self.view = ffi.new("struct pyvmm_guestmem *", {"host": host, "size": size})

    def close(self) -> None:
        del self._buf
        self._map.close()
        os.close(self.fd)


def test_memory_lost_under_the_ring_ends_the_kick_and_gives_the_ring_back():
    """The ring at the top of guest memory, above what the guest may use,
    as pyvmm places it: its pages gone, the kick ends with -EFAULT (the run
    then ends in one line) instead of the process, and the ring is free."""
    usable = 64 * 1024
    memory = _FileMemory(usable + 64 * 1024)
    rig = Solo5Rig(memory, usable=usable, max_frame=2048, kick=True)
    try:
        ring = ffi.cast("uint8_t *", memory.view.host) + usable
        assert lib.io_set_solo5_ring_view(rig.io, ring, memory.view, usable) == 0
        os.ftruncate(memory.fd, 0)  # every page of it gone
        assert lib.io_solo5_kick(rig.io) == -errno.EFAULT
        assert rig.counters.kicks_inline == 0
        assert lib.pyvmm_guard_in_force() == 0
        os.ftruncate(memory.fd, memory.size)  # back, zero-filled: nothing submitted
        assert lib.io_solo5_kick(rig.io) == 1
        assert rig.counters.kicks_inline == 1
    finally:
        rig.close()


def test_served_at_exit_the_guest_is_asked_to_kick_from_the_first_pass_on(rig):
    """Whatever the ring's flag said before (a restored ring's), a pass asks
    for kicks, and waking up does not take the request back: the guest
    never spins for a thread that may share its CPU."""
    assert lib.io_solo5_kicks_at_exit(rig.io) == 0
    assert rig.ring.needs_kick == 0
    kit.io_test_service(rig.io)
    assert rig.ring.needs_kick == 1
    kit.io_test_awake(rig.io)
    assert rig.ring.needs_kick == 1
    rig.ring.needs_kick = 0  # as a snapshot may have left it
    kit.io_test_solo5_hold(rig.io, 1)  # even a pass that finds the ring held
    kit.io_test_service(rig.io)
    kit.io_test_solo5_hold(rig.io, 0)
    assert rig.ring.needs_kick == 1


def test_served_by_the_thread_waking_up_takes_the_request_for_kicks_back(rig):
    kit.io_test_service(rig.io)
    assert rig.ring.needs_kick == 0
    assert kit.io_test_prepare_sleep(rig.io) == 1
    assert rig.ring.needs_kick == 1
    kit.io_test_awake(rig.io)
    assert rig.ring.needs_kick == 0


def test_kicks_at_exit_only_for_a_ring_and_before_the_thread_runs(rig):
    plain = IoRig()
    try:
        assert lib.io_solo5_kicks_at_exit(plain.io) == -errno.EINVAL
    finally:
        plain.close()
    rig.start()
    try:
        assert lib.io_solo5_kicks_at_exit(rig.io) == -errno.EBUSY
    finally:
        rig.stop()
