"""The shmstream ring protocol (csrc/shmstream_ring.h), driven through cffi.

The shm_test_* functions are the very inline operations the guest driver and
the host IO thread compile, so these tests check the code both sides run:

* a model-checked producer/consumer pair (FIFO order and contents, space and
  availability always adding up, unpublished writes invisible, the
  free-running uint32 indices wrapping through 2**32);
* the sleep-flag handshake (a consumer that announced sleep is always
  notified by the next publish; it never sleeps with frames waiting);
* hostile indices (whatever a peer writes into its index, the other side
  gets a count within [0, slots] or SHM_TEST_BAD, nothing else).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from pyvmm._native import ffi, lib
from testkit.native import lib as kit

MASK = 0xFFFFFFFF
BAD = kit.SHM_TEST_BAD
SLOT_DATA = lib.SHM_SLOT_DATA
SLOT_COUNTS = [1, 2, 4, 8, 16, 32, 64]

# A payload source: frame n is its number followed by a slice of this, so a
# frame left over from another index never looks like the expected one.
_PATTERN = bytes(i % 251 for i in range(2 * SLOT_DATA))


def frame(seq: int, length: int) -> bytes:
    head = seq.to_bytes(8, "little")
    return (head + _PATTERN[seq % 251 : seq % 251 + length])[:length]


def new_ring(slots: int, start: int) -> tuple[object, object]:
    """A zeroed ring of `slots` slots whose indices both start at `start`.

    Returns (memory, ring): the ring is a cast that does not own the
    memory, so the caller must keep the first element bound for as long as
    it uses the ring (binding it to ``_`` and then looping with ``for _``
    freed it mid-test once).
    """
    buf = ffi.new("uint8_t[]", kit.shm_test_ring_size(slots))
    ring = ffi.cast("struct shm_ring *", buf)
    ring.prod = start
    ring.cons = start
    ring.slots = slots
    ring.slot_size = lib.SHM_SLOT_SIZE
    return buf, ring


def slot_at(ring: object, index: int, slots: int) -> object:
    return ffi.cast("struct shm_slot *", kit.shm_test_slot(ring, index & MASK, slots))


def write_slot(ring: object, index: int, slots: int, data: bytes) -> None:
    slot = slot_at(ring, index, slots)
    ffi.memmove(slot.data, data, len(data))
    slot.len = len(data)


def read_slot(ring: object, index: int, slots: int) -> bytes:
    slot = slot_at(ring, index, slots)
    assert 1 <= slot.len <= SLOT_DATA
    return ffi.buffer(slot.data, slot.len)[:]


def dist(a: int, b: int) -> int:
    """a - b as the C code computes it on uint32_t."""
    return (a - b) & MASK


# Start at most a few rings' worth below 2**32, so the counters wrap during
# a run, sometimes right away, sometimes after the ring filled a few times.
starts = st.integers(0, 200).map(lambda back: (2**32 - back) & MASK)
lengths = st.one_of(
    st.integers(1, 64),
    st.just(SLOT_DATA),
    st.integers(1, SLOT_DATA),
)


def test_shm_slot_is_the_size_the_layout_promises():
    assert ffi.sizeof("struct shm_slot") == lib.SHM_SLOT_SIZE
    assert lib.SHM_SLOT_HEADER + lib.SHM_SLOT_DATA == lib.SHM_SLOT_SIZE
    assert ffi.offsetof("struct shm_ring", "cons") == lib.SHM_CACHE_LINE
    assert ffi.offsetof("struct shm_ring", "slots") == 2 * lib.SHM_CACHE_LINE
    assert ffi.offsetof("struct shm_ring", "slot") == 3 * lib.SHM_CACHE_LINE
    for slots in SLOT_COUNTS:
        assert kit.shm_test_ring_size(slots) == 3 * lib.SHM_CACHE_LINE + slots * 2048


def test_slot_index_wraps_modulo_the_ring():
    mem, ring = new_ring(8, 0)
    base = int(ffi.cast("uintptr_t", ring.slot))
    for index in (0, 7, 8, 15, MASK, MASK - 7, 2**31 + 3):
        addr = int(ffi.cast("uintptr_t", kit.shm_test_slot(ring, index, 8)))
        assert addr == base + (index % 8) * lib.SHM_SLOT_SIZE


# -- (a) producer and consumer against a model queue ----------------------


class RingModel(RuleBasedStateMachine):
    """One producer, one consumer, one ring; a dict of index -> frame as model.

    The producer writes slots (prod) and later publishes them (published);
    the consumer reads slots (cons) and later releases them (released).  Each
    side decides only from what the ring operations return, as the real
    sides do, and the model checks every answer and every byte read.
    """

    @initialize(slots=st.sampled_from(SLOT_COUNTS), start=starts)
    def setup(self, slots: int, start: int) -> None:
        self.slots = slots
        self.buf, self.ring = new_ring(slots, start)
        self.prod = self.published = start
        self.cons = self.released = start
        self.written: dict[int, bytes] = {}
        self.seq = 0

    # helpers ---------------------------------------------------------------

    def space(self) -> int:
        space = kit.shm_test_prod_space(self.ring, self.prod, self.slots)
        assert space == self.slots - dist(self.prod, self.released)
        return space

    def avail(self) -> int:
        avail = kit.shm_test_cons_avail(self.ring, self.cons, self.slots)
        assert avail == dist(self.published, self.cons)
        return avail

    def produce(self, length: int) -> None:
        data = frame(self.seq, length)
        # The slot about to be overwritten holds nothing the consumer may
        # still read: its previous frame was released (or it was never used).
        assert (self.prod - self.slots) & MASK not in self.written
        write_slot(self.ring, self.prod, self.slots, data)
        self.written[self.prod] = data
        self.seq += 1
        self.prod = (self.prod + 1) & MASK

    def consume(self) -> None:
        assert self.cons in self.written, "consumer reached an index never written"
        assert read_slot(self.ring, self.cons, self.slots) == self.written[self.cons]
        self.cons = (self.cons + 1) & MASK

    # producer ----------------------------------------------------------------

    @rule(length=lengths)
    def write_one(self, length: int) -> None:
        if self.space() == 0:
            return  # full: a correct producer writes nothing
        self.produce(length)

    @rule()
    def publish(self) -> None:
        kit.shm_test_prod_publish(self.ring, self.prod)
        self.published = self.prod

    @rule(batch=st.lists(lengths, min_size=1, max_size=80))
    def produce_batch(self, batch: list[int]) -> None:
        for length in batch[: self.space()]:
            self.produce(length)
        kit.shm_test_prod_publish(self.ring, self.prod)
        self.published = self.prod

    # consumer ----------------------------------------------------------------

    @rule()
    def read_one(self) -> None:
        if self.avail() == 0:
            return  # empty: a correct consumer reads nothing
        self.consume()

    @rule()
    def release(self) -> None:
        kit.shm_test_cons_release(self.ring, self.cons)
        for index in list(self.written):
            if 0 < dist(self.cons, index) <= self.slots:
                del self.written[index]
        self.released = self.cons

    @rule(n=st.integers(1, 80))
    def consume_batch(self, n: int) -> None:
        for _ in range(min(n, self.avail())):
            self.consume()
        self.release()

    # invariants --------------------------------------------------------------

    @invariant()
    def counts_add_up(self) -> None:
        space, avail = self.space(), self.avail()
        assert 0 <= space <= self.slots and 0 <= avail <= self.slots
        unpublished = dist(self.prod, self.published)
        unreleased = dist(self.cons, self.released)
        assert avail + space == self.slots - unpublished - unreleased
        if unpublished == 0 and unreleased == 0:
            assert avail + space == self.slots

    @invariant()
    def ring_shows_exactly_what_was_published_and_released(self) -> None:
        assert self.ring.prod == self.published
        assert self.ring.cons == self.released
        assert self.ring.cons_sleeping == 0

    @invariant()
    def consumer_never_overtakes_producer(self) -> None:
        assert dist(self.published, self.cons) <= self.slots
        assert dist(self.prod, self.released) <= self.slots


RingModel.TestCase.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)
TestRingModel = RingModel.TestCase


@pytest.mark.parametrize("slots", [1, 4, 64])
def test_fifo_survives_the_uint32_wrap(slots: int):
    """Fill and drain the ring repeatedly across 2**32, checking every byte."""
    start = (2**32 - 3 * slots - 1) & MASK
    mem, ring = new_ring(slots, start)
    prod = cons = start
    seq = expected = 0
    for round_ in range(8):
        space = kit.shm_test_prod_space(ring, prod, slots)
        assert space == slots
        for _ in range(space):
            write_slot(ring, prod, slots, frame(seq, 1 + (seq * 37) % SLOT_DATA))
            seq += 1
            prod = (prod + 1) & MASK
        kit.shm_test_prod_publish(ring, prod)
        assert kit.shm_test_prod_space(ring, prod, slots) == 0
        avail = kit.shm_test_cons_avail(ring, cons, slots)
        assert avail == slots, round_
        for _ in range(avail):
            assert read_slot(ring, cons, slots) == frame(expected, 1 + (expected * 37) % SLOT_DATA)
            expected += 1
            cons = (cons + 1) & MASK
        kit.shm_test_cons_release(ring, cons)
        assert kit.shm_test_cons_avail(ring, cons, slots) == 0
    assert prod < start, "the indices never wrapped"


# -- (b) the sleep-flag handshake --------------------------------------------


class SleepHandshake(RuleBasedStateMachine):
    """Consumer prepare_sleep/awake against producer publish/needs_notify.

    Each shm_test_* call is one atomic step; rules interleave them in every
    order.  The producer always calls needs_notify after a publish (that is
    the protocol) but other steps may come in between.
    """

    @initialize(slots=st.sampled_from([1, 2, 4, 16]), start=starts)
    def setup(self, slots: int, start: int) -> None:
        self.slots = slots
        self.buf, self.ring = new_ring(slots, start)
        self.prod = start
        self.cons = start
        self.asleep = False  # prepare_sleep said 1 and no awake since
        self.notified = False  # a notification is on its way to the consumer
        self.must_check = False  # published, needs_notify not called yet
        self.sleeps = 0
        self.notifications = 0

    def avail(self) -> int:
        return kit.shm_test_cons_avail(self.ring, self.cons, self.slots)

    # producer ----------------------------------------------------------------

    @precondition(lambda self: not self.must_check)
    @rule(n=st.integers(1, 4))
    def publish(self, n: int) -> None:
        space = kit.shm_test_prod_space(self.ring, self.prod, self.slots)
        if space == 0:
            return
        for _ in range(min(n, space)):
            write_slot(self.ring, self.prod, self.slots, b"x")
            self.prod = (self.prod + 1) & MASK
        kit.shm_test_prod_publish(self.ring, self.prod)
        self.must_check = True

    @precondition(lambda self: self.must_check)
    @rule()
    def needs_notify(self) -> None:
        notify = kit.shm_test_prod_needs_notify(self.ring)
        # No lost wake-up: a consumer that announced sleep (before or after
        # the publish) is notified; an awake one is left alone.
        assert bool(notify) == self.asleep
        if notify:
            self.notified = True
            self.notifications += 1
        self.must_check = False

    # consumer ----------------------------------------------------------------

    @precondition(lambda self: not self.asleep)
    @rule()
    def consume_all(self) -> None:
        avail = self.avail()
        assert avail != BAD
        self.cons = (self.cons + avail) & MASK
        kit.shm_test_cons_release(self.ring, self.cons)

    @precondition(lambda self: not self.asleep)
    @rule()
    def prepare_sleep(self) -> None:
        waiting = self.avail()
        went = kit.shm_test_cons_prepare_sleep(self.ring, self.cons, self.slots)
        assert went in (0, 1)
        # It sleeps exactly when nothing is waiting, and the flag says so.
        assert went == (waiting == 0)
        assert self.ring.cons_sleeping == went
        if went:
            self.asleep = True
            self.notified = False
            self.sleeps += 1

    @precondition(lambda self: self.asleep and self.notified)
    @rule()
    def wake_on_notification(self) -> None:
        kit.shm_test_cons_awake(self.ring)
        self.asleep = False

    @precondition(lambda self: self.asleep)
    @rule()
    def wake_spuriously(self) -> None:
        kit.shm_test_cons_awake(self.ring)
        self.asleep = False

    @precondition(lambda self: not self.asleep)
    @rule()
    def awake_while_awake_is_harmless(self) -> None:
        kit.shm_test_cons_awake(self.ring)
        assert self.ring.cons_sleeping == 0

    # invariants --------------------------------------------------------------

    @invariant()
    def no_lost_wakeup(self) -> None:
        # A sleeping consumer that no notification is coming to, and that no
        # pending needs_notify can still reach, has nothing waiting.
        if self.asleep and not self.notified and not self.must_check:
            assert self.avail() == 0

    @invariant()
    def flag_mirrors_the_consumer(self) -> None:
        assert self.ring.cons_sleeping == (1 if self.asleep else 0)


SleepHandshake.TestCase.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)
TestSleepHandshake = SleepHandshake.TestCase


def _interleavings(a: list[str], b: list[str]):
    """Every merge of a and b keeping each one's own order."""
    n = len(a) + len(b)
    for picks in itertools.combinations(range(n), len(a)):
        ia, ib, out = iter(a), iter(b), []
        for i in range(n):
            out.append(next(ia) if i in picks else next(ib))
        yield out


