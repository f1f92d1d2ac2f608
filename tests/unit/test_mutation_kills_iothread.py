"""What a snapshot needs of the IO thread: a link's ring indices and the
counters continued from the snapshot are the ones read back
(devices/iothread.py, csrc/iothread_shm.c), and a paused thread moves no
frame until it is resumed (csrc/iothread.c)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from pyvmm._native import ffi
from pyvmm.common.errors import HostError
from pyvmm.devices.iothread import LINK_COUNTERS, MODES, THREAD_COUNTERS, IoConfig, IoThread
from testkit.native import lib as kit


@pytest.fixture
def thread():
    """An IO thread (not started) with two shmstream links."""
    io = IoThread(IoConfig(), -1, -1)
    size = kit.shm_test_ring_size(8)
    rings = ffi.new("uint8_t[]", 4 * size)
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(2)]
    for i, (a, _) in enumerate(pairs):
        a.setblocking(False)
        rx = ffi.cast("uint8_t *", rings) + 2 * i * size
        assert io.add_link(a.fileno(), rx, rx + size, 8) == i
    yield io
    io.close()
    for a, b in pairs:
        a.close()
        b.close()


def test_a_link_s_indices_are_the_ones_set_and_each_link_has_its_own(thread):
    assert thread.link_indices(0) == (0, 0)
    thread.set_link_indices(0, 5, 0xFFFFFFF9)
    thread.set_link_indices(1, 7, 3)
    assert thread.link_indices(0) == (5, 0xFFFFFFF9)
    assert thread.link_indices(1) == (7, 3)
    with pytest.raises(HostError, match="no link 2"):
        thread.link_indices(2)
    with pytest.raises(HostError, match="cannot set link 2's indices"):
        thread.set_link_indices(2, 0, 0)


def test_counters_continued_from_a_snapshot_are_the_ones_read(thread):
    link = {name: 100 + i for i, name in enumerate(LINK_COUNTERS)}
    thread.set_counters("link", link, link=1)
    assert thread.link_counters(1) == link
    assert set(thread.link_counters(0).values()) == {0}
    stats = {name: 1000 + i for i, name in enumerate(THREAD_COUNTERS)}
    thread.set_counters("thread", stats)
    read = thread.thread_counters()
    assert {name: read[name] for name in THREAD_COUNTERS} == stats


# -- io_pause / io_resume (csrc/iothread.c): a snapshot's quiescence -------------


def _in_time(what: str, call, seconds: float = 10.0) -> None:
    """``call()`` on a helper thread; a failure if it has not returned in time."""
    done = threading.Event()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    if not done.wait(seconds):
        pytest.fail(f"{what} did not return within {seconds} s")


def _received(rig, want: bytes, seconds: float = 10.0) -> None:
    """The guest's side gets ``want`` (and nothing else) in time."""
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while got != [want]:
        if time.monotonic() > deadline:
            pytest.fail(f"the guest got {got}, not [{want!r}], within {seconds} s")
        time.sleep(0.005)
        got += rig.guest_receive()


@pytest.mark.parametrize("mode", ["poll", "event", "hybrid"])
def test_a_paused_thread_moves_no_frame_until_it_is_resumed(mode):
    from pyvmm._native import lib
    from testkit.iorig import ShmRig

    rig = ShmRig(slots=8, mode=MODES[mode], budget_us=100)
    try:
        rig.start()
        for n in range(2):  # a second pause asks again and is held again
            rig.backend_send([b"%d-before" % n])
            _received(rig, b"%d-before" % n)
            _in_time("io_pause", lambda: lib.io_pause(rig.io))
            rig.backend_send([b"%d-held" % n])
            time.sleep(0.1)
            assert rig.guest_receive() == [], "a frame moved while the thread was paused"
            assert rig.count()["rx_frames"] == 2 * n + 1
            _in_time("io_resume", lambda: lib.io_resume(rig.io))
            _received(rig, b"%d-held" % n)
    finally:
        rig.close()
