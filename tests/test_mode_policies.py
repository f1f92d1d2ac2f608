"""Each IO-thread mode's policy (docs/modes.md), observed from the thread's
own counters (csrc/iothread.h, struct io_stats: ``sleeps``, ``wakeups``,
``kicks``, ``busy_passes``, ``idle_spins``) and the run's own timestamps
(each snapshot's ``seconds``), never from how long anything took.

One run per mode and per service the IO thread runs (shmstream, with
udpsink; Solo5's own ring, with s5ring): the guest idles, then receives a
steady stream of datagrams (one every 0.5 ms), then idles again until it
ends. Snapshots every 100 ms with --stats-json. The oracles:

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

Over Solo5's ring the IO thread polls idle (hybrid's budget, lingering
after reads) only when it has a CPU of its own (``--pin=io=``), so the
modes are observed over Solo5's ring pinned. With
``--net-ring-kicks=exit``, unpinned, the guest kicks after every
submission and the vCPU thread serves each kick at its exit
(``kicks_inline``), and the thread, asleep, is woken only for a kick
handed to it (``kicks_passed``), never per read: observed too.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from conftest import guest
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


#: The IO thread's two services (docs/modes.md): a guest for each, its
#: arguments, and how it ends. udpsink (shmstream) ends IDLE_END_MS after
#: the stream; s5ring (Solo5's own ring: it reads the stream and answers
#: nothing but pings and ARP) after answering PINGS pings.
PINGS = 3
SERVICES = {
    "shmstream": ("udpsink", (GUEST_IP, "5000", "0", str(IDLE_END_MS))),
    "solo5_ring": ("s5ring", (GUEST_IP, str(PINGS))),
}


def end_with_pings(ns: NetNamespace, vm) -> None:
    """Ping s5ring, one at a time, until it has answered PINGS and ended.
    A slow guest may still hold part of the stream in the tap's queue, and
    a ping that meets the queue full is dropped (the tap counts it): that
    is not what these tests are about, so a lost ping is sent again."""
    for _ in range(PINGS + 30):
        if vm.poll() is not None:
            return
        ns.run(["ping", "-c", "1", "-W", "1", GUEST_IP], capture_output=True, timeout=30)
    raise AssertionError("s5ring did not end after its pings")


def mode_run(shm: str, service: str, tmp_path, *options: str) -> list[dict]:
    """One run in ``shm`` mode of ``service``'s guest, with pyvmm's
    ``options``: its snapshots."""
    path = tmp_path / f"{shm}.jsonl"
    extra = [f"--hybrid-budget={BUDGET_US}", *options] if shm == "hybrid" else [*options]
    name, args = SERVICES[service]
    with NetNamespace() as ns:
        ns.add_quiet_tap(TAP, neighbour=(GUEST_IP, GUEST_MAC))
        vm, head = ns.start_pyvmm(
            "--stats=100ms",
            f"--stats-json={path}",
            f"--shm={shm}",
            *extra,
            f"--net:service0={TAP}",
            f"--net-mac:service0={GUEST_MAC}",
            guest(name),
            *args,
        )
        time.sleep(IDLE_BEFORE_S)  # the idle stretch: no assertion rests on its length
        ns.run(
            [sys.executable, "-m", "testkit.traffic", GUEST_IP, "5000"]
            + ["--count", str(FRAMES), "--rate", str(RATE), "--batch", "1", "--size", "200"],
            capture_output=True,
            check=True,
            timeout=120,
        )
        if service == "solo5_ring":
            end_with_pings(ns, vm)
        out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0 and "SUCCESS" in out, head + out + err
    snaps = [json.loads(x) for x in path.read_text().splitlines()]
    assert all(s[service]["mode"] == shm for s in snaps)
    assert moved(snaps[-1]) > 0
    return snaps


def thread(snap: dict) -> dict[str, int]:
    return (snap.get("shmstream") or snap["solo5_ring"])["thread"]


def moved(snap: dict) -> int:
    """Bytes the IO thread moved to the guest so far."""
    if "shmstream" in snap:
        return snap["shmstream"]["devices"]["service0"]["rx_bytes"]
    return snap["solo5_ring"]["ring"]["read_bytes"]


def intervals(snaps: list[dict]) -> list[tuple[dict, dict]]:
    return list(zip(snaps[:-1], snaps[1:], strict=True))


#: Unpinned, the IO thread serving Solo5's ring never polls idle
#: (csrc/iothread.h, idle_poll): the policies are observed pinned.
SERVED_BY_THE_THREAD_WITH = {"shmstream": (), "solo5_ring": ("--pin=io=1",)}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_poll_never_sleeps(service, tmp_path):
    snaps = mode_run("poll", service, tmp_path, *SERVED_BY_THE_THREAD_WITH[service])
    for snap in snaps:
        t = thread(snap)
        assert t["sleeps"] == t["wakeups"] == t["kicks"] == 0, t
    spins = [thread(s)["idle_spins"] for s in snaps]
    assert spins == sorted(spins) and spins[-1] > 0
    assert thread(snaps[-1])["busy_passes"] > 0


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_event_never_spins(service, tmp_path):
    snaps = mode_run("event", service, tmp_path, *SERVED_BY_THE_THREAD_WITH[service])
    for snap in snaps:
        t = thread(snap)
        assert t["idle_spins"] == 0, t
        assert t["wakeups"] <= t["sleeps"] <= t["wakeups"] + 1, t
    final = thread(snaps[-1])
    assert final["sleeps"] > 0 and final["busy_passes"] > 0


def sleeps_allowed(seconds: float) -> float:
    """The most sleeps a stretch of ``seconds`` holds, B apart."""
    return seconds / (BUDGET_US / 1e6) + 1


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_hybrid_sleeps_only_after_its_budget_without_work(service, tmp_path):
    snaps = mode_run("hybrid", service, tmp_path, *SERVED_BY_THE_THREAD_WITH[service])
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
        if moved(snap) > moved(prev):
            streamed.append((prev, snap))
    assert len(streamed) >= 4  # the stream spanned several intervals
    # With work arriving it polls between frames: every interval inside the
    # stream (its first and last may hold only its edge) spun.
    for prev, snap in streamed[1:-1]:
        assert thread(snap)["idle_spins"] > thread(prev)["idle_spins"]
    # It slept at all: after the stream it went back to sleep.
    assert thread(final)["sleeps"] >= 1


@pytest.mark.parametrize("shm", ["event", "hybrid"])
def test_kicks_at_exit_the_vcpu_thread_serves_solo5s_ring_and_the_thread_sleeps(shm, tmp_path):
    """With --net-ring-kicks=exit, unpinned, in event and hybrid mode, the
    guest kicks Solo5's ring after every submission and the vCPU thread
    serves the kick at its exit (the guest's commit is there when it
    resumes). The IO thread, asleep after
    its first passes, is woken only for a kick handed to it while it held
    the ring, never per read, and never polls idle, whatever hybrid's
    budget."""
    snaps = mode_run(shm, "solo5_ring", tmp_path, "--net-ring-kicks=exit")
    for snap in snaps:
        t = thread(snap)
        ring = snap["solo5_ring"]["ring"]
        assert t["idle_spins"] == 0, t
        assert t["wakeups"] <= t["sleeps"] <= t["wakeups"] + 1, t
        # Its only wake-ups: a kick handed over, and the stop at the end.
        assert t["wakeups"] <= ring["kicks_passed"] + 1, (t, ring)
    ring = snaps[-1]["solo5_ring"]["ring"]
    # The stream's frames arrive one at a time: a kick for (nearly) each.
    assert ring["reads"] >= FRAMES // 2, ring
    assert ring["kicks_inline"] >= ring["reads"] // 4, ring
    streamed = [(p, s) for p, s in intervals(snaps) if moved(s) > moved(p)]
    assert len(streamed) >= 4
    for prev, snap in streamed[1:-1]:
        before, after = prev["solo5_ring"]["ring"], snap["solo5_ring"]["ring"]
        assert after["kicks_inline"] > before["kicks_inline"], (before, after)