@pytest.mark.parametrize("waiting", [0, 1])
@pytest.mark.parametrize(
    "order",
    list(_interleavings(["prepare_sleep"], ["write", "publish", "needs_notify"])),
    ids="-".join,
)
def test_every_interleaving_of_sleep_and_publish_wakes_or_sees_the_frame(
    order: list[str], waiting: int
):
    """The consumer either sees the frame or is notified: never neither."""
    slots = 4
    start = (2**32 - 1) & MASK
    mem, ring = new_ring(slots, start)
    prod = cons = start
    for _ in range(waiting):
        write_slot(ring, prod, slots, b"old")
        prod = (prod + 1) & MASK
    kit.shm_test_prod_publish(ring, prod)
    slept = notified = None
    for step in order:
        if step == "prepare_sleep":
            slept = kit.shm_test_cons_prepare_sleep(ring, cons, slots)
        elif step == "write":
            write_slot(ring, prod, slots, b"new")
            prod = (prod + 1) & MASK
        elif step == "publish":
            kit.shm_test_prod_publish(ring, prod)
        else:
            notified = kit.shm_test_prod_needs_notify(ring)
    if waiting:
        assert slept == 0, "slept with a frame waiting"
    if slept:
        assert notified, "consumer asleep, frame published, no notification"
    else:
        assert kit.shm_test_cons_avail(ring, cons, slots) > 0
        assert ring.cons_sleeping == 0


