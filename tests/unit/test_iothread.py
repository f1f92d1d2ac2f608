"""The native shmstream IO thread (csrc/iothread.c), with socketpair backends.

A non-blocking AF_UNIX SOCK_SEQPACKET socketpair stands in for the tap (one
frame per read or write); the "guest" is this test, driving its side of the
rings with the same shm_test_* operations the guest driver compiles.  The
rings live inside one buffer between guard areas, so any host write outside
the ring, or into a part of the ring the host does not own, shows (the rig:
testkit/iorig.py's ShmRig).

Covered: one pass of the services (io_test_service) moving frames both ways intact and in batches of
IO_BATCH; exact drop accounting (full RX ring, oversize frames, bad TX
lengths, a backend that refuses frames, empty reads); an exact model of
a pass run against a hostile guest scribbling over every field of the
shared rings; notification counting, one wake-up per io_arm_wake, and the
wake eventfd; the three threaded modes moving every frame in order, never
dropping a frame that found room, sleeping despite hostile indices or a
hung-up backend, draining TX at stop and stopping promptly even when busy;
io_add_link's argument checks.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
from collections import deque

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pyvmm._native import ffi, lib
from pyvmm.vm.stats import drop_counters
from testkit.iorig import BAD, COUNTERS, MASK, NEAR_WRAP, OFF_CONS, OFF_PROD, SLOT_DATA, SLOT_SIZE
from testkit.iorig import ShmRig as Rig
from testkit.native import lib as kit

BATCH = lib.IO_BATCH
MODES = {"poll": lib.IO_MODE_POLL, "event": lib.IO_MODE_EVENT, "hybrid": lib.IO_MODE_HYBRID}

# Ring field offsets, from the header via cffi rather than hand-computed.
OFF_SLEEPING = ffi.offsetof("struct shm_ring", "cons_sleeping")
OFF_SLOTS = ffi.offsetof("struct shm_ring", "slots")
OFF_SLOT_SIZE = ffi.offsetof("struct shm_ring", "slot_size")

_PATTERN = bytes(i % 251 for i in range(2 * SLOT_DATA + 70000))


def frame(seq: int, length: int) -> bytes:
    """Frame number seq: its number, then a pattern that depends on it."""
    head = seq.to_bytes(8, "little")
    return (head + _PATTERN[seq % 251 : seq % 251 + length])[:length]


def wait_until(condition, what: str, seconds: float = 30.0) -> None:
    """Wait for ``condition()`` to hold; fail after ``seconds``. The bound
    only catches a hang: a loaded machine is slow, never wrong."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds} s")
        time.sleep(0.002)


def asleep(rig) -> bool:
    """The IO thread is in its sleep (epoll) now: it counted a sleep, and
    counts neither spins nor passes while we look twice."""
    s = rig.stats
    before = (s.sleeps, s.wakeups, s.idle_spins, s.busy_passes)
    time.sleep(0.01)
    return s.sleeps >= 1 and before == (s.sleeps, s.wakeups, s.idle_spins, s.busy_passes)


# How long an idle thread is watched for spinning: an observation window,
# not a deadline (a loaded machine can only make it count less).
WATCH = 0.3


def eventfd_count(fd: int) -> int:
    """Read and reset a non-blocking eventfd; 0 if it was not signalled."""
    try:
        return os.eventfd_read(fd)
    except BlockingIOError:
        return 0


@pytest.fixture
def rigs():
    """Rig factory; every rig is stopped and destroyed at teardown."""
    made: list[Rig] = []

    def make(*args, **kwargs) -> Rig:
        rig = Rig(*args, **kwargs)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


# -- one pass: moving frames ---------------------------------------------------


@given(
    rx_lengths=st.lists(st.integers(1, SLOT_DATA), max_size=20),
    tx_lengths=st.lists(st.integers(1, SLOT_DATA), max_size=20),
)
@settings(max_examples=30, deadline=None)
def test_service_moves_frames_both_ways_with_contents_and_lengths_intact(
    rx_lengths: list[int], tx_lengths: list[int]
):
    rig = Rig(slots=32)
    try:
        rx_frames = [frame(i, n) for i, n in enumerate(rx_lengths)]
        tx_frames = [frame(1000 + i, n) for i, n in enumerate(tx_lengths)]
        rig.backend_send(rx_frames)
        assert rig.guest_send(tx_frames) == len(tx_frames)
        rig.service_until_idle()
        assert rig.guest_receive() == rx_frames
        assert rig.backend_receive() == tx_frames
        c = rig.count()
        assert c["rx_frames"] == len(rx_frames)
        assert c["rx_bytes"] == sum(rx_lengths)
        assert c["tx_frames"] == len(tx_frames)
        assert c["tx_bytes"] == sum(tx_lengths)
        assert rig.tx.cons == rig.tx_prod, "TX slots not given back"
        assert rig.rx.prod == (NEAR_WRAP + len(rx_frames)) & MASK
        drops = ("rx_drops_full", "rx_drops_oversize", "tx_drops_bad_len", "tx_drops_backend")
        assert all(c[name] == 0 for name in drops)
        assert c["rx_bad_index"] == c["tx_bad_index"] == 0
        assert rig.guards_intact()
    finally:
        rig.close()


def test_frames_of_exactly_one_slot_and_of_one_byte_pass(rigs):
    rig = rigs(slots=4)
    frames = [frame(1, SLOT_DATA), frame(2, 1), frame(3, SLOT_DATA)]
    rig.backend_send(frames)
    rig.guest_send(frames)
    rig.service_until_idle()
    assert rig.guest_receive() == frames
    assert rig.backend_receive() == frames


