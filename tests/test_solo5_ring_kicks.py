"""Who serves a kick of Solo5's ring (docs/solo5-bindings.md, "Who serves
a kick"): by default the IO thread, woken by KVM's ioeventfd, pinned or
not; with --net-ring-kicks=exit the vCPU thread at the kick's exit, in C
and in Python alike. Observed from the counters: the ring's
``kicks_inline`` and ``kicks_passed``, the IO thread's wake-ups and
kicks, and what the C loop answered that was no hypercall."""

from __future__ import annotations

import json
import os

import pytest

from conftest import guest
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

GUEST_IP = "10.0.0.2"
PINGS = 20
#: The fast path's counters that are hypercalls (csrc/hcfast.h): whatever
#: else it answered was a kick of the ring.
HYPERCALL_FIELDS = (
    "walltimes",
    "net_reads",
    "net_writes",
    "polls",
    "block_reads",
    "block_writes",
)


def ring_run(tmp_path, *options: str, python: bool = False, shm: str = "event") -> dict:
    """s5ring in ``shm`` mode answering PINGS pings: its last counters."""
    stats = tmp_path / "stats.json"
    env = dict(os.environ)
    if python:
        env["PYVMM_PY_HYPERCALLS"] = "1"
    with NetNamespace() as ns:
        ns.add_quiet_tap("tap100")
        vm, head = ns.start_pyvmm(
            f"--stats-json={stats}",
            f"--shm={shm}",
            *options,
            "--net:service0=tap100",
            guest("s5ring"),
            GUEST_IP,
            str(PINGS),
            env=env,
        )
        helpers.ping(ns, GUEST_IP, PINGS, interval=0.05)
        out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0 and "SUCCESS" in out, head + out + err
    (line,) = stats.read_text().splitlines()
    return json.loads(line)


@pytest.mark.parametrize("shm", ["event", "hybrid"])
def test_by_default_kvm_takes_the_kicks_and_the_io_thread_serves(tmp_path, shm):
    """Unpinned, the default: every kick stays in the kernel (an exit to
    user space costs about three of them on PVM hosts) and wakes the thread."""
    snap = ring_run(tmp_path, shm=shm)
    ring, thread = snap["solo5_ring"]["ring"], snap["solo5_ring"]["thread"]
    assert ring["reads"] >= PINGS and ring["writes"] >= PINGS, ring
    assert ring["kicks_inline"] == ring["kicks_passed"] == 0, ring
    assert thread["kicks"] >= PINGS and thread["wakeups"] >= PINGS, thread
    fast = snap["hypercalls_in_c"]
    assert fast["answered"] == sum(fast[f] for f in HYPERCALL_FIELDS), fast


@pytest.mark.parametrize("python", [False, True], ids=["C", "Python"])
def test_kicks_at_exit_the_vcpu_thread_serves_every_kick(tmp_path, python):
    snap = ring_run(tmp_path, "--net-ring-kicks=exit", python=python)
    ring, thread = snap["solo5_ring"]["ring"], snap["solo5_ring"]["thread"]
    # Each ping is a read (and a write of the reply): kicks, served at once.
    assert ring["reads"] >= PINGS and ring["writes"] >= PINGS, ring
    assert ring["kicks_inline"] >= PINGS, ring
    # The IO thread, asleep, is woken only for a kick handed to it (and the
    # stop): not once per read, and its ioeventfd never counts a kick.
    assert thread["wakeups"] <= ring["kicks_passed"] + 1, (thread, ring)
    assert thread["kicks"] == ring["kicks_passed"], (thread, ring)
    if python:
        assert "hypercalls_in_c" not in snap
        return
    # In C: every exit the loop answered that was no hypercall was a kick,
    # so no kick reached Python.
    fast = snap["hypercalls_in_c"]
    not_hypercalls = fast["answered"] - sum(fast[f] for f in HYPERCALL_FIELDS)
    assert not_hypercalls == ring["kicks_inline"] + ring["kicks_passed"], (fast, ring)


def test_pinned_the_io_thread_serves_the_ring_and_kvm_takes_the_kicks(tmp_path):
    snap = ring_run(tmp_path, "--pin=io=1")
    ring, thread = snap["solo5_ring"]["ring"], snap["solo5_ring"]["thread"]
    assert ring["reads"] >= PINGS, ring
    assert ring["kicks_inline"] == ring["kicks_passed"] == 0, ring
    assert thread["busy_passes"] > 0 and thread["kicks"] > 0, thread
    fast = snap["hypercalls_in_c"]
    assert fast["answered"] == sum(fast[f] for f in HYPERCALL_FIELDS), fast


def test_unpinned_in_poll_mode_the_spinning_thread_serves_and_no_kick_comes(tmp_path):
    """Poll mode's thread serves the ring as it spins: its guest is never
    asked to kick, so none reaches the vCPU thread (with a CPU free this is
    the quickest round trip; docs/solo5-bindings.md)."""
    snap = ring_run(tmp_path, shm="poll")
    ring, thread = snap["solo5_ring"]["ring"], snap["solo5_ring"]["thread"]
    assert ring["reads"] >= PINGS, ring
    assert ring["kicks_inline"] == ring["kicks_passed"] == 0, ring
    assert thread["busy_passes"] > 0 and thread["sleeps"] == 0, thread