def test_prepare_sleep_on_empty_ring_sets_the_flag_and_awake_clears_it():
    mem, ring = new_ring(8, MASK)
    assert kit.shm_test_cons_prepare_sleep(ring, MASK, 8) == 1
    assert ring.cons_sleeping == 1
    assert kit.shm_test_prod_needs_notify(ring) == 1
    kit.shm_test_cons_awake(ring)
    assert ring.cons_sleeping == 0
    assert kit.shm_test_prod_needs_notify(ring) == 0


@given(slots=st.sampled_from(SLOT_COUNTS), start=starts, data=st.data())
@settings(max_examples=100, deadline=None)
def test_prepare_sleep_refuses_while_frames_wait(slots: int, start: int, data: st.DataObject):
    mem, ring = new_ring(slots, start)
    waiting = data.draw(st.integers(1, slots))
    kit.shm_test_prod_publish(ring, (start + waiting) & MASK)
    ring.cons_sleeping = data.draw(st.sampled_from([0, 1]))
    assert kit.shm_test_cons_prepare_sleep(ring, start, slots) == 0
    assert ring.cons_sleeping == 0, "the sleep announcement was not withdrawn"


# -- (c) hostile indices -----------------------------------------------------


def _peer_values(slots: int, own: int):
    """Anything at all, with weight on the edges around `own`."""
    near = st.integers(-2 * slots - 2, 2 * slots + 2).map(lambda d: (own + d) & MASK)
    edges = st.sampled_from([0, 1, MASK, 2**31, 2**31 - 1, 2**31 + 1, own ^ 2**31])
    return st.one_of(st.integers(0, MASK), near, edges)


