"""Snapshots of guests with net devices, restored on a new tap.

Each test makes its own network namespace (removed afterwards, on failure
too) with a tap for the snapshotting run and another for the restored one:
the rings in guest memory continue, the IO thread starts from the
snapshot's indices and counters, and the guest answers on the new tap.
A snapshot whose ring indices were tampered with is refused in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import guest
from pyvmm._native import lib
from pyvmm.vm.snapshot import format as snapshot_format
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

GUEST_IP = "10.0.0.2"
MAC = "02:00:00:00:00:2a"
MEM = "--mem=32"
#: The net paths a guest's frames can take, by the options that pick them.
PATHS = {
    "poll": ("--shm=poll",),
    "event": ("--shm=event",),
    "hybrid": ("--shm=hybrid",),
    "hypercalls": ("--shm=off",),
}


EARLY_WAKE = "ping: warning: a frame was waiting but poll did not report the device ready\n"


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyvmm: "), result.stderr
    return lines[0]


def metadata(directory) -> dict:
    return json.loads((directory / "snapshot.json").read_text())


def net_state(directory) -> dict:
    return metadata(directory)["device_state"]["net"]


def start_snapshotting(ns: NetNamespace, directory, *args: str) -> subprocess.Popen:
    """pyvmm ARGS in ``ns``, once its guest is ready, armed for a SIGUSR2
    snapshot that ends the run."""
    vm, _ = ns.start_pyvmm(
        MEM, "--snapshot-at=sigusr2", f"--snapshot-dir={directory}", "--snapshot-stop", *args
    )
    return vm


def take(vm: subprocess.Popen) -> str:
    """The snapshot, now; what the guest printed after its ready line."""
    vm.send_signal(signal.SIGUSR2)
    out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0, out + err
    assert "the run ends there (--snapshot-stop)" in err
    return out


def swap_taps(ns: NetNamespace) -> None:
    """The snapshotting run's tap gone, a new one in its place (another name)."""
    ns.run(["ip", "link", "del", "tap100"], check=True)
    ns.add_tap("tap101", address="10.0.0.1/24")


