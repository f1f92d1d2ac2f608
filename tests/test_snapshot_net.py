"""Snapshots of guests with net devices, restored on a new tap.

Each test makes its own network namespace (removed afterwards, on failure
too) with a tap for the snapshotting run and another for the restored one:
the rings in guest memory continue, the IO thread starts from the
snapshot's indices and counters, and the guest answers on the new tap.
A snapshot whose ring indices were tampered with is refused in one line.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import guest
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
    (its carrier is up): frames sent from then on reach the guest."""
    vm = ns.popen(
        [sys.executable, "-m", "pyvmm", f"--restore={directory}", "--net:service0=tap101", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while (
        "NO-CARRIER"
        in ns.run(
            ["ip", "-o", "link", "show", "tap101"], capture_output=True, text=True, check=True
        ).stdout
    ):
        if vm.poll() is not None or time.monotonic() > deadline:
            out, err = vm.communicate()
            raise AssertionError(f"the restore never opened the tap: {out}{err}")
        time.sleep(0.01)
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
    assert out == "answered 4 echo requests\nSUCCESS\n"


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
