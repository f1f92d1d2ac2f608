"""The counters' shape for a guest with a net and a block device: the keys
of --stats-json's snapshot and the lines of --stats's summary, pinned as
they are, on each path a net device's frames can take (hypercalls in C,
hypercalls in Python, shmstream's rings). Counters are named in the C
structs, the devices and one table in stats.py; this is what keeps a
change there from changing what programs and people read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import engine_env, guest
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.netns]


# One of each: a block write and read, a frame out, a read that finds
# nothing, a poll, then SUCCESS.
NETBLK_C = r"""
#include "rt.h"

GUEST_MANIFEST(MFT_NET("service0"), MFT_BLOCK("storage"));

static uint8_t block[4096], frame[9216];

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    solo5_handle_t net, disk;
    struct solo5_net_info ni;
    struct solo5_block_info bi;
    if (solo5_net_acquire("service0", &net, &ni) != SOLO5_R_OK ||
        solo5_block_acquire("storage", &disk, &bi) != SOLO5_R_OK ||
        bi.block_size > sizeof block) {
        rt_puts("FAILURE: acquire\n");
        return SOLO5_EXIT_FAILURE;
    }
    memset(block, 0xab, bi.block_size);
    if (solo5_block_write(disk, 0, block, bi.block_size) != SOLO5_R_OK ||
        solo5_block_read(disk, 0, block, bi.block_size) != SOLO5_R_OK) {
        rt_puts("FAILURE: block\n");
        return SOLO5_EXIT_FAILURE;
    }
    memset(frame, 0xff, 6);
    memcpy(frame + 6, ni.mac_address, 6);
    frame[12] = 0x88;  /* an experimental EtherType: nobody answers it */
    frame[13] = 0xb5;
    if (solo5_net_write(net, frame, 60) != SOLO5_R_OK) {
        rt_puts("FAILURE: net write\n");
        return SOLO5_EXIT_FAILURE;
    }
    size_t got;
    (void)solo5_net_read(net, frame, sizeof frame, &got);
    solo5_handle_set_t ready;
    solo5_yield(solo5_clock_monotonic() + 1000000, &ready);
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
"""


@pytest.fixture(scope="module")
def netblk(tmp_path_factory) -> Path:
    return helpers.build_runtime_guest(NETBLK_C, tmp_path_factory.mktemp("netblk"), "netblk")


def key_paths(snap: dict, prefix: str = "") -> set[str]:
    """Every key of the snapshot as a dotted path, except below the sections
    whose keys are data (exit kinds and hypercall names met, KVM's names)."""
    paths = set()
    for key, value in snap.items():
        path = f"{prefix}{key}"
        paths.add(path)
        if isinstance(value, dict) and path not in ("exits_to_pyvmm", "hypercalls", "kvm"):
            paths |= key_paths(value, path + ".")
    return paths


def summary_shape(stderr: str) -> list[str]:
    """The summary's lines with every number as N; of the lines that list
    what KVM saw (which varies from run to run), only their start."""
    lines = []
    for line in stderr.splitlines():
        line = re.sub(r"(?<!\w)\d+(\.\d+)?", "N", line)
        if line.startswith("  KVM counted:"):
            line = "  KVM counted:"
        elif line.startswith("  VM exits:"):
            line = line.split(" (")[0]
        lines.append(line)
    return lines


COMMON = {
    "schema",
    "record",
    "unix_time",
    "exit_status",
    "seconds",
    "cpl",
    "privilege",
    "exits_to_pyvmm",
    "hypercalls",
    "vcpu_thread_cpu_ns",
    # Added within pyvmm-stats/1: the vCPU thread's context switches.
    "vcpu_thread_voluntary_switches",
    "vcpu_thread_involuntary_switches",
    "kvm",
    "tap_drops",
    "tap_drops.rx_oversize",
    "tap_drops.tx",
    "taps",
    "taps.service0",
    *(f"taps.service0.{k}" for k in ("tx_packets", "tx_bytes", "tx_dropped")),
    *(f"taps.service0.{k}" for k in ("rx_packets", "rx_bytes", "rx_dropped")),
}
IN_C = {
    "hypercalls_in_c",
    *(
        f"hypercalls_in_c.{k}"
        for k in (
            "answered",
            "walltimes",
            "net_reads",
            "net_reads_again",
            "net_writes",
            "polls",
            "block_reads",
            "block_writes",
        )
    ),
}
# Added within pyvmm-stats/1: the IO thread's context switches, and its
# yields after a pass that woke the vCPU (docs/modes.md, co-scheduling).
SWITCHES = ("voluntary_switches", "involuntary_switches", "handoffs")
SHM_DEVICE = (
    "rx_frames",
    "rx_bytes",
    "rx_drops_full",
    "rx_drops_oversize",
    "rx_bad_index",
    "tx_frames",
    "tx_bytes",
    "tx_drops_bad_len",
    "tx_drops_backend",
    "tx_bad_index",
    "notify_sent",
    "notify_suppressed",
)
SHM = {
    "shmstream",
    "shmstream.mode",
    # Added within pyvmm-stats/1 (new keys may appear): how the taps are read.
    "shmstream.tap_read",
    "shmstream.thread",
    *(
        f"shmstream.thread.{k}"
        for k in ("wakeups", "kicks", "sleeps", "busy_passes", "idle_spins", "cpu_ns", *SWITCHES)
    ),
    "shmstream.devices",
    "shmstream.devices.service0",
    *(f"shmstream.devices.service0.{k}" for k in SHM_DEVICE),
}

HYPERCALL_SUMMARY = [
    "pyvmm: counters after the guest ran N s (wall clock), privilege user (CPL N)",
    "  VM exits: N counted by KVM, N reached pyvmm",
    "  KVM counted:",
    "  hypercalls: block_read N, block_write N, halt N, net_read N, net_write N, poll N, puts N",
    "  net service0: to the guest N frames (N B), from the guest N frames (N B)",
    "    dropped by pyvmm: none; by the tap (the kernel): N to the guest (not read in time), "
    "N from it",
    "  CPU time: vCPU thread N s (N% of the run)",
]
SHM_SUMMARY = [
    "pyvmm: counters after the guest ran N s (wall clock), privilege user (CPL N)",
    "  VM exits: N counted by KVM, N reached pyvmm",
    "  KVM counted:",
    "  hypercalls: block_read N, block_write N, halt N, poll N, puts N",
    "  net service0: to the guest N frames (N B), from the guest N frames (N B)",
    "    dropped by pyvmm: none; by the tap (the kernel): N to the guest (not read in time), "
    "N from it",
    "  IO thread (event): guest kicks N, returns from epoll N, sleeps N, passes that moved "
    "frames N, idle passes N; woke the guest N times",
    "  CPU time: vCPU thread N s (N% of the run), IO thread N s (N% of the run)",
]

CASES = {
    "hypercalls in C": ("off", "c", COMMON | IN_C, HYPERCALL_SUMMARY),
    "hypercalls in Python": ("off", "python", COMMON, HYPERCALL_SUMMARY),
    "shmstream": ("event", "c", COMMON | IN_C | SHM, SHM_SUMMARY),
}


@pytest.mark.parametrize("case", CASES)
def test_keys_and_summary_lines_of_a_net_and_block_guest(netblk, tmp_path, case):
    shm, engine, keys, lines = CASES[case]
    disk = tmp_path / "disk.img"
    disk.write_bytes(bytes(64 * 1024))
    stats = tmp_path / "stats.json"
    with NetNamespace() as ns:
        ns.add_quiet_tap("tap100")
        result = ns.run_pyvmm(
            "--stats",
            f"--stats-json={stats}",
            f"--shm={shm}",
            "--net:service0=tap100",
            f"--block:storage={disk}",
            netblk,
            env=engine_env(engine),
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    (line,) = stats.read_text().splitlines()
    snap = json.loads(line)
    assert key_paths(snap) == keys
    assert summary_shape(result.stderr) == lines


RING = {
    "solo5_ring",
    "solo5_ring.mode",
    "solo5_ring.thread",
    *(
        f"solo5_ring.thread.{k}"
        for k in ("wakeups", "kicks", "sleeps", "busy_passes", "idle_spins", "cpu_ns", *SWITCHES)
    ),
    "solo5_ring.ring",
    *(
        f"solo5_ring.ring.{k}"
        for k in (
            "writes",
            "write_bytes",
            "reads",
            "read_bytes",
            "reads_again",
            "read_drops_oversize",
            "bad_entries",
            "bad_index",
            "commit_stalls",
            "write_failures",
            "kicks_inline",
            "kicks_passed",
        )
    ),
}
RING_SUMMARY = [
    "pyvmm: counters after the guest ran N s (wall clock), privilege user (CPL N)",
    "  VM exits: N counted by KVM, N reached pyvmm",
    "  KVM counted:",
    "  hypercalls: halt N, poll N, puts N",
    "  net service0: to the guest N frames (N B), from the guest N frames (N B)",
    "    dropped by pyvmm: none; by the tap (the kernel): N to the guest (not read in time), "
    "N from it",
    "  IO thread (event): guest kicks N, returns from epoll N, sleeps N, passes that moved "
    "frames N, idle passes N",
    "  CPU time: vCPU thread N s (N% of the run), IO thread N s (N% of the run)",
]
#: Kicks served at their exit add how many to the IO thread's line.
SERVED_AT_EXIT = "; kicks the vCPU thread served N"


@pytest.mark.parametrize("kicks", ["thread", "exit"])
def test_keys_and_summary_lines_of_a_solo5_ring_guest(tmp_path, kicks):
    """The same for Solo5's ring (its guest has a net device only)."""
    stats = tmp_path / "stats.json"
    with NetNamespace() as ns:
        ns.add_quiet_tap("tap100")
        vm, head = ns.start_pyvmm(
            "--stats",
            f"--stats-json={stats}",
            "--shm=event",
            f"--net-ring-kicks={kicks}",
            "--net:service0=tap100",
            guest("s5ring"),
            "10.0.0.2",
            "2",
        )
        helpers.ping(ns, "10.0.0.2", 2)
        out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0 and "SUCCESS" in out, head + out + err
    (line,) = stats.read_text().splitlines()
    assert key_paths(json.loads(line)) == COMMON | IN_C | RING
    expected = list(RING_SUMMARY)
    if kicks == "exit":
        io = next(i for i, ln in enumerate(expected) if ln.startswith("  IO thread"))
        expected[io] += SERVED_AT_EXIT
    assert summary_shape(err) == expected
