"""pyvmm releases everything it acquired on every exit path: file
descriptors (/dev/kvm, VM, vCPU, taps, block files, eventfds, stats fd),
the IO thread, guest memory. Checked in-process, where a leak would show."""

from __future__ import annotations

import os

import pytest

from conftest import guest
from pyvmm.config import VmConfig
from pyvmm.errors import PyvmmError
from pyvmm.vmm import Vmm
from testkit.netns import NetNamespace

pytestmark = [
    pytest.mark.kvm,
    pytest.mark.netns,
]


def resources() -> tuple[int, int, int]:
    """Open fds, threads, and mapped bytes of this process."""
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    with open("/proc/self/statm") as f:
        vm_pages = int(f.read().split()[0])
    return fds, threads, vm_pages


def run_in(ns: NetNamespace, config: VmConfig) -> int | str:
    with ns.inside():
        try:
            with Vmm(config) as vmm:
                devnull = os.open(os.devnull, os.O_WRONLY)
                saved = os.dup(1)
                os.dup2(devnull, 1)  # the guest's console
                try:
                    return vmm.run()
                finally:
                    os.dup2(saved, 1)
                    os.close(saved)
                    os.close(devnull)
        except PyvmmError as err:
            return str(err)


def nets() -> dict[str, str]:
    return {"service0": "tap100"}


CASES = {
    # The guest halts on its own.
    "halt": lambda shm: (VmConfig(kernel=str(guest("args")), guest_args=["3"]), 3),
    # A guest fault ends the run.
    "fault": lambda shm: (VmConfig(kernel=str(guest("fault_badptr"))), "guest fault"),
    # A net guest served by the IO thread through shmstream rings.
    "shmstream": lambda shm: (
        VmConfig(
            kernel=str(guest("hostile")), guest_args=["200"], devices={"net": nets()}, shm=shm
        ),
        1 if shm == "off" else 0,  # with --shm=off it finds no ring to attack
    ),
    # A net guest whose IO thread serves Solo5's ring (none with --shm=off).
    "solo5-ring": lambda shm: (
        VmConfig(
            kernel=str(guest("hostile_s5")), guest_args=["200"], devices={"net": nets()}, shm=shm
        ),
        1 if shm == "off" else 0,
    ),
    # Taps open, VM and memory exist, then set-up fails (MTU 9000 does not
    # fit a shmstream slot): nothing acquired so far may stay behind.
    "fails-after-tap": lambda shm: (
        VmConfig(kernel=str(guest("ping")), devices={"net": nets()}, shm=shm),
        "too large for shmstream",
    ),
}


MODES = ["off", "poll", "event", "hybrid"]
PATHS = [("halt", None), ("fault", None)]
PATHS += [(case, shm) for case in ("shmstream", "solo5-ring") for shm in MODES]
PATHS += [("fails-after-tap", shm) for shm in MODES if shm != "off"]


@pytest.mark.parametrize("case, shm", PATHS)
def test_every_exit_path_releases_everything(case, shm):
    config, expected = CASES[case](shm)
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24", mtu=9000 if case == "fails-after-tap" else None)
        run_in(ns, CASES["halt"](shm)[0])  # warm up lazy imports and caches
        before = resources()
        for _ in range(3):
            result = run_in(ns, config)
        after = resources()
    if isinstance(expected, str):
        assert isinstance(result, str) and expected in result, result
    else:
        assert result == expected
    assert after[0] == before[0], f"file descriptors leaked: {before[0]} -> {after[0]}"
    assert after[1] == before[1], f"threads leaked: {before[1]} -> {after[1]}"
    assert after[2] - before[2] < 4096, "guest memory mappings leaked"
