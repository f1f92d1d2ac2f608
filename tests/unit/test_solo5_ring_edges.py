"""Solo5's ring at its edges, one step of the IO thread at a time: a pass
holds to its batch, a full commit ring stalls reads until a wake-up, the
thread agrees to sleep only when no work can progress, and handles and
descriptors at their limits are checked before they are used."""

from __future__ import annotations

import os
import socket

import pytest

from pyvmm._native import ffi, lib
from testkit.iorig import Solo5Rig
from testkit.native import lib as kit

READ, WRITE = lib.SOLO5_RING_OP_READ, lib.SOLO5_RING_OP_WRITE
ENTRIES = 1024
#: The lingering window of the tests that expect the thread to linger: long
#: enough that no preemption between two steps can close it.
LONG_LINGER_NS = 60 * 10**9


@pytest.fixture
def rig():
    """Unpinned: the thread never lingers, so each step says only what the
    ring's state calls for."""
    made = Solo5Rig(size=64 * 1024)
    yield made
    made.close()


def room_for_commits(rig: Solo5Rig, free: int) -> None:
    """The commit ring with ``free`` slots the guest has not yet given back."""
    assert lib.io_solo5_set_indices(rig.io, 0, ENTRIES - free) == 0
    rig.ring.com_head = 0


def test_a_pass_serves_at_most_a_batch():
    rig = Solo5Rig(size=64 * 1024, max_frame=2048)
    try:
        rig.mem[0x1000 : 0x1000 + 60] = b"b" * 60
        for i in range(lib.IO_BATCH + 1):
            rig.submit(WRITE, 0x1000, 60, i)
        assert rig.serve() == lib.IO_BATCH
        assert rig.ring.ent_head == lib.IO_BATCH
        assert rig.serve() == 1
    finally:
        rig.close()


def test_a_broken_entry_tail_is_no_work_and_counted(rig):
    rig.ring.ent_tail = ENTRIES + 1  # more submissions than the ring holds
    assert rig.serve() == 0
    assert rig.counters.bad_index == 1
    assert rig.ring.ent_head == 0
    assert kit.io_test_prepare_sleep(rig.io) == 1  # nothing that can progress


def test_nothing_pending_lets_the_thread_sleep_and_asks_for_a_kick(rig):
    assert kit.io_test_prepare_sleep(rig.io) == 1
    assert rig.ring.needs_kick == 1


def test_a_pending_entry_keeps_the_thread_awake(rig):
    rig.submit(READ, 0x1000, 2048, 1)
    assert kit.io_test_prepare_sleep(rig.io) == 0


def test_a_ring_full_of_pending_entries_keeps_the_thread_awake(rig):
    for i in range(ENTRIES):
        rig.submit(WRITE, 0x1000, 60, i)
    assert rig.ring.ent_tail - rig.ring.ent_head == ENTRIES
    assert kit.io_test_prepare_sleep(rig.io) == 0


def test_reads_wait_for_commit_room_asleep_until_a_wake_up(rig):
    """A full commit ring: the read is left for later (counted once), the
    thread may sleep on it (the guest kicks once it has taken commits),
    and after the wake-up's drain the same read keeps it awake again."""
    room_for_commits(rig, 0)
    rig.submit(READ, 0x1000, 2048, 5)
    assert rig.serve() == 0
    assert rig.counters.commit_stalls == 1 and rig.counters.bad_index == 0
    assert rig.ring.ent_head == 0
    assert kit.io_test_prepare_sleep(rig.io) == 1
    rig.ring.com_head = 1  # the guest took a commit, then kicked
    kit.io_test_drain(rig.io)
    assert kit.io_test_prepare_sleep(rig.io) == 0
    assert rig.serve() == 1
    assert rig.commit((ENTRIES) % ENTRIES)[:2] == (5, lib.HVT_RET_AGAIN)


