"""A thread's context switches as --stats-json counts them
(pyvmm/host/threadswitches.py): counted from when counting starts, kept
once the thread has ended."""

from __future__ import annotations

import os
import threading
import time

from pyvmm.host.threadswitches import SWITCH_KEYS, ThreadSwitches, _parse


def test_a_thread_that_sleeps_switches_voluntarily_each_time():
    ready, go, done, leave = (threading.Event() for _ in range(4))
    tid = []

    def sleeper() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        go.wait()
        for _ in range(50):
            time.sleep(0.0005)  # each one blocks: a voluntary switch
        done.set()
        leave.wait()

    t = threading.Thread(target=sleeper)
    t.start()
    ready.wait()
    counted = ThreadSwitches(tid[0])
    try:
        before = counted.read()
        assert before["voluntary_switches"] <= 2  # only from when counting starts
        go.set()
        done.wait()
        during = counted.read()
        assert during["voluntary_switches"] >= 50
        leave.set()
        t.join()
        # join() returns before the kernel has removed the thread, which may
        # still block once more on its way out: wait until it is really gone.
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/self/task/{tid[0]}"):
            assert time.monotonic() < deadline, "the ended thread never left /proc"
            time.sleep(0.001)
        # Its task file reads no more: the last good reading stays.
        last = counted.read()
        assert last["voluntary_switches"] >= during["voluntary_switches"]
        assert counted.read() == last
    finally:
        counted.close()
    assert counted.read() == last


def test_keys_and_the_status_lines_they_come_from():
    text = b"Name:\tx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n"
    assert _parse(text) == (12, 3)
    assert _parse(b"Name:\tx\n") is None
    assert SWITCH_KEYS == ("voluntary_switches", "involuntary_switches")
