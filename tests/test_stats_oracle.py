"""Oracles for --stats=INTERVAL with --stats-json: the numbers pyvmm shows
checked against sources that are not pyvmm's own arithmetic.

On each path frames take to a guest (the hypercalls and shmstream, with
udpsink; Solo5's own ring, with s5ring) a real guest receives real
datagrams through a tap in a namespace the test creates, first while it
runs, then a burst while pyvmm is stopped (SIGSTOP), so the tap's queue
overflows and the kernel drops frames. Then:

- each interval's count (the difference of two consecutive snapshots) is
  never negative, and the intervals, the part before the first snapshot and
  the tail up to the final record add up to the final cumulative counter,
  which equals what the guest itself counted (udpsink's report on its
  console; s5ring keeps no count, so there the kernel's stands in);
- each row of the live view shows, in its frame, byte, tap drop, exit, IO
  thread and CPU columns (read by their headings, as docs/stats.md defines
  them), that interval's count divided by its own duration (the difference
  of the two snapshots' ``seconds``), to the row's whole-number rounding;
  so the rows' rates times their durations rebuild the interval counts;
- the frames the guest got equal the tap's own kernel counters read with
  pyroute2 over netlink inside the namespace (not pyvmm's reader): the
  packets the tap handed to its reader (``tx_packets``, which the tun driver
  counts only for frames read, never for those it dropped), while the
  frames the kernel dropped (``tx_dropped``) and the guest's add up to what
  the sender had accepted.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable

import pytest
from test_stats import live_rows

from conftest import guest
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

TAP = "tap100"
GUEST_IP = "10.0.0.2"
GUEST_MAC = "02:00:00:00:00:02"
PORT = "5000"

#: Per path: the --shm value, the guest, and the snapshot's counters of
#: frames and bytes to the guest. s5ring (Solo5's own ring) reads the
#: datagrams and ends after answering PINGS pings; udpsink ends when idle.
PINGS = 3
PATHS = {
    "hypercalls": (
        "off",
        "udpsink",
        (("taps", "service0", "tx_packets"), ("taps", "service0", "tx_bytes")),
    ),
    "shmstream": (
        "event",
        "udpsink",
        (
            ("shmstream", "devices", "service0", "rx_frames"),
            ("shmstream", "devices", "service0", "rx_bytes"),
        ),
    ),
    "solo5_ring": (
        "event",
        "s5ring",
        (("solo5_ring", "ring", "reads"), ("solo5_ring", "ring", "read_bytes")),
    ),
}
GUEST_ARGS = {"udpsink": (GUEST_IP, PORT, "0", "700"), "s5ring": (GUEST_IP, str(PINGS))}


def counter(snap: dict, path: tuple[str, ...]) -> int:
    for key in path:
        snap = snap[key]
    return int(snap)


def kernel_counters(ns: NetNamespace) -> dict[str, int]:
    """The tap's stats64 as pyroute2 reads them: not pyvmm's reader."""
    with ns.iproute() as ipr:
        return dict(ipr.get_links(ifname=TAP)[0].get("stats64"))


def send(ns: NetNamespace, count: int, rate: int, size: int) -> int:
    """Datagrams the sender's kernel accepted (what it reports as sent)."""
    done = ns.run(
        [sys.executable, "-m", "testkit.traffic", GUEST_IP, PORT]
        + ["--count", str(count), "--rate", str(rate), "--size", str(size)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return int(json.loads(done.stdout)["sent"])


def ping_until_it_ends(ns: NetNamespace, vm) -> int:
    """Pings sent, one at a time, until s5ring has answered PINGS and ended
    (one that met the tap's queue still full is dropped, and sent again)."""
    for sent in range(PINGS + 30):
        if vm.poll() is not None:
            return sent
        ns.run(["ping", "-c", "1", "-W", "1", GUEST_IP], capture_output=True, timeout=30)
    raise AssertionError("s5ring did not end after its pings")


@pytest.fixture(scope="module", params=sorted(PATHS))
def flooded_run(request, tmp_path_factory):
    """One run per path (the hypercalls, shmstream, Solo5's ring): its
    snapshots, its stderr, the guest's own count (udpsink's report), what
    was sent and the tap's kernel counters before and after."""
    shm, name, counters = PATHS[request.param]
    path = tmp_path_factory.mktemp(f"oracle-{request.param}") / "stats.jsonl"
    with NetNamespace() as ns:
        ns.add_quiet_tap(TAP, neighbour=(GUEST_IP, GUEST_MAC))  # the flood's frames only
        before = kernel_counters(ns)
        vm, head = ns.start_pyvmm(
            "--stats=100ms",
            f"--stats-json={path}",
            f"--shm={shm}",
            f"--net:service0={TAP}",
            f"--net-mac:service0={GUEST_MAC}",
            guest(name),
            *GUEST_ARGS[name],
        )
        sent = send(ns, 3000, 6000, 700)
        vm.send_signal(signal.SIGSTOP)
        try:
            sent += send(ns, 3000, 20000, 300)
        finally:
            vm.send_signal(signal.SIGCONT)
        pings = ping_until_it_ends(ns, vm) if name == "s5ring" else 0
        out, err = vm.communicate(timeout=60)
        after = kernel_counters(ns)
    assert vm.returncode == 0 and "SUCCESS" in out, head + out + err
    snaps = [json.loads(x) for x in path.read_text().splitlines()]
    report = helpers.guest_report(head + out)
    return {
        "counters": counters,
        "snaps": snaps,
        "err": err,
        "frames": int(report["frames"]) if name == "udpsink" else None,
        "sent": sent,
        "pings": pings,
        "kernel": {k: after[k] - before.get(k, 0) for k in after},
    }


def test_interval_counts_add_up_to_the_final_counters(flooded_run):
    frames_path, bytes_path = flooded_run["counters"]
    snaps = flooded_run["snaps"]
    assert [s["record"] for s in snaps[-1:]] == ["final"] and len(snaps) >= 5
    for path in (frames_path, bytes_path):
        totals = [counter(s, path) for s in snaps]
        # Before the first snapshot, each interval, and the tail to the end.
        parts = [totals[0]] + [b - a for a, b in zip(totals[:-1], totals[1:], strict=True)]
        assert all(p >= 0 for p in parts), (path, parts)
        assert sum(parts) == totals[-1]
    if flooded_run["frames"] is not None:  # the guest's own count
        assert counter(snaps[-1], frames_path) == flooded_run["frames"]


def test_each_rate_is_its_interval_count_over_its_own_duration(flooded_run):
    frames_path, bytes_path = flooded_run["counters"]
    intervals = [s for s in flooded_run["snaps"] if s["record"] == "interval"]
    rows = live_rows(flooded_run["err"])
    # One row per interval record, the same sample; the first row's baseline
    # is taken before the guest starts and written nowhere, so it is left out.
    assert len(rows) == len(intervals) >= 4
    moved = 0
    for prev, snap, row in zip(intervals[:-1], intervals[1:], rows[1:], strict=True):
        duration = snap["seconds"] - prev["seconds"]
        assert duration > 0
        assert float(row["time: s"]) == pytest.approx(snap["seconds"], abs=0.05 + 1e-9)
        for column, read, unit in columns(snap, frames_path, bytes_path):
            count = read(snap) - read(prev)
            shown = int(row[column])
            assert abs(shown - count / duration / unit) <= 0.5 + 1e-6, (column, shown, count)
            if unit == 1:
                # The rate times the duration gives the count back, to rounding.
                assert abs(shown * duration - count) <= 0.5 * duration + 1e-6, column
        moved += counter(snap, frames_path) - counter(prev, frames_path)
    assert moved > 0  # the flood fell inside the checked intervals


def io_counter(section: str, key: str) -> Callable[[dict], float]:
    """The IO thread's counter ``key`` (struct io_stats, or its CPU time)."""
    return lambda snap: snap[section]["thread"][key]


def tap_drops(snap: dict) -> int:
    """Both directions of every tap, as the kernel counted them."""
    return sum(t["tx_dropped"] + t["rx_dropped"] for t in snap["taps"].values())


#: A live column: its heading, the snapshot's counter it is the rate of,
#: and the unit the rate is shown in.
Column = tuple[str, Callable[[dict], float], float]


def columns(snap: dict, frames_path: tuple, bytes_path: tuple) -> list[Column]:
    """The live view's columns as docs/stats.md defines them."""
    found: list[Column] = [
        ("net service0: rx fr/s", lambda s: counter(s, frames_path), 1),
        ("net service0: rx kB/s", lambda s: counter(s, bytes_path), 1000),
        ("dropped: tap/s", tap_drops, 1),
        ("VM exits: KVM/s", lambda s: s["kvm"]["exits"], 1),
        ("VM exits: to pyvmm/s", lambda s: sum(s["exits_to_pyvmm"].values()), 1),
        ("CPU: vCPU %", lambda s: s["vcpu_thread_cpu_ns"], 1e7),
    ]
    for section in ("shmstream", "solo5_ring"):
        if section in snap:
            found += [
                ("IO thread: kicks/s", io_counter(section, "kicks"), 1),
                ("IO thread: epoll/s", io_counter(section, "wakeups"), 1),
                ("IO thread: spins/s", io_counter(section, "idle_spins"), 1),
                ("CPU: IO %", io_counter(section, "cpu_ns"), 1e7),
            ]
    return found


def test_the_guests_frames_match_the_taps_kernel_counters(flooded_run):
    kernel = flooded_run["kernel"]
    # The guest's own count; s5ring keeps none, so the ring's reads stand in
    # (checked here against the kernel's count, which pyvmm does not make).
    frames = flooded_run["frames"]
    if frames is None:
        frames = counter(flooded_run["snaps"][-1], flooded_run["counters"][0])
    # The burst sent while pyvmm was stopped overflowed the tap's queue.
    assert kernel["tx_dropped"] > 0, kernel
    assert frames == kernel["tx_packets"]
    # Every datagram the sender's kernel accepted reached the tap: the guest
    # took it or the kernel dropped it. Pings (s5ring's end) too, but the
    # last ones may have been sent as the guest ended, after the tap's
    # reader was gone: at least the PINGS answered, at most all sent.
    arrived = frames + kernel["tx_dropped"] - flooded_run["sent"]
    if flooded_run["pings"]:
        assert PINGS <= arrived <= flooded_run["pings"], (arrived, flooded_run["pings"])
        assert kernel["rx_packets"] == PINGS  # its answers, and nothing else
    else:
        assert arrived == 0
    # What pyvmm reported of the tap agrees with the kernel's own count. Its
    # final record is taken as the guest ends, before the tap is let go: a
    # ping sent past the guest's end may still be counted (dropped) after it.
    final = flooded_run["snaps"][-1]["taps"]["service0"]
    late = max(flooded_run["pings"] - PINGS, 0)
    for key in ("tx_packets", "tx_dropped"):
        assert 0 <= kernel[key] - final[key] <= late, (key, kernel[key], final[key])
