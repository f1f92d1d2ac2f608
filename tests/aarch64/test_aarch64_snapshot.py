"""Snapshots on arm64 KVM: the vCPU's registers through KVM's register list
(core, FP/SIMD, system, timer, firmware), saved and set one by one; the
guest's clock is the generic timer's virtual counter, moved on by the
time between the snapshot and the restore.

guests/resume.c folds a heap buffer before its first wait and again
after it, and checks its clocks across the wait: snapshotted at the wait
and restored, the two processes print what an uninterrupted run prints.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys

from conftest import guest, popen_pyvmm, run_pyvmm
from pyvmm._native import ffi, lib
from pyvmm.vm.snapshot import format as snapshot_format
from testkit import helpers
from testkit.netns import NetNamespace

MEM = "--mem=8"
GUEST_IP = "10.0.0.2"


def test_a_first_wait_snapshot_restores_to_the_same_end(tmp_path):
    whole = run_pyvmm(MEM, guest("resume"), "4096")
    assert whole.returncode == 0 and whole.stdout.endswith("SUCCESS\n"), whole.stderr
    directory = tmp_path / "s"
    before = run_pyvmm(
        MEM,
        "--snapshot-at=first-wait",
        f"--snapshot-dir={directory}",
        "--snapshot-stop",
        guest("resume"),
        "4096",
    )
    assert before.returncode == 0, before.stderr
    document = json.loads((directory / "snapshot.json").read_text())
    assert document["arch"] == "aarch64"
    after = run_pyvmm(f"--restore={directory}")
    assert after.returncode == 0, after.stderr
    assert before.stdout + after.stdout == whole.stdout
    again = run_pyvmm(f"--restore={directory}")
    assert again.stdout == after.stdout


def test_a_sigusr2_snapshot_during_a_wait_restores_to_the_same_end(tmp_path):
    whole = run_pyvmm(MEM, guest("resume"), "4096", "1")
    directory = tmp_path / "s"
    proc = popen_pyvmm(
        MEM,
        "--snapshot-at=sigusr2",
        f"--snapshot-dir={directory}",
        "--snapshot-stop",
        guest("resume"),
        "4096",
        "20000",
    )
    try:
        first = proc.stdout.readline()  # its wait of 20 s has begun
        proc.send_signal(signal.SIGUSR2)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    restored = run_pyvmm(f"--restore={directory}", timeout=120)
    assert restored.returncode == 0, restored.stderr
    assert first + restored.stdout == whole.stdout.replace("args: 4096 1", "args: 4096 20000")


def test_a_damaged_register_list_is_refused_in_one_line(tmp_path):
    directory = tmp_path / "s"
    before = run_pyvmm(
        MEM,
        "--snapshot-at=first-wait",
        f"--snapshot-dir={directory}",
        "--snapshot-stop",
        guest("resume"),
    )
    assert before.returncode == 0, before.stderr
    state = directory / "cpu.state"
    raw = bytearray(state.read_bytes())
    raw[20 + 7] = 0x10  # the first register's id: another architecture's
    state.write_bytes(bytes(raw))
    path = directory / "snapshot.json"
    document = json.loads(path.read_text())
    document["cpu_state"]["sha256"] = hashlib.sha256(bytes(raw)).hexdigest()
    path.write_bytes(snapshot_format.seal(document))
    result = run_pyvmm(f"--restore={directory}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"pyvmm: --restore: {directory}: cpu.state: its register list does not parse"
    ]


def _ring_heads(directory, memory: str, base: int = 0) -> dict:
    """The first link's rings' indices, read from ``memory`` at ``base``,
    in the layout of csrc/shmstream.h."""
    shm = json.loads((directory / "snapshot.json").read_text())["device_state"]["net"]["shmstream"]
    rx = shm["gpa"] + lib.SHM_REGION_HEADER_SIZE
    fields = ("prod", "cons", "cons_sleeping")
    found = {}
    with open(memory, "rb") as f:
        for name, at in (("rx", rx), ("tx", rx + shm["ring_size"])):
            found[name] = {}
            for field in fields:
                f.seek(base + at + ffi.offsetof("struct shm_ring", field))
                found[name][field] = int.from_bytes(f.read(4), "little")
    return found


def _rings(directory) -> str:
    """The shmstream rings' indices in a snapshot: the IO thread's and memory's."""
    try:
        net = json.loads((directory / "snapshot.json").read_text())["device_state"]["net"]
        found = {"saved": net["shmstream"]["links"], "thread": net.get("thread")}
        found.update(_ring_heads(directory, str(directory / "memory")))
        return json.dumps(found)
    except (OSError, KeyError, ValueError) as err:
        return f"unreadable: {err}"