def test_more_frames_than_a_batch_move_in_batches_of_io_batch(rigs):
    rig = rigs(slots=256)
    n = 3 * BATCH + 5
    rx_frames = [frame(i, 1 + i % 200) for i in range(n)]
    tx_frames = [frame(5000 + i, 1 + i % 300) for i in range(n)]
    rig.backend_send(rx_frames)
    assert rig.guest_send(tx_frames) == n

    assert kit.io_test_service(rig.io) == 2 * BATCH  # one batch each way
    c = rig.count()
    assert c["rx_frames"] == BATCH and c["tx_frames"] == BATCH
    assert rig.rx.prod == (NEAR_WRAP + BATCH) & MASK, "RX published once per batch"
    assert rig.tx.cons == (NEAR_WRAP + BATCH) & MASK, "TX released once per batch"

    passes = 1 + rig.service_until_idle()
    assert passes == 4
    assert rig.guest_receive() == rx_frames
    assert rig.backend_receive() == tx_frames
    c = rig.count()
    assert c["rx_frames"] == c["tx_frames"] == n
    assert c["notify_suppressed"] == 4  # one per RX batch, guest awake


@pytest.mark.parametrize("slots, extra", [(1, 3), (8, 13), (64, 100)])
def test_full_rx_ring_drops_and_counts_exactly(rigs, slots: int, extra: int):
    rig = rigs(slots=slots)
    n = slots + extra
    frames = [frame(i, 1 + (i * 53) % SLOT_DATA) for i in range(n)]
    rig.backend_send(frames)
    rig.service_until_idle()  # returns: a full ring never blocks the host

    c = rig.count()
    assert c["rx_frames"] == slots
    assert c["rx_drops_full"] == n - slots
    assert c["rx_bytes"] == sum(len(f) for f in frames[:slots])
    with pytest.raises(BlockingIOError):
        rig.host.recv(1)  # every frame was read from the backend
    assert rig.guest_receive() == frames[:slots], "the first frames are the ones kept"

    # Room again: delivery resumes, nothing else dropped.
    later = [frame(10_000 + i, 100) for i in range(slots)]
    rig.backend_send(later)
    rig.service_until_idle()
    assert rig.guest_receive() == later
    assert rig.count()["rx_drops_full"] == n - slots
    assert rig.guards_intact()


def test_rx_pass_that_only_drops_neither_notifies_nor_counts_a_batch(rigs):
    rig = rigs(slots=2)
    rig.backend_send([frame(i, 10) for i in range(2)])
    rig.service_until_idle()
    assert kit.shm_test_cons_prepare_sleep(rig.rx, rig.rx_cons, rig.slots) == 0  # frames wait
    rig.rx.cons_sleeping = 1  # a guest that sleeps anyway
    before = rig.count()
    rig.backend_send([frame(i, 10) for i in range(5)])
    rig.service_until_idle()
    after = rig.count()
    assert after["rx_drops_full"] == 5
    assert after["notify_sent"] == before["notify_sent"]
    assert after["notify_suppressed"] == before["notify_suppressed"]
    assert eventfd_count(rig.wake) == 0


def test_oversize_frames_are_counted_and_not_delivered(rigs):
    rig = rigs(slots=8)
    sizes = [10, SLOT_DATA + 1, SLOT_DATA, 5000, 20, 65536 + SLOT_DATA + 100, 1]
    frames = [frame(i, n) for i, n in enumerate(sizes)]
    rig.backend_send(frames)
    rig.service_until_idle()
    good = [f for f in frames if len(f) <= SLOT_DATA]
    assert rig.guest_receive() == good
    c = rig.count()
    assert c["rx_drops_oversize"] == 3
    assert c["rx_frames"] == len(good)
    assert c["rx_bytes"] == sum(map(len, good))
    assert rig.rx.prod == (NEAR_WRAP + len(good)) & MASK, "an oversize frame took a slot"
    assert rig.guards_intact()


def test_tx_slots_with_bad_length_are_dropped_counted_and_skipped(rigs):
    rig = rigs(slots=16)
    bad_lengths = [0, SLOT_DATA + 1, 0xFFFFFFFF, 2**31, SLOT_SIZE]
    good = [frame(i, 1 + i * 100) for i in range(len(bad_lengths) + 1)]
    rig.guest_send(good[:1])
    index = rig.tx_prod
    # interleave: good, bad, good, bad, ..., good
    for k, bad in enumerate(bad_lengths):
        slot = rig.tx_slot(index)
        slot.len = bad
        index = (index + 1) & MASK
        slot = rig.tx_slot(index)
        ffi.memmove(slot.data, good[k + 1], len(good[k + 1]))
        slot.len = len(good[k + 1])
        index = (index + 1) & MASK
    rig.tx_prod = index
    kit.shm_test_prod_publish(rig.tx, index)

    rig.service_until_idle()
    assert rig.backend_receive() == good
    c = rig.count()
    assert c["tx_drops_bad_len"] == len(bad_lengths)
    assert c["tx_frames"] == len(good)
    assert c["tx_bytes"] == sum(map(len, good))
    assert rig.tx.cons == rig.tx_prod, "bad slots are consumed, not retried"


def test_tx_frames_the_backend_refuses_are_counted_not_retried(rigs):
    rig = rigs(slots=64)
    rig.host.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    frames = [frame(i, SLOT_DATA) for i in range(40)]
    assert rig.guest_send(frames) == 40
    rig.service_until_idle()  # never blocks on the full socket
    c = rig.count()
    assert c["tx_drops_backend"] > 0
    assert c["tx_frames"] + c["tx_drops_backend"] == 40
    received = rig.backend_receive()
    assert received == frames[: c["tx_frames"]]
    assert rig.tx.cons == rig.tx_prod


