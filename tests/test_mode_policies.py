"""Each IO-thread mode's policy (docs/modes.md), observed from the thread's
own counters (csrc/iothread.h, struct io_stats: ``sleeps``, ``wakeups``,
``kicks``, ``busy_passes``, ``idle_spins``) and the run's own timestamps
(each snapshot's ``seconds``), never from how long anything took.

One run per mode of a real guest (udpsink) on shmstream: it idles, then
receives a steady stream of datagrams (one every 0.5 ms), then idles again
until it ends. Snapshots every 100 ms with --stats-json. The oracles:

- poll never sleeps: ``sleeps`` and ``wakeups`` stay 0, its guest never
  kicks (poll mode never asks it to), and it spins;
- event never spins: ``idle_spins`` stays 0, and every sleep ends in a
  wake-up (``sleeps`` is ``wakeups`` or one more, while it sleeps);
- hybrid sleeps only after a work-free stretch of its budget B: after a
  wake-up (or the thread's start) it keeps polling for B before the next
  sleep, so consecutive sleeps are at least B apart and any stretch of d
  seconds holds at most d / B + 1 of them. Checked for every interval and
  for the whole run (the thread starts less than B before the guest); with
  the stream (gaps far below B) that leaves no room to sleep per frame,
  while a thread that sleeps at once sleeps about once per frame. In the
  intervals that moved frames it polls (``idle_spins`` grows).
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from conftest import guest
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

TAP = "tap100"
GUEST_IP = "10.0.0.2"
GUEST_MAC = "02:00:00:00:00:02"
#: The hybrid budget under test, in microseconds: far above the stream's
#: gap between frames (500 us), far below the idle stretches.
BUDGET_US = 50_000
#: The stream: frames and their rate (one at a time, not in bursts).
FRAMES, RATE = 1500, 2000
#: How long the guest idles before the stream (it idles again afterwards,
#: IDLE_END_MS, until it ends).
IDLE_BEFORE_S = 0.5
IDLE_END_MS = 600


def mode_run(shm: str, tmp_path) -> dict:
    """One run in ``shm`` mode: its snapshots and what the guest counted."""
    path = tmp_path / f"{shm}.jsonl"
    extra = [f"--hybrid-budget={BUDGET_US}"] if shm == "hybrid" else []
    with NetNamespace() as ns:
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        ns.add_tap(TAP, address="10.0.0.1/24")
        ns.run(["ip", "neigh", "replace", GUEST_IP, "lladdr", GUEST_MAC, "dev", TAP], check=True)
        vm, head = ns.start_pyvmm(
            "--stats=100ms",
            f"--stats-json={path}",
            f"--shm={shm}",
            *extra,
            f"--net:service0={TAP}",
            f"--net-mac:service0={GUEST_MAC}",
            guest("udpsink"),
            GUEST_IP,
            "5000",
            "0",
            str(IDLE_END_MS),
        )
        time.sleep(IDLE_BEFORE_S)  # the idle stretch: no assertion rests on its length
        ns.run(
            [sys.executable, "-m", "testkit.traffic", GUEST_IP, "5000"]
            + ["--count", str(FRAMES), "--rate", str(RATE), "--batch", "1", "--size", "200"],
            capture_output=True,
            check=True,
            timeout=120,
        )
        out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0, head + out + err
    snaps = [json.loads(x) for x in path.read_text().splitlines()]
    assert all(s["shmstream"]["mode"] == shm for s in snaps)
    frames = int(helpers.guest_report(head + out)["frames"])
    assert frames > 0
    return {"snaps": snaps, "frames": frames, "err": err}


def thread(snap: dict) -> dict[str, int]:
    return snap["shmstream"]["thread"]


def rx_frames(snap: dict) -> int:
    return snap["shmstream"]["devices"]["service0"]["rx_frames"]


def intervals(snaps: list[dict]) -> list[tuple[dict, dict]]:
    return list(zip(snaps[:-1], snaps[1:], strict=True))


def test_poll_never_sleeps(tmp_path):
    run = mode_run("poll", tmp_path)
    for snap in run["snaps"]:
        t = thread(snap)
        assert t["sleeps"] == t["wakeups"] == t["kicks"] == 0, t
    spins = [thread(s)["idle_spins"] for s in run["snaps"]]
    assert spins == sorted(spins) and spins[-1] > 0
    assert thread(run["snaps"][-1])["busy_passes"] > 0


def test_event_never_spins(tmp_path):
    run = mode_run("event", tmp_path)
    for snap in run["snaps"]:
        t = thread(snap)
        assert t["idle_spins"] == 0, t
        assert t["wakeups"] <= t["sleeps"] <= t["wakeups"] + 1, t
    final = thread(run["snaps"][-1])
    assert final["sleeps"] > 0 and final["busy_passes"] > 0


def sleeps_allowed(seconds: float) -> float:
    """The most sleeps a stretch of ``seconds`` holds, B apart."""
    return seconds / (BUDGET_US / 1e6) + 1


def test_hybrid_sleeps_only_after_its_budget_without_work(tmp_path):
    run = mode_run("hybrid", tmp_path)
    snaps = run["snaps"]
    for snap in snaps:
        t = thread(snap)
        assert t["wakeups"] <= t["sleeps"] <= t["wakeups"] + 1, t
    final = snaps[-1]
    assert thread(final)["sleeps"] <= sleeps_allowed(final["seconds"]), thread(final)
    streamed = []
    for prev, snap in intervals(snaps):
        slept = thread(snap)["sleeps"] - thread(prev)["sleeps"]
        duration = snap["seconds"] - prev["seconds"]
        assert slept <= sleeps_allowed(duration), (slept, duration, thread(snap))
        if rx_frames(snap) > rx_frames(prev):
            streamed.append((prev, snap))
    assert len(streamed) >= 4  # the stream spanned several intervals
    # With work arriving it polls between frames: every interval inside the
    # stream (its first and last may hold only its edge) spun.
    for prev, snap in streamed[1:-1]:
        assert thread(snap)["idle_spins"] > thread(prev)["idle_spins"]
    # It slept at all: after the stream it went back to sleep.
    assert thread(final)["sleeps"] >= 1