@given(slots=st.sampled_from(SLOT_COUNTS + [256, 2**20]), own=st.integers(0, MASK), data=st.data())
@settings(max_examples=250, deadline=None)
def test_hostile_consumer_index_yields_space_in_range_or_bad(
    slots: int, own: int, data: st.DataObject
):
    mem, ring = new_ring(min(slots, 64), own)  # only the header is read
    peer = data.draw(_peer_values(slots, own))
    ring.cons = peer
    space = kit.shm_test_prod_space(ring, own, slots)
    assert space == BAD or 0 <= space <= slots
    used = dist(own, peer)
    assert space == (BAD if used > slots else slots - used)


@given(slots=st.sampled_from(SLOT_COUNTS + [256, 2**20]), own=st.integers(0, MASK), data=st.data())
@settings(max_examples=250, deadline=None)
def test_hostile_producer_index_yields_avail_in_range_or_bad(
    slots: int, own: int, data: st.DataObject
):
    mem, ring = new_ring(min(slots, 64), own)
    peer = data.draw(_peer_values(slots, own))
    ring.prod = peer
    avail = kit.shm_test_cons_avail(ring, own, slots)
    assert avail == BAD or 0 <= avail <= slots
    ahead = dist(peer, own)
    assert avail == (BAD if ahead > slots else ahead)
    # A consumer about to sleep sleeps when there is nothing it may consume:
    # an empty ring, or an impossible producer index (a broken peer must not
    # make it spin); it stays awake only for frames it can actually read.
    went = kit.shm_test_cons_prepare_sleep(ring, own, slots)
    assert went == (1 if avail in (0, BAD) else 0)
    assert ring.cons_sleeping == went


@given(
    slots=st.sampled_from(SLOT_COUNTS),
    index=st.integers(0, MASK),
    sleeping=st.integers(0, MASK),
)
@settings(max_examples=200, deadline=None)
def test_any_nonzero_sleep_flag_means_notify(slots: int, index: int, sleeping: int):
    mem, ring = new_ring(slots, index)
    ring.cons_sleeping = sleeping
    assert kit.shm_test_prod_needs_notify(ring) == (1 if sleeping else 0)
