"""shmstream end to end, in every mode, inside a network namespace the test
creates: ping, UDP echo, and a flood whose every payload the guest checks.
--shm=off is the plain hypercall path, for comparison."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from conftest import guest
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

MODES = ["off", "poll", "event", "hybrid"]
GUEST_IP, GUEST_MAC = "10.0.0.2", "02:00:00:00:00:02"


class Guest:
    """pyvmm running one guest inside the namespace, started and ready."""

    def __init__(self, ns: NetNamespace, mode: str, name: str, *args: str) -> None:
        self.proc, self.head = ns.start_pyvmm(
            helpers.STATS,
            f"--shm={mode}",
            "--net:service0=tap100",
            f"--net-mac:service0={GUEST_MAC}",
            guest(name),
            *args,
        )
        expected = "hypercall" if mode == "off" else "shmstream"
        assert f"path: {expected}" in self.head

    def finish(self, timeout: float = 60) -> tuple[str, dict, dict]:
        out, err = self.proc.communicate(timeout=timeout)
        out = self.head + out
        assert self.proc.returncode == 0, out + err
        assert "SUCCESS" in out
        return out, helpers.guest_report(out), helpers.parse_stats(err)


@contextmanager
def namespace(txqlen: int | None = None) -> Iterator[NetNamespace]:
    """A namespace with tap100; no IPv6 in it, so the only frames on the
    tap are the test's (exact frame counts)."""
    with NetNamespace() as ns:
        ns.add_quiet_tap("tap100", txqlen=txqlen)
        yield ns


@pytest.mark.parametrize("mode", MODES)
def test_ping(mode):
    with namespace() as ns:
        vm = Guest(ns, mode, "ping", GUEST_IP, "5")
        helpers.ping(ns, GUEST_IP, 5)
        _, _, stats = vm.finish()
        if mode != "off":
            dev = stats["shmstream"]["devices"]["service0"]
            assert dev["rx_frames"] >= 5 and dev["tx_frames"] >= 5


ECHO_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(30)  # a bound for a hang, not for a slow machine
for i in range(int(sys.argv[1])):
    msg = b"echo %d " % i + bytes(range(256)) * 4
    s.sendto(msg, ("10.0.0.2", 7))
    data, addr = s.recvfrom(4096)
    assert data == msg and addr == ("10.0.0.2", 7), (i, data[:20], addr)
