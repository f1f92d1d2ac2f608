"""Two-thread stress of one shmstream ring (shm_test_stress in testkit/csrc/shm_testing.c).

A C producer pthread and a C consumer pthread run the shared ring operations
(csrc/shmstream_ring.h) flat out on two cores.  Every frame carries its
sequence number and a checksum of its payload, and its length is a function
of its number (16 bytes up to a full slot), so the consumer detects any lost,
duplicated, reordered, torn or truncated frame.  Indices start just below
2**32, so every run crosses the wrap of the free-running counters.
"""

from __future__ import annotations

import pytest

from testkit.native import ffi, lib

NEAR_WRAP = 2**32 - 1000
TIMEOUT_MS = 15_000  # without any frame moving: a stuck ring, not a slow one
INTEGRITY = ("out_of_order", "bad_length", "bad_checksum", "bad_index")


def stress(
    slots: int,
    frames: int,
    *,
    max_batch: int = 16,
    flags: int = 0,
    consumer_spin: int = 0,
    start: int = NEAR_WRAP,
) -> dict[str, int]:
    out = ffi.new("struct shm_stress_result *")
    rc = lib.shm_test_stress(slots, frames, start, max_batch, flags, consumer_spin, TIMEOUT_MS, out)
    assert rc == 0
    result = {name: getattr(out, name) for name, _ in ffi.typeof("struct shm_stress_result").fields}
    assert result["timed_out"] == 0, f"stalled: {result}"
    for name in INTEGRITY:
        assert result[name] == 0, f"{name}: {result}"
    return result


@pytest.mark.parametrize(
    "slots, max_batch",
    [(64, 32), (256, 64), (8, 8)],
    ids=["64-slots", "256-slots", "8-slots"],
)
def test_two_million_frames_arrive_intact_in_order_without_loss_or_duplicates(
    slots: int, max_batch: int
):
    n = 2_000_000
    r = stress(slots, n, max_batch=max_batch)
    assert r["sent"] == n
    assert r["delivered"] == n
    assert r["dropped"] == 0
    assert r["gaps"] == 0
    assert r["last_seq"] == n - 1


def test_one_slot_ring_hands_every_frame_over_alone():
    """slots = 1: full after every frame, empty after every read."""
    n = 200_000
    r = stress(1, n, max_batch=4, start=2**32 - 7)
    assert r["delivered"] == n and r["gaps"] == 0 and r["last_seq"] == n - 1


def test_producer_that_drops_when_full_accounts_for_every_frame():
    n = 2_000_000
    r = stress(8, n, max_batch=8, flags=lib.SHM_STRESS_DROP_WHEN_FULL, consumer_spin=5)
    assert r["sent"] == n
    assert r["dropped"] > 0, "the consumer kept up: nothing was tested"
    assert r["delivered"] > 0
    assert r["delivered"] + r["dropped"] == n
    # The consumer's view agrees frame by frame: every number it never saw,
    # in the middle of the stream or after its last frame, is one dropped.
    missing = r["gaps"] + (n - 1 - r["last_seq"])
    assert missing == r["dropped"]


def test_sleeping_consumer_is_always_woken():
    """The sleep-flag handshake under real concurrency, with full fences.

    The consumer announces sleep whenever the ring is empty and blocks on an
    eventfd; the producer signals it only when needs_notify says so.  A lost
    wake-up would leave the consumer asleep with frames waiting (counted
    after a second without a signal) or stall a producer on a full ring.
    """
    n = 1_000_000
    # A small ring: a lost wake-up after the publish that fills it leaves
    # the producer spinning on a full ring, and the loss shows.
    r = stress(4, n, max_batch=4, flags=lib.SHM_STRESS_SLEEPING_CONSUMER)
    assert r["delivered"] == n and r["gaps"] == 0
    assert r["sleeps"] > 0, "the consumer never slept: the handshake was not exercised"
    assert r["notifies"] > 0
    assert r["lost_wakeups"] == 0


def test_stress_helper_rejects_bad_arguments():
    out = ffi.new("struct shm_stress_result *")
    assert lib.shm_test_stress(3, 10, 0, 1, 0, 0, 1000, out) < 0
    assert lib.shm_test_stress(0, 10, 0, 1, 0, 0, 1000, out) < 0
    assert lib.shm_test_stress(4, 10, 0, 0, 0, 0, 1000, out) < 0