def test_host_resumes_from_the_indices_found_in_the_ring(rigs):
    """io_add_link adopts RX prod and TX cons as they are: no rewind."""
    rig = rigs(slots=4, start_rx=MASK, start_tx=MASK - 1)
    rig.backend_send([frame(1, 9), frame(2, 9)])
    rig.guest_send([frame(3, 9), frame(4, 9), frame(5, 9)])
    rig.service_until_idle()
    assert rig.rx.prod == 1  # MASK + 2, wrapped
    assert rig.tx.cons == 1  # MASK - 1 + 3, wrapped
    assert rig.guest_receive() == [frame(1, 9), frame(2, 9)]
    assert rig.backend_receive() == [frame(3, 9), frame(4, 9), frame(5, 9)]


# -- notifications -----------------------------------------------------------


def test_rx_batch_for_a_sleeping_guest_counts_notify_sent_and_signals_wake_fd(rigs):
    rig = rigs(slots=16)
    assert kit.shm_test_cons_prepare_sleep(rig.rx, rig.rx_cons, rig.slots) == 1
    rig.backend_send([frame(i, 64) for i in range(3)])
    assert kit.io_test_service(rig.io) == 3
    c = rig.count()
    assert c["notify_sent"] == 1 and c["notify_suppressed"] == 0
    assert eventfd_count(rig.wake) == 1
    kit.shm_test_cons_awake(rig.rx)
    assert len(rig.guest_receive()) == 3


def test_rx_batch_for_an_awake_guest_is_suppressed_and_wake_fd_stays_quiet(rigs):
    rig = rigs(slots=16)
    rig.backend_send([frame(i, 64) for i in range(3)])
    rig.service_until_idle()
    c = rig.count()
    assert c["notify_sent"] == 0 and c["notify_suppressed"] == 1
    assert eventfd_count(rig.wake) == 0


def test_a_guest_sleeping_through_many_batches_is_woken_once_per_arming(rigs):
    rig = rigs(slots=256)
    assert kit.shm_test_cons_prepare_sleep(rig.rx, rig.rx_cons, rig.slots) == 1
    rig.backend_send([frame(i, 32) for i in range(3 * BATCH)])
    rig.service_until_idle()
    c = rig.count()
    assert c["notify_sent"] == 1 and c["notify_suppressed"] == 2
    assert eventfd_count(rig.wake) == 1
    # Re-armed (the vCPU is about to look and wait again): one more wake-up.
    lib.io_arm_wake(rig.io)
    rig.backend_send([frame(i, 32) for i in range(BATCH)])
    rig.service_until_idle()
    c = rig.count()
    assert c["notify_sent"] == 2 and c["notify_suppressed"] == 2
    assert eventfd_count(rig.wake) == 1
    # Awake and armed: the next batches are suppressed, the arming kept.
    kit.shm_test_cons_awake(rig.rx)
    lib.io_arm_wake(rig.io)
    assert len(rig.guest_receive()) == 4 * BATCH
    rig.backend_send([frame(i, 32) for i in range(BATCH + 1)])
    rig.service_until_idle()
    c = rig.count()
    assert c["notify_sent"] == 2 and c["notify_suppressed"] == 4
    assert eventfd_count(rig.wake) == 0
    # Asleep again: the arming the awake batches left unused wakes it.
    assert len(rig.guest_receive()) == BATCH + 1
    assert kit.shm_test_cons_prepare_sleep(rig.rx, rig.rx_cons, rig.slots) == 1
    rig.backend_send([frame(0, 32)])
    rig.service_until_idle()
    assert rig.count()["notify_sent"] == 3
    assert eventfd_count(rig.wake) == 1


def test_idle_pass_neither_notifies_nor_suppresses(rigs):
    rig = rigs(slots=8)
    rig.rx.cons_sleeping = 1
    assert kit.io_test_service(rig.io) == 0
    c = rig.count()
    assert c["notify_sent"] == 0 and c["notify_suppressed"] == 0
    assert eventfd_count(rig.wake) == 0


def test_without_a_wake_fd_notifications_are_still_counted(rigs):
    rig = rigs(slots=8, wake=False)
    rig.rx.cons_sleeping = 1
    rig.backend_send([frame(0, 5)])
    assert kit.io_test_service(rig.io) == 1
    assert rig.count()["notify_sent"] == 1


# -- a hostile guest, against an exact model of one pass ---------------------