print("ok")
"""


@pytest.mark.parametrize("mode", MODES)
def test_udp_echo(mode):
    with namespace() as ns:
        vm = Guest(ns, mode, "udpecho", GUEST_IP, "7", "20")
        client = ns.run(
            [sys.executable, "-c", ECHO_CLIENT, "20"], capture_output=True, text=True, timeout=60
        )
        assert client.stdout.strip() == "ok", client.stdout + client.stderr
        _, lines, _ = vm.finish()
        assert lines["echoed"] == "20"


@pytest.mark.parametrize("mode", MODES)
def test_flood_is_received_intact(mode):
    """A paced flood of 1300-byte datagrams: every one the guest got has the
    right payload, in order; in shmstream modes the host's count of frames
    delivered into the ring equals the guest's count exactly."""
    # The hypercall path tops out near 14k frames/s here (one exit each):
    # offer it a rate it can take even on a loaded machine.
    count, rate = (6000, 3000) if mode == "off" else (20000, 10000)
    # The tap's queue holds the whole flood: a reader off the CPU for a
    # while (2 cores shared by the sender, the vCPU, a polling IO thread
    # and whatever else runs) delays frames instead of losing them.
    with namespace(txqlen=count) as ns:
        ns.run(
            ["ip", "neigh", "replace", GUEST_IP, "lladdr", GUEST_MAC, "dev", "tap100"], check=True
        )
        vm = Guest(ns, mode, "udpsink", GUEST_IP, "5000", "0", "1000")
        sent = ns.run(
            [
                sys.executable,
                "-m",
                "testkit.traffic",
                GUEST_IP,
                "5000",
                "--count",
                str(count),
                "--rate",
                str(rate),
                "--size",
                "1300",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert json.loads(sent.stdout)["sent"] == count, sent.stdout + sent.stderr
        _, lines, stats = vm.finish()
        # The kernel's own count of frames the tap handed to pyvmm (the tap
        # transmits towards its reader), read over netlink in the namespace.
        tap = ns.link("tap100")["stats"]
    frames = int(lines["frames"])
    assert int(lines["pattern_errors"]) == 0
    assert int(lines["out_of_order"]) == 0
    assert int(lines["bytes"]) == frames * 1300
    # Loss is allowed (a full ring drops, counted, while the guest is off
    # the CPU), but only a little at these rates.
    assert frames >= count * 0.9, lines
    # Every frame that left the tap's queue was pyvmm's to read: the tap
    # dropped the others itself.
    assert tap["tx_packets"] + tap["tx_dropped"] == count, tap
    if mode == "off":
        # Every frame came through net_read, answered by the C fast path.
        assert stats["hypercalls_in_c"]["net_reads"] >= frames
        assert tap["tx_packets"] == frames, (tap, lines)
    else:
        dev = stats["shmstream"]["devices"]["service0"]
        # Exactly: each frame pyvmm read went into the ring or was dropped
        # and counted; each one in the ring reached the guest's counter
        # (no IPv6, a static neighbour entry: nothing else on this tap).
        assert dev["rx_frames"] + dev["rx_drops_full"] == tap["tx_packets"], (dev, tap)
        assert dev["rx_frames"] == frames, (dev, lines)
        assert dev["rx_bad_index"] == 0 and dev["tx_bad_index"] == 0
        if mode == "poll":
            # A polling host never sleeps, so the guest never has to kick it.
            assert lines["kicks"] == "0" and stats["shmstream"]["thread"]["kicks"] == 0


@pytest.mark.parametrize("mode", ["poll", "event", "hybrid"])
def test_a_received_frame_costs_no_exit_in_steady_state(mode):
    """The headline claim (README): in the shm modes a received frame costs
    no VM exit while frames keep coming; the guest exits only to wait once
    it has drained the ring. Checked as an exact account, not as a rate:
    how many exits a flood costs depends on how often the ring runs dry,
    which is the sender's speed against the guest's, so on a loaded
    machine (the sender off the CPU) it rose from 4-5 to 60 per 1000
    frames. That figure is bench/pps.py's (exits/1k fr, bench/RESULTS.md)."""
    count = 30000
    with namespace() as ns:
        ns.run(
            ["ip", "neigh", "replace", GUEST_IP, "lladdr", GUEST_MAC, "dev", "tap100"], check=True
        )
        vm = Guest(ns, mode, "udpsink", GUEST_IP, "5000", "0", "1000")
        sent = ns.run(
            [sys.executable, "-m", "testkit.traffic", GUEST_IP, "5000", "--count", str(count)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert json.loads(sent.stdout)["sent"] == count, sent.stdout + sent.stderr
        _, lines, stats = vm.finish()
    frames, batches = int(lines["frames"]), int(lines["batches"])
    assert frames >= 1000, lines  # enough received to mean something
    calls = stats["hypercalls"]
    # No frame went through a hypercall, and every exit that reached pyvmm
    # was one of these hypercalls: the console, the halt, the waits.
    assert set(calls) <= {"poll", "puts", "halt"}, calls
    assert sum(stats["exits_to_pyvmm"].values()) == sum(calls.values()), stats
    # Each wait follows a drained ring (a batch, udpsink's count), plus the
    # idle wait that ends the run and at most one before the first frame.
    assert calls["poll"] <= batches + 2, (calls, lines)
    # The exits pyvmm never sees (host interrupts, page faults on the
    # shadow or nested page tables) are not one per frame either.
    hidden = stats["kvm"]["exits"] - sum(calls.values())
    assert hidden * 10 < frames, (stats["kvm"], frames)


@pytest.mark.parametrize("mode", ["poll", "event", "hybrid"])
def test_solo5_ring_guest_answers_ping(mode):
    """A guest using Solo5's own ring I/O (not shmstream) is served by the
    IO thread: reads committed, writes sent, kicks only when it sleeps."""
    with namespace() as ns:
        vm, head = ns.start_pyvmm(
            helpers.STATS,
            f"--shm={mode}",
            "--net:service0=tap100",
            guest("s5ring"),
            GUEST_IP,
            "5",
        )
        assert "ring: solo5" in head, head + vm.stderr.read()
        helpers.ping(ns, GUEST_IP, 5)
        out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0 and "SUCCESS" in out, out + err
    ring = helpers.parse_stats(err)["solo5_ring"]
    assert ring["mode"] == mode
    assert ring["ring"]["writes"] >= 5 and ring["ring"]["reads"] >= 5
    assert ring["ring"]["bad_entries"] == 0 and ring["ring"]["bad_index"] == 0
    if mode == "poll":
        assert ring["thread"]["kicks"] == 0  # a polling host never asks for kicks


def test_no_net_ring_turns_solo5_ring_off():
    with namespace() as ns:
        result = ns.run_pyvmm(
            "--no-net-ring", "--net:service0=tap100", guest("s5ring"), GUEST_IP, "1"
        )
    assert result.returncode == 1
    assert "the host offers no Solo5 ring" in result.stdout


def test_explicit_mode_with_nothing_to_serve_is_an_error():
    with namespace() as ns:
        result = ns.run_pyvmm(
            "--shm=poll", "--no-net-ring", "--net:service0=tap100", guest("s5ring")
        )
    assert result.returncode == 1
    assert result.stderr.strip().startswith("pyvmm: --shm=poll: nothing to serve")


RECEIVER = """
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# SO_RCVBUFFORCE (root) past net.core.rmem_max: the guest may send faster
# than this loop reads, and every datagram must be kept.
s.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)
s.bind(("10.0.0.1", 6000))
print("listening", flush=True)
# Every datagram must come: the time-out only ends a receiver whose sender
# stopped short (a bound for a hang, not for a slow machine).
s.settimeout(30)
got = bad = 0
expected = int(sys.argv[1])
try:
    while got < expected:
        data = s.recv(4096)
        seq = struct.unpack_from("<Q", data)[0]
        want = bytes((seq + i) & 0xFF for i in range(8, len(data)))
        bad += data[8:] != want
        got += 1
except socket.timeout:
    pass
print(got, bad)
"""


@pytest.mark.parametrize("mode", MODES)
def test_guest_sender_transmits_every_frame(mode):
    """udpsend queues frames in batches and flushes once per batch; every
    datagram reaches a socket in the namespace, with its payload intact."""
    count = 3000
    with namespace() as ns:
        link = ns.run(["ip", "-o", "link", "show", "tap100"], capture_output=True, text=True)
        tap_mac = re.search(r"link/ether ([0-9a-f:]{17})", link.stdout).group(1)
        receiver = ns.popen(
            [sys.executable, "-c", RECEIVER, str(count)], stdout=subprocess.PIPE, text=True
        )
        assert receiver.stdout.readline().strip() == "listening"
        vm = Guest(
            ns, mode, "udpsend", GUEST_IP, "10.0.0.1", tap_mac, "6000", str(count), "1000", "32"
        )
        _, lines, stats = vm.finish()
        got, bad = map(int, receiver.communicate(timeout=90)[0].split())
    assert lines["sent"] == str(count)
    assert (got, bad) == (count, 0)
    if mode != "off":
        dev = stats["shmstream"]["devices"]["service0"]
        assert dev["tx_frames"] >= count
        assert dev["tx_drops_bad_len"] == 0 and dev["tx_drops_backend"] == 0


@pytest.mark.parametrize(
    "name, mode",
    [("hostile", "event"), ("hostile", "poll"), ("hostile_s5", "event"), ("hostile_s5", "hybrid")],
)
def test_hostile_guest_cannot_hurt_the_host(name, mode):
    """A guest scribbling garbage over its rings (indices, lengths, flags,
    headers; for Solo5's ring: bad operations, handles, addresses and
    lengths) while frames arrive: pyvmm neither crashes nor stops the guest,
    and the damage shows up in the counters."""
    with namespace() as ns:
        ns.run(
            ["ip", "neigh", "replace", GUEST_IP, "lladdr", GUEST_MAC, "dev", "tap100"], check=True
        )
        vm, _ = ns.start_pyvmm(
            helpers.STATS,
            f"--shm={mode}",
            "--net:service0=tap100",
            f"--net-mac:service0={GUEST_MAC}",
            guest(name),
            "20000",
        )
        flood = ns.popen(
            [
                sys.executable,
                "-m",
                "testkit.traffic",
                GUEST_IP,
                "5000",
                "--seconds",
                "2",
                "--rate",
                "20000",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        out, err = vm.communicate(timeout=120)
        flood.communicate(timeout=60)
    assert vm.returncode == 0, out + err
    assert "survived 20000 rounds" in out and "SUCCESS" in out
    assert "Traceback" not in err
    stats = helpers.parse_stats(err)
    if name == "hostile":
        service = stats["shmstream"]
        dev = service["devices"]["service0"]
        assert dev["rx_bad_index"] + dev["tx_bad_index"] > 0
        assert dev["tx_drops_bad_len"] > 0
        bad = dev["tx_bad_index"]
    else:
        service = stats["solo5_ring"]
        ring = service["ring"]
        assert ring["bad_entries"] + ring["bad_index"] > 0
        bad = ring["bad_index"]
    if mode == "event":
        # A sleeping thread meets a bad index once per wake-up (or busy
        # pass), the vCPU thread once per kick it serves (an exit the
        # guest pays for); one that span on it would count millions.
        thread = service["thread"]
        served = service.get("ring", {}).get("kicks_inline", 0)
        events = thread["wakeups"] + thread["busy_passes"] + served
        assert bad <= 2 * events + 16, (thread, served)
