"""The IO-thread test rig (testkit/iorig.py) that the IO thread's tests
share: its guard areas catch a write outside a region, and every rig
leaves no fd behind whether its thread ran or not."""

from __future__ import annotations

import os

from pyvmm._native import lib
from testkit.iorig import GUARD, GuardedBuffer, IoRig, ShmRig, Solo5Rig


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_write_into_a_region_keeps_the_guards_one_past_it_does_not():
    buffer = GuardedBuffer(128, 256)
    assert buffer.offsets == [GUARD, 2 * GUARD + 128]
    buffer.at(1)[0:256] = b"\x01" * 256
    assert buffer.intact()
    buffer.at(1)[256] = 1  # the first byte of the last guard
    assert not buffer.intact()


def test_every_rig_closes_what_it_opened():
    before = open_fds()
    for make in (IoRig, ShmRig, Solo5Rig):
        with make() as rig:
            rig.tap()
    started = ShmRig(mode=lib.IO_MODE_EVENT)
    started.start()
    started.close()
    started.close()  # twice is fine
    assert open_fds() == before