class HostModel:
    """What one pass must do, computed from the ring as it stands.

    The host reads only the guest-owned fields (RX cons and cons_sleeping, TX
    prod, TX slot lengths and data), its own trusted indices and whether a
    wake-up is armed.  Within one pass nothing changes the guest's fields, so
    a frame found with no room stays without room once read.
    """

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.rx_prod = int(rig.rx.prod)
        self.tx_cons = int(rig.tx.cons)
        self.c = dict.fromkeys(COUNTERS, 0)
        self.backlog: deque[bytes] = deque()  # in the socket, towards the host
        self.armed = True  # io_create arms the first wake-up

    def one_pass(self) -> tuple[int, list[tuple[int, bytes]], list[bytes], bool, bool, int]:
        rig, c, slots = self.rig, self.c, self.rig.slots
        work = 0
        tx_out: list[bytes] = []
        released = published = False
        avail = (rig.tx.prod - self.tx_cons) & MASK
        if avail > slots:
            c["tx_bad_index"] += 1
        else:
            avail = min(avail, BATCH)
            for i in range(avail):
                slot = rig.tx_slot(self.tx_cons + i)
                length = slot.len
                if length == 0 or length > SLOT_DATA:
                    c["tx_drops_bad_len"] += 1
                    continue
                tx_out.append(ffi.buffer(slot.data, length)[:])
                c["tx_frames"] += 1
                c["tx_bytes"] += length
            if avail:
                self.tx_cons = (self.tx_cons + avail) & MASK
                released = True
            work += avail

        seen = moved = 0
        delivered: list[tuple[int, bytes]] = []
        cons = int(rig.rx.cons)
        while seen < BATCH and self.backlog:
            used = (self.rx_prod - cons) & MASK
            f = self.backlog.popleft()
            seen += 1
            if used > slots:
                c["rx_bad_index"] += 1
            elif used == slots:
                c["rx_drops_full"] += 1
            elif len(f) > SLOT_DATA:
                c["rx_drops_oversize"] += 1
            else:
                delivered.append((self.rx_prod, f))
                self.rx_prod = (self.rx_prod + 1) & MASK
                c["rx_frames"] += 1
                c["rx_bytes"] += len(f)
                moved += 1
        wakes = 0
        if moved:
            published = True
            if rig.rx.cons_sleeping and self.armed:
                c["notify_sent"] += 1
                self.armed = False
                wakes = 1
            else:
                c["notify_suppressed"] += 1
        return work + seen, delivered, tx_out, released, published, wakes


def _value(slots: int):
    """A guest-written index: anything, or something near the host's index."""
    return st.one_of(
        st.tuples(st.just("abs"), st.integers(0, MASK)),
        st.tuples(st.just("rel"), st.integers(-slots - 3, 2 * slots + 3)),
        st.tuples(st.just("abs"), st.sampled_from([0, MASK, 2**31])),
    )


def _steps(slots: int):
    length = st.one_of(
        st.integers(0, MASK),
        st.integers(0, SLOT_DATA + 8),
        st.sampled_from([0, 1, SLOT_DATA, SLOT_DATA + 1, SLOT_SIZE]),
    )
    slot = st.integers(0, slots - 1)
    backend = st.tuples(
        st.just("backend"),
        st.lists(
            st.one_of(
                st.integers(1, 200),
                st.integers(1, SLOT_DATA),
                st.integers(SLOT_DATA + 1, SLOT_DATA + 600),
            ),
            min_size=1,
            max_size=3 * slots,
        ),
    )
    return st.one_of(
        st.tuples(st.just("rx_cons"), _value(slots)),
        st.tuples(st.just("rx_sleeping"), st.one_of(st.integers(0, MASK), st.sampled_from([0, 1]))),
        st.tuples(st.just("tx_prod"), _value(slots)),
        st.tuples(st.just("tx_len"), slot, length),
        st.tuples(st.just("tx_data"), slot, st.integers(0, 255)),
        st.tuples(
            st.just("info"),
            st.sampled_from(["rx", "tx"]),
            st.sampled_from(
                [OFF_SLOTS, OFF_SLOT_SIZE, OFF_SLOTS + 8, OFF_PROD + 4, OFF_CONS + 8, OFF_SLEEPING]
            ),
            st.integers(0, MASK),
        ),
        st.tuples(st.just("rx_prod"), st.integers(0, MASK)),
        st.tuples(st.just("tx_cons"), st.integers(0, MASK)),
        backend,
        backend,
        backend,
        st.tuples(st.just("guest_rx"), st.integers(1, 2 * slots)),
        st.tuples(st.just("guest_tx"), st.lists(st.integers(1, SLOT_DATA), max_size=6)),
        st.tuples(st.just("passes"), st.integers(1, 4)),
        st.tuples(st.just("arm")),
    )