def _live_rings(pid: int, directory) -> str:
    """The same indices in a running restore's guest memory (the memory
    file's mapping in /proc/PID/maps, read through /proc/PID/mem)."""
    try:
        memory = str(directory / "memory")
        with open(f"/proc/{pid}/maps") as maps:
            starts = [
                int(line.split("-", 1)[0], 16)
                for line in maps
                if line.rstrip().endswith(memory) and line.split()[2] == "00000000"
            ]
        if not starts:
            return "no mapping of the memory file"
        return json.dumps(_ring_heads(directory, f"/proc/{pid}/mem", starts[0]))
    except (OSError, KeyError, ValueError) as err:
        return f"unreadable: {err}"


def test_a_net_guest_restored_on_a_new_tap_answers(tmp_path):
    """The ping guest on shmstream rings: two echo requests answered before
    a SIGUSR2 snapshot, two after its restore on another tap."""
    directory = tmp_path / "s"
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, _ = ns.start_pyvmm(
            "--mem=32",
            "--snapshot-at=sigusr2",
            f"--snapshot-dir={directory}",
            "--snapshot-stop",
            "--net:service0=tap100",
            guest("ping"),
            GUEST_IP,
            "4",
        )
        helpers.ping(ns, GUEST_IP, 2)
        vm.send_signal(signal.SIGUSR2)
        out, err = vm.communicate(timeout=120)
        assert vm.returncode == 0, out + err
        ns.run(["ip", "link", "del", "tap100"], check=True)
        ns.add_tap("tap101", address="10.0.0.1/24")
        restored = ns.popen(
            [
                sys.executable,
                "-m",
                "pyvmm",
                f"--restore={directory}",
                "--net:service0=tap101",
                helpers.STATS,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The emulated machine takes seconds from opening the tap to running
        # the guest: the requests wait in the tap's queue meanwhile.
        helpers.restored_on_tap(ns, restored, "tap101", GUEST_IP, directory, timeout=120)
        try:
            helpers.ping(ns, GUEST_IP, 2, wait=60)
        except AssertionError as failed:
            # What a failure needs to be told apart: the tap's counters, the
            # neighbour, and what the restored pyvmm and its guest said.
            link = ns.link("tap101")["stats"]
            neigh = ns.run(["ip", "neigh", "show", "dev", "tap101"], capture_output=True, text=True)
            live = _live_rings(restored.pid, directory)
            restored.send_signal(signal.SIGTERM)
            out, err = restored.communicate(timeout=120)
            raise AssertionError(
                f"{failed}\ntap101 {link}\nneighbour {neigh.stdout!r}\n"
                f"pyvmm status {restored.returncode}\nstdout {out!r}\nstderr {err!r}\n"
                f"rings at the snapshot {_rings(directory)}\n"
                f"rings when stuck {live}"
            ) from None
        out, err = restored.communicate(timeout=120)
    assert restored.returncode == 0, out + err
    # The poll the kick cut short returned with nothing ready (one warning
    # line if a frame was waiting by then).
    assert out.endswith("answered 4 echo requests\nSUCCESS\n"), out