def test_a_commit_head_past_the_tail_is_a_broken_index_and_stalls(rig):
    assert lib.io_solo5_set_indices(rig.io, 0, 0) == 0
    rig.ring.com_head = 1  # the guest says it took a commit never made
    rig.submit(READ, 0x1000, 2048, 1)
    assert rig.serve() == 0
    assert rig.counters.bad_index == 1 and rig.counters.commit_stalls == 0
    assert kit.io_test_prepare_sleep(rig.io) == 1


def test_pinned_to_cpu_0_the_thread_lingers_after_a_read():
    """CPU 0 is a CPU of its own like any other: lingering and hybrid's
    idle polling are on."""
    rig = Solo5Rig(size=64 * 1024, cpu=0)
    kit.io_test_solo5_linger(rig.io, LONG_LINGER_NS)
    try:
        assert kit.io_test_idle_poll(rig.io) == 1
        rig.submit(READ, 0x1000, 2048, 1)
        assert rig.serve() == 1
        rig.ring.com_head = 1
        assert kit.io_test_prepare_sleep(rig.io) == 0  # lingering
        assert rig.ring.needs_kick == 0
    finally:
        rig.close()


def test_unpinned_the_thread_neither_lingers_nor_polls_idle(rig):
    assert kit.io_test_idle_poll(rig.io) == 0
    rig.submit(READ, 0x1000, 2048, 1)
    assert rig.serve() == 1
    rig.ring.com_head = 1
    assert kit.io_test_prepare_sleep(rig.io) == 1


def test_a_stall_ends_the_lingering_at_once():
    """Pinned, reads committed and then one stalled in the same pass: the
    thread sleeps on it rather than linger on a ring that cannot move."""
    rig = Solo5Rig(size=64 * 1024, cpu=1)
    kit.io_test_solo5_linger(rig.io, LONG_LINGER_NS)
    try:
        rig.submit(READ, 0x1000, 2048, 1)
        assert rig.serve() == 1
        room_for_commits(rig, 1)
        rig.submit(READ, 0x1000, 2048, 2)
        rig.submit(READ, 0x1000, 2048, 3)
        assert rig.serve() == 1  # the first committed, the second stalls
        assert rig.counters.commit_stalls == 1
        assert kit.io_test_prepare_sleep(rig.io) == 1
    finally:
        rig.close()


@pytest.mark.parametrize("handle", [lib.MFT_MAX_ENTRIES, 2**31, 2**32 - 1])
def test_a_write_on_a_handle_past_the_table_is_a_bad_entry(rig, handle):
    rig.mem[0x1000 : 0x1000 + 60] = b"h" * 60
    rig.submit(WRITE, 0x1000, 60, 1, handle=handle)
    assert rig.serve() == 1
    assert rig.counters.bad_entries == 1 and rig.counters.writes == 0


def test_attaching_a_handle_past_the_table_is_refused(rig):
    host, _ = rig.tap()
    for handle in (lib.MFT_MAX_ENTRIES, lib.MFT_MAX_ENTRIES + 1, 2**32 - 1):
        assert lib.io_solo5_attach_tap(rig.io, handle, host.fileno(), 2048) == -22  # EINVAL
    assert lib.io_solo5_attach_tap(rig.io, lib.MFT_MAX_ENTRIES - 1, host.fileno(), 2048) == 0


def test_a_tap_on_descriptor_0_is_served():
    """fd 0 is a descriptor like any other: pyvmm started with stdin closed
    gets its first tap there."""
    saved = os.dup(0)
    host, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    rig = None
    try:
        os.dup2(host.fileno(), 0)
        rig = Solo5Rig(size=64 * 1024)
        assert lib.io_solo5_attach_tap(rig.io, 2, 0, 2048) == 0
        rig.mem[0x1000 : 0x1000 + 5] = b"fd-0!"
        rig.submit(WRITE, 0x1000, 5, 1, handle=2)
        peer.send(b"in-0")
        rig.submit(READ, 0x2000, 2048, 2, handle=2)
        assert rig.serve() == 2
        assert peer.recv(100) == b"fd-0!"
        assert rig.commit(0) == (2, lib.HVT_RET_OK, 4)
        assert bytes(ffi.buffer(rig.mem + 0x2000, 4)) == b"in-0"
        assert rig.counters.bad_entries == 0
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        if rig is not None:
            rig.close()
        host.close()
        peer.close()