def restore(ns: NetNamespace, directory, *args: str) -> subprocess.Popen:
    """pyvmm --restore in ``ns``, returned once it has the new tap open
    (its carrier is up) and the guest's address is a known neighbour there:
    frames sent from then on wait for the guest (helpers.restored_on_tap)."""
    vm = ns.popen(
        [sys.executable, "-m", "pyvmm", f"--restore={directory}", "--net:service0=tap101", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    helpers.restored_on_tap(ns, vm, "tap101", GUEST_IP, directory)
    return vm


@pytest.mark.parametrize("path", list(PATHS))
def test_the_ping_guest_restored_on_a_new_tap_answers(tmp_path, path):
    """Two echo requests answered before the snapshot, two after: the guest
    counts all four and ends, on every path its frames can take."""
    directory = tmp_path / "s"
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm = start_snapshotting(
            ns,
            directory,
            *PATHS[path],
            "--net:service0=tap100",
            f"--net-mac:service0={MAC}",
            guest("ping"),
            GUEST_IP,
            "4",
        )
        helpers.ping(ns, GUEST_IP, 2)
        take(vm)
        saved = net_state(directory)
        assert saved["transport"] == ("hypercalls" if path == "hypercalls" else "shmstream")
        assert saved["devices"] == [{"name": "service0", "handle": 1, "mac": MAC, "mtu": 1500}]
        if path != "hypercalls":
            assert saved["io_mode"] == path
            link = saved["shmstream"]["links"][0]
            assert link["counters"]["rx_frames"] >= 2 and link["counters"]["tx_frames"] >= 2
        swap_taps(ns)
        restored = restore(ns, directory)
        helpers.ping(ns, GUEST_IP, 2)
        out, err = restored.communicate(timeout=60)
    assert restored.returncode == 0, out + err
    # The poll the SIGUSR2 kick cut short returned with nothing ready; a
    # frame the restored guest then finds is worth its one warning line.
    assert out.removeprefix(EARLY_WAKE) == "answered 4 echo requests\nSUCCESS\n", out


def test_the_solo5_ring_continues_after_a_restore(tmp_path):
    directory = tmp_path / "s"
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm = start_snapshotting(
            ns, directory, "--net:service0=tap100", guest("s5ring"), GUEST_IP, "3"
        )
        helpers.ping(ns, GUEST_IP, 1)
        take(vm)
        saved = net_state(directory)
        assert saved["transport"] == "solo5_ring"
        assert saved["solo5_ring"]["com_tail"] >= 1
        assert saved["solo5_ring"]["counters"]["reads"] >= 1
        swap_taps(ns)
        restored = restore(ns, directory)
        helpers.ping(ns, GUEST_IP, 2)
        out, err = restored.communicate(timeout=60)
    assert restored.returncode == 0, out + err
    assert out.endswith("SUCCESS\n")


SINK_PORT = 5000
SENDER = """
import json, sys
from testkit.traffic import send
count, rate, first = map(int, sys.argv[1:])
print(json.dumps(send("10.0.0.2", 5000, count=count, rate=rate, size=1300, first_seq=first)))
"""


def sender(ns: NetNamespace, count: int, rate: int, first_seq: int = 0) -> subprocess.Popen:
    """udpsink's test pattern to the guest, from inside ``ns``."""
    argv = [sys.executable, "-c", SENDER, str(count), str(rate), str(first_seq)]
    return ns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def sent(proc: subprocess.Popen) -> int:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    return json.loads(out)["sent"]


def consumed_at_snapshot(directory, region_gpa: int) -> int:
    """The guest's RX consumer index in the snapshot's memory: every frame
    before it, the guest had counted (acknowledged) when it was taken."""
    rx_cons = region_gpa + 4096 + 64  # the region header page, the ring's consumer line
    with open(directory / "memory", "rb") as f:
        f.seek(rx_cons)
        return int.from_bytes(f.read(4), "little")


@pytest.mark.parametrize("mode", ["poll", "event", "hybrid", "event-uring"])
def test_a_guest_snapshotted_under_a_flood_keeps_every_frame_it_had(tmp_path, mode):
    """udpsink under a UDP flood, snapshotted mid-flood, restored on a new
    tap and sent more: it counts every frame that had reached its ring (the
    ones it had acknowledged and the ones still waiting), the IO thread's
    counters continue from the snapshot's, and every frame pyvmm read from
    the first tap is in the ring or counted as a drop."""
    directory = tmp_path / "s"
    flood, more = 20000, 2000
    with NetNamespace() as ns:
        ns.add_quiet_tap("tap100", txqlen=flood, neighbour=(GUEST_IP, MAC))
        vm = start_snapshotting(
            ns,
            directory,
            f"--shm={mode.removesuffix('-uring')}",
            f"--tap-read={'uring' if mode.endswith('-uring') else 'readv'}",
            "--net:service0=tap100",
            f"--net-mac:service0={MAC}",
            guest("udpsink"),
            GUEST_IP,
            str(SINK_PORT),
            "0",
            "5000",
        )
        flooding = sender(ns, flood, 50000)
        deadline = time.monotonic() + 30
        while ns.link("tap100")["stats"]["tx_packets"] < flood // 10:  # mid-flood
            assert time.monotonic() < deadline and flooding.poll() is None, "no flood"
            time.sleep(0.005)
        take(vm)
        first = sent(flooding)
        old_tap = ns.link("tap100")["stats"]
        saved = net_state(directory)["shmstream"]
        counters = saved["links"][0]["counters"]
        delivered = counters["rx_frames"]
        acknowledged = consumed_at_snapshot(directory, saved["gpa"])
        ns.run(["ip", "link", "del", "tap100"], check=True)
        ns.add_quiet_tap("tap101", txqlen=flood, neighbour=(GUEST_IP, MAC))
        restored = restore(ns, directory, helpers.STATS)
        assert sent(sender(ns, more, 5000, first_seq=first)) == more
        out, err = restored.communicate(timeout=60)
        new_tap = ns.link("tap101")["stats"]
    assert restored.returncode == 0, out + err
    report = helpers.guest_report(out)
    final = helpers.parse_stats(err)["shmstream"]["devices"]["service0"]
    assert 0 < acknowledged <= delivered == saved["links"][0]["rx_prod"], (acknowledged, saved)
    # What pyvmm read from the first tap went into the ring or was dropped, counted.
    drops = counters["rx_drops_full"] + counters["rx_drops_oversize"]
    if mode.endswith("-uring"):  # what the reads in flight at the pause took is lost
        in_flight = lib.TAP_URING_CHAIN
        assert delivered + drops <= old_tap["tx_packets"] <= delivered + drops + in_flight, old_tap
    else:
        assert old_tap["tx_packets"] == delivered + drops, (old_tap, counters)
    assert old_tap["tx_packets"] + old_tap["tx_dropped"] <= first == flood
    # The second tap's frames all arrived (a gentle rate, a queue for all).
    assert new_tap["tx_packets"] == more and final["rx_frames"] == delivered + more, final
    assert final["rx_drops_full"] >= counters["rx_drops_full"]
    # The guest counted all of them: those it had, those waiting, the new ones.
    assert int(report["frames"]) == delivered + more >= acknowledged, report
    assert report["pattern_errors"] == "0" and report["out_of_order"] == "0", report


def test_the_guest_runs_on_after_its_snapshot_and_so_does_its_restore(tmp_path):
    """A snapshot at the first wait that does not end the run: the IO thread
    is paused for it and resumed, the guest answers on; the snapshot
    restored answers as the guest did from its first wait."""
    directory = tmp_path / "s"
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, _ = ns.start_pyvmm(
            MEM,
            "--snapshot-at=first-wait",
            f"--snapshot-dir={directory}",
            "--net:service0=tap100",
            guest("ping"),
            GUEST_IP,
            "3",
        )
        helpers.ping(ns, GUEST_IP, 3)
        out, err = vm.communicate(timeout=60)
        assert vm.returncode == 0 and out.endswith("SUCCESS\n"), out + err
        assert net_state(directory)["io_mode"] == "event"
        swap_taps(ns)
        restored = restore(ns, directory)
        helpers.ping(ns, GUEST_IP, 3)
        out, err = restored.communicate(timeout=60)
    assert restored.returncode == 0, out + err
    assert out == "answered 3 echo requests\nSUCCESS\n"


@pytest.fixture(scope="module")
def ping_snapshot(tmp_path_factory):
    """A snapshot of the ping guest on shmstream rings, after one echo
    request (not to be changed: tests copy it first)."""
    directory = tmp_path_factory.mktemp("netsnap") / "s"
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm = start_snapshotting(
            ns, directory, "--net:service0=tap100", guest("ping"), GUEST_IP, "2"
        )
        helpers.ping(ns, GUEST_IP, 1)
        take(vm)
    return directory


def copy_of(directory, tmp_path, name: str):
    copy = tmp_path / name
    shutil.copytree(directory, copy)
    os.chmod(copy, 0o700)
    return copy


def reseal(directory, change) -> None:
    path = directory / "snapshot.json"
    document = json.loads(path.read_text())
    change(document["device_state"]["net"])
    path.write_bytes(snapshot_format.seal(document))


def _link(**values):
    def change(net):
        net["shmstream"]["links"][0].update(values)

    return change


def _set(key, value):
    def change(net):
        target = net
        *path, last = key.split(".")
        for part in path:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[last] = value

    return change


def _poke_rx_prod(directory, value: int) -> None:
    """The host's RX producer index in the snapshot's memory file."""
    gpa = json.loads((directory / "snapshot.json").read_text())["device_state"]["net"]
    rx_prod = gpa["shmstream"]["gpa"] + 4096
    with open(directory / "memory", "r+b") as f:
        f.seek(rx_prod)
        f.write(value.to_bytes(4, "little"))


BAD_STATES = [
    (_link(rx_prod=7), "are not the IO thread's"),
    (_link(tx_cons=1 << 32), "tx_cons' is missing, not an integer or out of range"),
    (_link(rx_prod=-1), "rx_prod' is missing"),
    (_link(counters={"rx_frames": 1}), "does not hold this pyvmm's counters"),
    (_set("shmstream.slots", 8), "the shmstream region's slots"),
    (_set("shmstream.handles", [0]), "the devices on shmstream rings"),
    (_set("shmstream.links", []), "one entry per device"),
    (_set("transport", "solo5_ring"), "the frames' path"),
    (_set("io_mode", "poll"), "the IO thread's mode"),
    (_set("devices.0.mtu", 9000), "the snapshot's had 9000"),
    (_set("devices.0.mac", "ff:ff:ff:ff:ff:ff"), "multicast"),
    (_set("devices.0.name", "other"), "is not this run's"),
    (_set("thread", {}), "net.thread"),
]


def test_a_tampered_net_state_is_refused_in_one_line(ping_snapshot, tmp_path):
    """Each field checked, given a valid checksum; and the rings in the memory
    file must be those the saved indices were read with."""
    with NetNamespace() as ns:
        ns.add_tap("tap101", address="10.0.0.1/24")

        def refused(directory, *args: str) -> str:
            result = ns.run_pyvmm(f"--restore={directory}", *args)
            return one_line(result)

        for i, (change, expected) in enumerate(BAD_STATES):
            directory = copy_of(ping_snapshot, tmp_path, f"c{i}")
            reseal(directory, change)
            assert expected in refused(directory, "--net:service0=tap101"), expected
        # The memory file's ring index changed under the metadata: refused.
        directory = copy_of(ping_snapshot, tmp_path, "memory")
        _poke_rx_prod(directory, 12345)
        line = refused(directory, "--net:service0=tap101")
        assert "in memory (12345," in line and "(corrupted?)" in line
        # Both changed alike, past a ring's length from the guest's index.
        directory = copy_of(ping_snapshot, tmp_path, "both")
        _poke_rx_prod(directory, 100000)
        reseal(directory, _link(rx_prod=100000))
        assert "slots apart" in refused(directory, "--net:service0=tap101")
        # The command line's devices must be the snapshot's.
        line = refused(ping_snapshot)
        assert "--net:service0=" in line and "not attached" in line
        line = refused(ping_snapshot, "--net:service0=tap101", "--net:other=tap101")
        assert "other" in line
        line = refused(ping_snapshot, "--net:service0=tap101", "--shm=poll")
        assert "--shm: a restored guest keeps the snapshot's" in line
        line = refused(
            ping_snapshot, "--net:service0=tap101", "--net-mac:service0=02:00:00:00:00:99"
        )
        assert "leave --net-mac out" in line
        ns.set_mtu("tap101", 1400)
        assert "has MTU 1400" in refused(ping_snapshot, "--net:service0=tap101")
        ns.set_mtu("tap101", 1500)
        # The untouched snapshot restores (each refusal above was its change).
        restored = restore(ns, ping_snapshot)
        helpers.ping(ns, GUEST_IP, 1)
        out, err = restored.communicate(timeout=60)
    assert restored.returncode == 0 and out == "answered 2 echo requests\nSUCCESS\n", out + err
