"""Counters people and programs read: --stats (summary, live rates),
--stats-json (the versioned schema, per interval), SIGUSR1, and the Python
API (pyvmm.api.Guest). docs/stats.md, docs/api.md."""

from __future__ import annotations

import json
import re
import signal
import sys
import time

import pytest

from conftest import guest, popen_pyvmm, run_pyvmm
from pyvmm.api import Guest
from pyvmm.errors import LoaderError, UsageError
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = pytest.mark.kvm


def wait_for_line(stream, pattern: str, bound: float = 30) -> str:
    """The first line matching ``pattern`` (a bound that only catches hangs)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        line = stream.readline()
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r} within {bound} s")


def test_json_schema_and_counts_that_add_up(tmp_path):
    path = tmp_path / "stats.json"
    result = run_pyvmm(f"--stats-json={path}", guest("hello"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # JSON to a file: nothing extra on stderr
    (line,) = path.read_text().splitlines()
    snap = json.loads(line)
    assert snap["schema"] == "pyvmm-stats/1"
    assert snap["seconds"] > 0 and snap["privilege"] in ("kernel", "user")
    # hello makes only hypercalls: every exit that reached pyvmm was one,
    # counted once by name whoever answered it.
    assert sum(snap["hypercalls"].values()) == snap["exits_to_pyvmm"]["IoOut"]
    assert snap["hypercalls"]["halt"] == 1 and snap["hypercalls"]["puts"] >= 1
    # KVM counts every exit, including those that never reach user space.
    assert snap["kvm"]["exits"] >= sum(snap["exits_to_pyvmm"].values())


def test_summary_on_stderr_in_human_form():
    result = run_pyvmm("--stats", guest("hello"))
    assert result.returncode == 0
    lines = result.stderr.splitlines()
    assert re.fullmatch(r"pyvmm: [0-9.]+ s, privilege \w+ \(CPL [03]\)", lines[0])
    assert any(re.match(r"  VM exits: \d+ counted by KVM, \d+ reached pyvmm", x) for x in lines)
    assert any(x.startswith("  hypercalls: halt 1, puts ") for x in lines)
    assert "SUCCESS" in result.stdout  # the guest's output is untouched


def test_live_rates_per_interval_and_json_lines(tmp_path):
    path = tmp_path / "live.jsonl"
    vm = popen_pyvmm("--stats=200ms", f"--stats-json={path}", guest("spin"))
    try:
        for _ in range(3):
            wait_for_line(vm.stderr, r"^pyvmm: t=[0-9.]+s \| .*CPU vCPU \d+%")
    finally:
        vm.send_signal(signal.SIGINT)
        out, err = vm.communicate(timeout=30)
    assert vm.returncode == 130, err
    assert "pyvmm: stopped by SIGINT" in err
    snaps = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(snaps) >= 4  # three intervals and the final snapshot
    seconds = [s["seconds"] for s in snaps]
    assert seconds == sorted(seconds)
    assert all(s["schema"] == "pyvmm-stats/1" for s in snaps)


def test_sigusr1_prints_counters_and_the_guest_runs_on():
    vm = popen_pyvmm(guest("spin"))
    try:
        assert vm.stdout.readline() == "spinning\n"
        vm.send_signal(signal.SIGUSR1)
        wait_for_line(vm.stderr, r"^pyvmm: [0-9.]+ s, privilege")
        vm.send_signal(signal.SIGUSR1)
        wait_for_line(vm.stderr, r"^pyvmm: [0-9.]+ s, privilege")
        assert vm.poll() is None  # still running
    finally:
        vm.send_signal(signal.SIGTERM)
        vm.communicate(timeout=30)
    assert vm.returncode == 143


@pytest.mark.parametrize("value", ["", "0s", "x", "1h", "5ms"])
def test_bad_interval_is_one_line(value):
    result = run_pyvmm(f"--stats={value}", guest("hello"))
    assert result.returncode == 1
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("pyvmm: --stats")


@pytest.mark.netns
def test_live_counts_agree_with_the_guest(tmp_path):
    """A flood through shmstream: each interval's snapshot counts frames
    monotonically and the last one equals what the guest itself counted."""
    path = tmp_path / "flood.jsonl"
    with NetNamespace() as ns:
        # No IPv6: the only frames on the tap are the flood's (exact counts).
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        ns.add_tap("tap100", address="10.0.0.1/24")
        ns.run(
            ["ip", "neigh", "replace", "10.0.0.2", "lladdr", "02:00:00:00:00:02", "dev", "tap100"],
            check=True,
        )
        vm, head = ns.start_pyvmm(
            "--stats=250ms",
            f"--stats-json={path}",
            "--shm=poll",
            "--net:service0=tap100",
            "--net-mac:service0=02:00:00:00:00:02",
            guest("udpsink"),
            "10.0.0.2",
            "5000",
            "0",
            "1000",
        )
        ns.run(
            [sys.executable, "-m", "testkit.traffic", "10.0.0.2", "5000"]
            + ["--count", "20000", "--rate", "10000", "--size", "1300"],
            capture_output=True,
            check=True,
            timeout=120,
        )
        out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0, head + out + err
    frames = int(helpers.guest_report(head + out)["frames"])
    counts = [
        json.loads(x)["shmstream"]["devices"]["service0"]["rx_frames"]
        for x in path.read_text().splitlines()
    ]
    assert counts == sorted(counts) and counts[-1] == frames
    live = [x for x in err.splitlines() if x.startswith("pyvmm: t=")]
    assert any(re.search(r"service0 rx [0-9.]+k fr/s", x) for x in live), live


def test_python_api_runs_reads_and_stops_a_guest():
    vm = Guest(guest("spin"))
    vm.start()
    deadline = time.monotonic() + 30
    while vm.counters()["seconds"] < 0.2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    snap = vm.counters()
    assert snap["schema"] == "pyvmm-stats/1" and snap["vcpu_thread_cpu_ns"] > 0
    vm.stop()
    assert vm.wait(timeout=30) == 143
    assert "SIGTERM" in str(vm.error)


def test_python_api_exit_status_and_options():
    vm = Guest(guest("args"), "7", mem=64, block=None, no_net_ring=True)
    vm.start()
    assert vm.wait(timeout=60) == 7 and vm.error is None
    assert vm.counters()["hypercalls"]["halt"] == 1


def test_python_api_reports_errors_as_the_cli_does(tmp_path):
    with pytest.raises(
        UsageError, match=r"^Malformed argument to mem: 'x' is not a positive integer$"
    ):
        Guest(guest("hello"), mem="x")
    with pytest.raises(LoaderError, match="Could not open"):
        Guest(str(tmp_path / "missing.hvt")).start()
    # The failed start left nothing running: another guest may start.
    ok = Guest(guest("hello"))
    ok.start()
    assert ok.wait(timeout=60) == 0
