"""The IO thread serving Solo5's ring in event and hybrid mode, on a CPU of its own
(--pin), stays awake for a moment after a read: a Solo5 guest reads
synchronously (it spins for each commit, then submits the next read), so
sleeping at once after every read made every frame cost the guest a kick
and this thread a wake-up. Unpinned it sleeps at once, as before: there
the kick's wake-up is what gets it onto a CPU the guest may share."""

from __future__ import annotations

import os
import time

from pyvmm._native import lib
from testkit.iorig import Solo5Rig

FRAMES = 200
BUF = 0x1000


def guest_reads(rig: Solo5Rig, count: int, first: int = 0) -> tuple[int, list]:
    """Reads (first) to (first + count - 1) as Solo5's bindings do: submit,
    kick only when the thread asked for it, spin for the commit (kicking
    again if a kick was missed). The kicks made, and the commits."""
    kicks, commits = 0, []
    for i in range(first, first + count):
        rig.submit(lib.SOLO5_RING_OP_READ, BUF, 2048, i)
        if rig.ring.needs_kick:
            os.eventfd_write(rig.kick, 1)
            kicks += 1
        deadline = time.monotonic() + 5.0
        last_kick = time.monotonic()
        while rig.ring.com_tail == i:
            now = time.monotonic()
            assert now < deadline, f"read {i} never committed"
            if rig.ring.needs_kick and now - last_kick > 0.01:
                os.eventfd_write(rig.kick, 1)
                kicks += 1
                last_kick = now
        commits.append(rig.commit(i))
        rig.ring.com_head = i + 1
    return kicks, commits


def test_back_to_back_reads_need_few_kicks_and_arrive_in_order():
    rig = Solo5Rig(size=64 * 1024, kick=True, cpu=1)
    try:
        for i in range(FRAMES):
            rig.peer.send(b"frame-%04d" % i)
        rig.start()
        kicks, commits = guest_reads(rig, FRAMES)
        rig.stop()
        assert commits == [(i, lib.HVT_RET_OK, 10) for i in range(FRAMES)]
        assert rig.counters.reads == FRAMES
        # Sleeping after each read would take a kick per read; this test's
        # reads follow each other within tens of microseconds.
        assert kicks < FRAMES // 4, f"{kicks} kicks for {FRAMES} reads"
    finally:
        rig.close()


def test_unpinned_the_thread_sleeps_after_every_read():
    rig = Solo5Rig(size=64 * 1024, kick=True)
    try:
        for i in range(FRAMES):
            rig.peer.send(b"frame-%04d" % i)
        rig.start()
        kicks, commits = guest_reads(rig, FRAMES)
        rig.stop()
        assert commits == [(i, lib.HVT_RET_OK, 10) for i in range(FRAMES)]
        assert kicks > FRAMES // 2, f"{kicks} kicks for {FRAMES} reads"
    finally:
        rig.close()


def test_the_thread_sleeps_again_once_reads_stop():
    rig = Solo5Rig(size=64 * 1024, kick=True, cpu=1)
    try:
        rig.peer.send(b"one")
        rig.start()
        kicks, commits = guest_reads(rig, 2)
        assert commits == [(0, lib.HVT_RET_OK, 3), (1, lib.HVT_RET_AGAIN, 0)]
        deadline = time.monotonic() + 5.0
        while not rig.ring.needs_kick:
            assert time.monotonic() < deadline, "the thread never announced sleep"
            time.sleep(0.001)
        sleeps = rig.stats.sleeps
        time.sleep(0.05)
        # Asleep: no passes, no new sleeps, until the next kick.
        assert rig.stats.sleeps == sleeps
        rig.peer.send(b"two")
        kicks, commits = guest_reads(rig, 1, first=2)
        assert commits == [(2, lib.HVT_RET_OK, 3)] and kicks >= 1
    finally:
        rig.close()


def hybrid_reads(cpu: int) -> tuple[int, int, int]:
    """FRAMES back-to-back reads in hybrid mode with a long budget: the
    kicks they took, the thread's idle polling passes and its sleeps."""
    rig = Solo5Rig(size=64 * 1024, kick=True, cpu=cpu, mode=lib.IO_MODE_HYBRID, budget_us=50_000)
    try:
        for i in range(FRAMES):
            rig.peer.send(b"frame-%04d" % i)
        rig.start()
        kicks, commits = guest_reads(rig, FRAMES)
        rig.stop()
        assert commits == [(i, lib.HVT_RET_OK, 10) for i in range(FRAMES)]
        return kicks, rig.stats.idle_spins, rig.stats.sleeps
    finally:
        rig.close()


def test_unpinned_hybrid_sleeps_at_once_as_event_mode_does():
    """Its idle polling would share a CPU with a guest spinning for each
    commit: unpinned, hybrid never polls idle, whatever its budget."""
    kicks, idle_spins, sleeps = hybrid_reads(cpu=-1)
    assert idle_spins == 0, f"{idle_spins} idle polling passes"
    assert kicks > FRAMES // 2 and sleeps > FRAMES // 2, (kicks, sleeps)


def test_pinned_hybrid_polls_through_its_budget():
    kicks, idle_spins, sleeps = hybrid_reads(cpu=1)
    assert idle_spins > 0
    # A 50 ms budget outlasts the gaps between these reads: no sleep, no
    # kick, but the first (the thread starts asleep) and maybe a missed one.
    assert kicks < FRAMES // 4 and sleeps < FRAMES // 4, (kicks, sleeps)