def test_a_ring_full_of_submissions_is_served_not_broken(rig):
    rig.mem[0x1000 : 0x1000 + 60] = b"f" * 60
    for i in range(ENTRIES):
        rig.submit(WRITE, 0x1000, 60, i)
    assert rig.serve() == lib.IO_BATCH
    assert rig.counters.bad_index == 0 and rig.counters.writes == lib.IO_BATCH


def test_a_broken_entry_tail_ends_the_lingering_at_once():
    rig = Solo5Rig(size=64 * 1024, cpu=1)
    kit.io_test_solo5_linger(rig.io, LONG_LINGER_NS)
    try:
        rig.submit(READ, 0x1000, 2048, 1)
        assert rig.serve() == 1
        rig.ring.com_head = 1
        rig.ring.ent_tail = 2 + ENTRIES
        assert rig.serve() == 0
        assert kit.io_test_prepare_sleep(rig.io) == 1
    finally:
        rig.close()


def test_a_read_on_a_handle_past_the_table_is_invalid(rig):
    rig.submit(READ, 0x1000, 2048, 9, handle=lib.MFT_MAX_ENTRIES)
    assert rig.serve() == 1
    assert rig.commit(0) == (9, lib.HVT_RET_EINVAL, 0)
    assert rig.counters.bad_entries == 1 and rig.counters.reads == 0


def test_an_unknown_operation_is_a_bad_entry_and_gets_no_commit(rig):
    rig.submit(7, 0x1000, 60, 1)
    assert rig.serve() == 1
    assert rig.counters.bad_entries == 1
    assert rig.ring.com_tail == 0 and rig.ring.ent_head == 1


def test_a_commit_clears_its_reserved_word(rig):
    """The commit slot is the guest's memory: whatever was left in it, the
    commit the guest reads is whole and its reserved word 0."""
    for i in range(2):
        rig.ring.com[i].reserved = 0xFFFFFFFF
        rig.ring.com[i].len = 0xFFFFFFFF
    rig.peer.send(b"x" * 10)
    rig.submit(READ, 0x1000, 2048, 1)
    rig.submit(READ, 0x1000, 2048, 2)
    assert rig.serve() == 2
    assert [(rig.ring.com[i].len, rig.ring.com[i].reserved) for i in range(2)] == [(10, 0), (0, 0)]


def test_a_ring_s_own_indices_are_where_its_service_starts(rig):
    """A ring that is already in use when it is given to the thread (a
    restored guest's memory holds it) is served from its own indices."""
    start = 7
    rig.ring.ent_head = rig.ring.ent_tail = start
    rig.ring.com_tail = rig.ring.com_head = start
    assert lib.io_set_solo5_ring_view(rig.io, rig.ring, rig.view, 64 * 1024) == 0
    assert lib.io_solo5_attach_tap(rig.io, 1, rig.host.fileno(), 2048) == 0
    rig.peer.send(b"resumed")
    rig.submit(READ, 0x1000, 2048, 70)
    assert rig.serve() == 1
    assert rig.commit(start) == (70, lib.HVT_RET_OK, 7)
    head, tail = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    assert lib.io_solo5_indices(rig.io, head, tail) == 0
    assert (head[0], tail[0]) == (start + 1, start + 1)


def test_a_running_thread_takes_no_new_tap_or_indices(rig):
    rig.start()
    try:
        host, _ = rig.tap()
        assert lib.io_solo5_attach_tap(rig.io, 2, host.fileno(), 2048) == -22  # EINVAL
        assert lib.io_solo5_set_indices(rig.io, 5, 5) == -16  # EBUSY
    finally:
        rig.stop()