@given(
    slots=st.sampled_from([1, 2, 4, 16]),
    start_rx=st.sampled_from([0, NEAR_WRAP, 2**31 - 3]),
    start_tx=st.sampled_from([0, NEAR_WRAP, MASK]),
    data=st.data(),
)
@settings(max_examples=80, deadline=None)
def test_hostile_guest_never_crashes_the_host_or_makes_it_write_outside_its_fields(
    slots: int, start_rx: int, start_tx: int, data: st.DataObject
):
    rig = Rig(slots=slots, start_rx=start_rx, start_tx=start_tx)
    try:
        model = HostModel(rig)
        writable = rig.host_writable()
        seq = 0
        for step in data.draw(st.lists(_steps(slots), min_size=5, max_size=40), label="steps"):
            kind = step[0]
            passes = 1
            if kind in ("rx_cons", "tx_prod"):
                how, v = step[1]
                own = model.rx_prod if kind == "rx_cons" else model.tx_cons
                v = v if how == "abs" else (own + v) & MASK
                if kind == "rx_cons":
                    rig.rx.cons = v
                else:
                    rig.tx.prod = v
            elif kind == "rx_sleeping":
                rig.rx.cons_sleeping = step[1]
            elif kind == "tx_len":
                rig.tx_slot(step[1]).len = step[2]
            elif kind == "tx_data":
                ffi.memmove(rig.tx_slot(step[1]).data, bytes([step[2]]) * SLOT_DATA, SLOT_DATA)
            elif kind == "info":
                ring = rig.rx if step[1] == "rx" else rig.tx
                ffi.cast("uint32_t *", ffi.cast("uint8_t *", ring) + step[2])[0] = step[3]
            elif kind == "rx_prod":
                rig.rx.prod = step[1]
            elif kind == "tx_cons":
                rig.tx.cons = step[1]
            elif kind == "backend":
                frames = [frame(seq + i, n) for i, n in enumerate(step[1])]
                seq += len(frames)
                rig.backend_send(frames)
                model.backlog.extend(frames)
            elif kind == "guest_rx":
                # An honest guest acting on whatever the ring says now.
                cons = int(rig.rx.cons)
                avail = kit.shm_test_cons_avail(rig.rx, cons, slots)
                if avail != BAD:
                    kit.shm_test_cons_release(rig.rx, (cons + min(avail, step[1])) & MASK)
            elif kind == "guest_tx":
                prod = int(rig.tx.prod)
                space = kit.shm_test_prod_space(rig.tx, prod, slots)
                if space != BAD:
                    for n in step[1][:space]:
                        slot = rig.tx_slot(prod)
                        f = frame(seq, n)
                        seq += 1
                        ffi.memmove(slot.data, f, n)
                        slot.len = n
                        prod = (prod + 1) & MASK
                    kit.shm_test_prod_publish(rig.tx, prod)
            elif kind == "passes":
                passes = step[1]
            elif kind == "arm":
                lib.io_arm_wake(rig.io)
                model.armed = True

            for _ in range(passes):
                before = rig.mem.copy()
                work, delivered, tx_out, released, published, wakes = model.one_pass()
                assert kit.io_test_service(rig.io) == work
                changed = np.flatnonzero(rig.mem != before)
                outside = changed[~writable[changed]]
                assert outside.size == 0, f"host wrote at offsets {outside[:8].tolist()}"
                assert rig.guards_intact()
                assert rig.count() == model.c
                for index, f in delivered:
                    slot = rig.rx_slot(index)
                    assert slot.len == len(f)
                    assert ffi.buffer(slot.data, slot.len)[:] == f
                if published:
                    assert rig.rx.prod == model.rx_prod
                if released:
                    assert rig.tx.cons == model.tx_cons
                assert rig.backend_receive() == tx_out
                assert eventfd_count(rig.wake) == wakes
        for name, value in model.c.items():
            if value and name not in ("rx_bytes", "tx_bytes"):
                event(f"{name} > 0")
    finally:
        rig.close()


# -- the thread: poll, event, hybrid --------------------------------------------


def rx_frame(i: int) -> bytes:
    return frame(i, 1 + (i * 131) % SLOT_DATA)


def tx_frame(i: int) -> bytes:
    return frame(1_000_000 + i, 1 + (i * 97) % SLOT_DATA)


DROPS = drop_counters("shmstream")


def run_traffic(rig: Rig, n_rx: int, n_tx: int, window: int, timeout: float) -> dict[str, int]:
    """Both directions at once, a Python guest and backend, no drops allowed.

    At most `window` (<= slots) frames are in flight each way: the guest
    releases RX slots before the next frames reach the backend, so every
    frame finds room when it arrives and a correct host drops none.  When
    nothing moves, the guest's RX consumer does what the vCPU does: it arms
    the host's wake-up, runs the sleep handshake and waits on the wake
    eventfd (or the backend).  A sleep that ends by time-out while frames
    wait, and that a further second of waiting does not end, is a lost
    wake-up.
    """
    deadline = time.monotonic() + timeout
    rx_sent = rx_got = tx_sent = tx_got = 0
    sleeps = lost = wakes = 0
    while rx_got < n_rx or tx_got < n_tx:
        if time.monotonic() > deadline:
            pytest.fail(f"stalled: rx {rx_got}/{n_rx}, tx {tx_got}/{n_tx}, counters {rig.count()}")
        if any(getattr(rig.counters, name) for name in DROPS):
            pytest.fail(f"frames dropped: rx {rx_got}/{n_rx}, tx {tx_got}/{n_tx}, {rig.count()}")
        progress = False
        while rx_sent < n_rx and rx_sent - rx_got < window:
            rig.backend_send([rx_frame(rx_sent)])
            rx_sent += 1
            progress = True
        want = min(n_tx - tx_sent, window - (tx_sent - tx_got))
        if want > 0:
            sent = rig.guest_send([tx_frame(tx_sent + i) for i in range(want)])
            tx_sent += sent
            progress |= sent > 0
        for f in rig.guest_receive():
            assert f == rx_frame(rx_got), f"RX frame {rx_got} wrong or out of order"
            rx_got += 1
            progress = True
        for f in rig.backend_receive():
            assert f == tx_frame(tx_got), f"TX frame {tx_got} wrong or out of order"
            tx_got += 1
            progress = True
        if progress:
            continue
        lib.io_arm_wake(rig.io)
        wakes += eventfd_count(rig.wake)
        if kit.shm_test_cons_prepare_sleep(rig.rx, rig.rx_cons, rig.slots):
            sleeps += 1
            ready, _, _ = select.select([rig.wake, rig.peer], [], [], 0.5)
            if not ready and kit.shm_test_cons_avail(rig.rx, rig.rx_cons, rig.slots) > 0:
                ready, _, _ = select.select([rig.wake], [], [], 1.0)
                lost += not ready
            wakes += eventfd_count(rig.wake)
            kit.shm_test_cons_awake(rig.rx)
        wakes += eventfd_count(rig.wake)
    return {"guest_sleeps": sleeps, "lost_wakeups": lost, "wakes": wakes}


@pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))
def test_thread_hands_off_only_to_a_guest_behind_on_its_core(rigs, mode: int):
    """Co-scheduling (docs/modes.md): the thread yields to the vCPU after a
    pass that left the RX ring three quarters full, only when it is pinned
    and the vCPU last armed its wake-up on that core, and never while the
    guest keeps up; seen in its ``handoffs`` counter."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})  # the "vCPU" (this thread) on the IO thread's core
    try:
        unpinned = rigs(slots=16, mode=mode, budget_us=200)
        rig = rigs(slots=16, mode=mode, budget_us=200, cpu=cpu)
        for r in (unpinned, rig):
            r.start()
            r.backend_send([rx_frame(i) for i in range(13)])  # 13 of 16: behind
            wait_until(lambda r=r: r.counters.rx_frames == 13, "the frames never arrived")
            assert r.stats.handoffs == 0  # no vCPU seen on the core yet
            assert r.guest_receive() == [rx_frame(i) for i in range(13)]
            lib.io_arm_wake(r.io)  # the "vCPU" goes to sleep on this core
            r.backend_send([rx_frame(i) for i in range(13, 17)])  # a quarter: room
            wait_until(lambda r=r: r.counters.rx_frames == 17, "the next frames never arrived")
            assert r.stats.handoffs == 0
            r.backend_send([rx_frame(i) for i in range(17, 26)])  # 13 of 16 again
            wait_until(lambda r=r: r.counters.rx_frames == 26, "the last frames never arrived")
        wait_until(lambda: rig.stats.handoffs >= 1, "the pinned thread never handed off")
        for r in (unpinned, rig):
            r.stop(30)
    finally:
        os.sched_setaffinity(0, before)
    assert unpinned.stats.handoffs == 0  # its vCPU's core is not known to be its own
    for r in (unpinned, rig):
        assert r.guest_receive() == [rx_frame(i) for i in range(13, 26)]
        assert r.count()["rx_drops_full"] == 0


@pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))
def test_threaded_mode_moves_every_frame_in_order_and_stops_promptly(rigs, mode: int):
    rig = rigs(slots=16, mode=mode, budget_us=200)
    rig.start()
    n = 2500
    result = run_traffic(rig, n_rx=n, n_tx=n, window=rig.slots, timeout=120)
    if mode != lib.IO_MODE_POLL:  # idle now: it goes to sleep (hybrid: after its budget)
        wait_until(lambda: rig.stats.sleeps >= 1, "the thread never slept while idle")
    stats = {name: getattr(rig.stats, name) for name, _ in ffi.typeof("struct io_stats").fields}
    rig.stop(30)

    c = rig.count()
    assert c["rx_frames"] == n and c["tx_frames"] == n
    assert c["rx_bytes"] == sum(len(rx_frame(i)) for i in range(n))
    assert c["tx_bytes"] == sum(len(tx_frame(i)) for i in range(n))
    for name in DROPS:
        assert c[name] == 0, name
    assert result["lost_wakeups"] == 0
    assert c["notify_sent"] + c["notify_suppressed"] >= 1
    # Every notification is exactly one eventfd signal, and nothing else
    # signals it.
    assert result["wakes"] + eventfd_count(rig.wake) == c["notify_sent"]
    assert stats["busy_passes"] >= 1
    if mode == lib.IO_MODE_POLL:
        assert stats["sleeps"] == 0
        assert stats["idle_spins"] > 0
    else:
        assert stats["sleeps"] >= 1, "the thread never slept while idle"
    if mode == lib.IO_MODE_EVENT:
        assert rig.guest_kicks >= 1, "the guest never had to kick a sleeping host"
    # The thread counts every kick it read; the rest is still in the eventfd.
    assert rig.stats.kicks + eventfd_count(rig.kick) == rig.guest_kicks
    assert rig.guards_intact()


def test_rx_frame_arriving_after_the_guest_freed_room_is_not_dropped(rigs):
    """A guest keeping at most `slots` frames in flight never loses one.

    The guest consumes, releases, and only then lets the next frame reach
    the backend, so every frame arrives when the ring has room for it.  A
    host that decides "full" from a RX cons loaded before the frame arrived
    drops one every few thousand frames here: the drop must be decided after
    the frame is read.
    """
    rig = rigs(slots=4, mode=lib.IO_MODE_POLL)
    rig.start()
    deadline = time.monotonic() + 5
    sent = got = 0
    while got < 100_000 and time.monotonic() < deadline and not rig.counters.rx_drops_full:
        while sent - got < rig.slots:
            rig.backend_send([frame(sent, 64)])
            sent += 1
        for f in rig.guest_receive():
            assert f == frame(got, 64)
            got += 1
    drops = rig.counters.rx_drops_full
    rig.stop()
    assert drops == 0, f"frame {got} dropped as 'ring full' with the ring not full"


@pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))
def test_idle_thread_stops_promptly_and_stop_is_idempotent(rigs, mode: int):
    rig = rigs(slots=4, mode=mode, budget_us=1000)
    rig.start()
    if mode != lib.IO_MODE_POLL:
        wait_until(lambda: asleep(rig), "the idle thread never went to sleep")
    rig.stop(30)  # fails if io_stop hangs
    rig.stop(30)  # a second stop is a no-op


def test_poll_mode_thread_accounts_its_cpu_time(rigs):
    rig = rigs(slots=4, mode=lib.IO_MODE_POLL)
    assert lib.io_cpu_ns(rig.io) == 0  # never started
    rig.start()
    wait_until(lambda: lib.io_cpu_ns(rig.io) > 0, "a polling thread accounted no CPU time")
    rig.stop()
    total = lib.io_cpu_ns(rig.io)
    assert total > 0
    time.sleep(0.01)
    assert lib.io_cpu_ns(rig.io) == total, "a stopped thread's time is final"


def test_rx_wakes_a_sleeping_event_thread_and_the_thread_wakes_a_sleeping_guest(rigs):
    rig = rigs(slots=8, mode=lib.IO_MODE_EVENT)
    rig.start()
    wait_until(lambda: asleep(rig), "the thread never went to sleep in epoll")
    assert kit.shm_test_cons_prepare_sleep(rig.rx, rig.rx_cons, rig.slots) == 1
    rig.backend_send([frame(7, 700)])
    ready, _, _ = select.select([rig.wake], [], [], 5.0)
    assert ready, "no wake-up for a sleeping guest"
    kit.shm_test_cons_awake(rig.rx)
    assert rig.guest_receive() == [frame(7, 700)]


@pytest.mark.parametrize("mode", [lib.IO_MODE_EVENT, lib.IO_MODE_HYBRID], ids=["event", "hybrid"])
def test_kick_wakes_a_sleeping_thread_for_tx(rigs, mode: int):
    rig = rigs(slots=8, mode=mode, budget_us=100)
    rig.start()
    wait_until(lambda: asleep(rig), "the thread never went to sleep")
    assert rig.guest_send([frame(9, 900)]) == 1
    assert rig.guest_kicks == 1, "a sleeping host must have its sleep flag set"
    ready, _, _ = select.select([rig.peer], [], [], 5.0)
    assert ready, "the kick did not wake the IO thread"
    assert rig.backend_receive() == [frame(9, 900)]


@pytest.mark.parametrize("mode", [lib.IO_MODE_EVENT, lib.IO_MODE_HYBRID], ids=["event", "hybrid"])
def test_hostile_tx_index_does_not_make_a_sleeping_thread_spin(rigs, mode: int):
    """An impossible TX prod is counted, then the thread goes back to sleep."""
    rig = rigs(slots=8, mode=mode, budget_us=100)
    rig.start()
    wait_until(lambda: asleep(rig), "the thread never went to sleep")
    sleeps = rig.stats.sleeps
    rig.tx.prod = (rig.tx_prod + 1000) & MASK  # impossible: 1000 ahead of an 8-slot ring
    os.eventfd_write(rig.kick, 1)
    wait_until(lambda: rig.counters.tx_bad_index >= 1, "the impossible index was not noticed")
    wait_until(
        lambda: rig.stats.sleeps > sleeps and asleep(rig), "the thread never went back to sleep"
    )
    bad0, cpu0 = rig.counters.tx_bad_index, lib.io_cpu_ns(rig.io)
    spins0 = rig.stats.idle_spins + rig.stats.busy_passes
    time.sleep(WATCH)
    bad1, cpu1 = rig.counters.tx_bad_index, lib.io_cpu_ns(rig.io)
    spins1 = rig.stats.idle_spins + rig.stats.busy_passes
    rig.stop()
    assert bad1 == bad0, f"tx_bad_index went on from {bad0} to {bad1}: the thread spins"
    assert spins1 == spins0, "the thread kept passing over the ring while asleep"
    # A sleeping thread uses no CPU: a spinning one would use most of WATCH.
    assert (cpu1 - cpu0) / 1e9 < 0.5 * WATCH, (cpu0, cpu1)


@pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))
def test_stop_still_sends_tx_frames_queued_without_a_kick(rigs, mode: int):
    """Frames a guest published just before it halted go out at io_stop."""
    rig = rigs(slots=64, mode=mode, budget_us=100)
    rig.start()
    if mode != lib.IO_MODE_POLL:  # asleep: TX published now needs a kick
        wait_until(lambda: asleep(rig), "the thread never went to sleep")
    frames = [frame(i, 100 + i) for i in range(40)]
    assert rig.guest_send(frames, kick=False) == len(frames)
    rig.stop(30)
    assert rig.backend_receive() == frames
    assert rig.count()["tx_frames"] == len(frames)
    assert rig.tx.cons == rig.tx_prod


@pytest.mark.parametrize("mode", [lib.IO_MODE_EVENT, lib.IO_MODE_HYBRID], ids=["event", "hybrid"])
def test_hung_up_backend_does_not_make_a_sleeping_thread_spin(rigs, mode: int):
    rig = rigs(slots=8, mode=mode, budget_us=100)
    rig.peer.close()  # the backend now reads as end of file, forever
    rig.start()
    wait_until(lambda: asleep(rig), "the thread never went to sleep")
    wakeups0, cpu0 = rig.stats.wakeups, lib.io_cpu_ns(rig.io)
    time.sleep(WATCH)
    wakeups1, cpu1 = rig.stats.wakeups, lib.io_cpu_ns(rig.io)
    rig.stop(30)
    assert wakeups1 == wakeups0, "the hung-up backend keeps waking the thread"
    assert (cpu1 - cpu0) / 1e9 < 0.5 * WATCH, (cpu0, cpu1)
    assert rig.count()["rx_frames"] == 0


def endless_backend() -> int:
    """A backend with a frame always waiting: a semaphore eventfd yields one
    8-byte frame per read and its counter is ~4e9, so every pass has work."""
    return os.eventfd(2**32 - 1, os.EFD_SEMAPHORE | os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def stop_or_rescue(rig: Rig, backend: int, seconds: float) -> bool:
    """io_stop within `seconds`?  If not, swap an idle socket in for the
    backend (dup2) so the thread can finish, and return False."""
    stopper = threading.Thread(target=lib.io_stop, args=(rig.io,), daemon=True)
    stopper.start()
    stopper.join(seconds)
    if not stopper.is_alive():
        return True
    idle, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    idle.setblocking(False)
    os.dup2(idle.fileno(), backend)
    stopper.join(5)
    idle.close()
    other.close()
    if stopper.is_alive():
        rig._hung = True
    return False


@pytest.mark.parametrize(
    "mode",
    list(MODES.values()),
    ids=list(MODES),
)
def test_thread_stops_promptly_while_every_pass_finds_work(mode: int):
    backend = endless_backend()
    rig = Rig(slots=8, mode=mode, budget_us=100, backend_fd=backend)
    try:
        rig.start()
        wait_until(lambda: rig.counters.rx_drops_full > 0, "the endless backend never filled RX")
        assert rig.counters.rx_frames == rig.slots  # it is busy: ring full, dropping
        assert stop_or_rescue(rig, backend, 30), "io_stop did not return within 30 s"
    finally:
        stop_or_rescue(rig, backend, 30)  # the thread must be gone before the fd
        rig.close()
        os.close(backend)


@pytest.mark.parametrize("case", ["empty-datagram", "eof"])
@pytest.mark.parametrize("full", [False, True], ids=["room", "full"])
def test_zero_byte_backend_reads_are_not_delivered_as_frames(rigs, case: str, full: bool):
    """The guest driver rejects a len-0 RX slot, so the host must never
    publish one; and a backend at end of file must not look busy forever."""
    rig = rigs(slots=8)
    if full:
        rig.backend_send([frame(i, 10) for i in range(rig.slots)])
        rig.service_until_idle()
    before = rig.count()
    if case == "eof":
        rig.peer.close()
    else:
        rig.backend_send([b""])
    kit.io_test_service(rig.io)
    assert kit.io_test_service(rig.io) == 0, "the pass keeps finding 'frames'"
    assert rig.count() == before
    published = rig.slots if full else 0
    assert rig.rx.prod == (NEAR_WRAP + published) & MASK, "an empty frame was published"


# -- set-up and argument checks ----------------------------------------------


def test_add_port_rejects_slot_counts_that_are_not_powers_of_two(rigs):
    rig = rigs(slots=8)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        for slots in (0, 3, 6, 12, 2**31 + 1):
            assert lib.io_add_link(rig.io, a.fileno(), rig.rx, rig.tx, slots) == -errno.EINVAL
        assert lib.io_link_counters(rig.io, 1) == ffi.NULL
    finally:
        a.close()
        b.close()


def test_add_port_rejects_a_bad_fd(rigs):
    rig = rigs(slots=8)
    assert lib.io_add_link(rig.io, -1, rig.rx, rig.tx, 8) == -errno.EBADF
    assert lib.io_link_counters(rig.io, 1) == ffi.NULL


def test_add_port_refuses_more_than_max_devices_and_after_start():
    io = lib.io_create(lib.IO_MODE_EVENT, 0, -1, -1, -1)
    assert io != ffi.NULL
    rings = ffi.new("uint8_t[]", 2 * kit.shm_test_ring_size(1))
    rx = rings
    tx = ffi.cast("uint8_t *", rings) + kit.shm_test_ring_size(1)
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(18)]
    for a, _ in pairs:
        a.setblocking(False)  # as a tap is: the thread must never block in read
    started = False
    try:
        for i in range(lib.SHM_MAX_DEVICES):
            assert lib.io_add_link(io, pairs[i][0].fileno(), rx, tx, 1) == i
        assert lib.io_add_link(io, pairs[16][0].fileno(), rx, tx, 1) == -errno.EBUSY
        assert lib.io_link_counters(io, lib.SHM_MAX_DEVICES) == ffi.NULL
        assert lib.io_link_counters(io, -1) == ffi.NULL
        assert lib.io_start(io) == 0
        started = True
        assert lib.io_start(io) == -errno.EBUSY
        assert lib.io_add_link(io, pairs[17][0].fileno(), rx, tx, 1) == -errno.EBUSY
    finally:
        stopper = threading.Thread(target=lib.io_stop, args=(io,), daemon=True)
        stopper.start()
        stopper.join(5)
        if not stopper.is_alive():
            lib.io_destroy(io)
        for a, b in pairs:
            a.close()
            b.close()
        assert not (started and stopper.is_alive()), "io_stop did not return within 5 s"


def test_stop_and_destroy_without_start_are_safe():
    io = lib.io_create(lib.IO_MODE_POLL, 0, -1, -1, -1)
    assert io != ffi.NULL
    lib.io_stop(io)
    lib.io_stop(io)
    assert lib.io_cpu_ns(io) == 0
    assert kit.io_test_service(io) == 0  # no ports: nothing to do
    lib.io_destroy(io)
    lib.io_destroy(ffi.NULL)


def _tasks() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def test_pinned_thread_is_created_on_its_cpu() -> None:
    """--pin io=N: the affinity is the thread's from its creation
    (pthread_attr_setaffinity_np), so it is in force once io_start
    returns; a CPU the process may not use fails io_start itself."""
    cpu = max(os.sched_getaffinity(0))
    io = lib.io_create(lib.IO_MODE_EVENT, 50, cpu, -1, -1)
    assert io != ffi.NULL
    try:
        before = _tasks()
        assert lib.io_start(io) == 0
        (tid,) = _tasks() - before
        assert os.sched_getaffinity(tid) == {cpu}
    finally:
        lib.io_destroy(io)
    unusable = max(os.sched_getaffinity(0)) + 1
    io = lib.io_create(lib.IO_MODE_EVENT, 50, unusable, -1, -1)
    try:
        assert lib.io_start(io) == -errno.EINVAL
    finally:
        lib.io_destroy(io)
