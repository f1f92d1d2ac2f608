"""Counters people and programs read: --stats (summary, live rates),
--stats-json (the versioned schema, per interval), SIGUSR1, and the Python
API (pyvmm.api.Guest). docs/stats.md, docs/api.md."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import guest, popen_pyvmm, run_pyvmm
from pyvmm.api import Guest
from pyvmm.common.errors import LoaderError, UsageError
from pyvmm.vm.statsview import HEADER_EVERY, is_live_line
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = pytest.mark.kvm


# The summary's first line (at exit and on SIGUSR1).
SUMMARY = (
    r"^pyvmm: counters after the guest ran [0-9.]+ s \(wall clock\), privilege \w+ \(CPL [03]\)$"
)


def wait_for_line(vm: subprocess.Popen, pattern: str, bound: float = 30) -> str:
    """The first line of pyvmm's stderr matching ``pattern``; past ``bound``
    (which only catches hangs) pyvmm is killed, so a line that never comes
    fails the test instead of blocking it."""
    timer = threading.Timer(bound, vm.kill)
    timer.start()
    try:
        for line in iter(vm.stderr.readline, ""):
            if re.search(pattern, line):
                return line
    finally:
        timer.cancel()
    raise AssertionError(f"no line matching {pattern!r} within {bound} s")


def live_rows(text: str) -> list[dict[str, str]]:
    """The live view's rows in pyvmm's stderr, as {"GROUP: HEADING": value}
    read by position under the latest header: the columns are fixed, so a
    row's numbers must end exactly where their headings end."""
    rows: list[dict[str, str]] = []
    groups = names = ""
    for line in text.splitlines():
        if not is_live_line(line):
            continue
        body = line[len("pyvmm:") :]
        if body.lstrip().startswith("-"):
            groups = body
        elif body.lstrip().startswith("s "):
            names = body
        else:
            assert len(body) == len(names) == len(groups), (groups, names, body)
            spans = [(m.start(), m.end(), m.group(1)) for m in re.finditer(r"-+ (.+?) -+", groups)]
            row, start = {}, 0
            for cell in re.finditer(r"\S+", body):
                heading = names[start : cell.end()].strip()
                (group,) = [g for a, b, g in spans if a < cell.end() <= b]
                row[f"{group}: {heading}"] = cell.group()
                start = cell.end()
            rows.append(row)
    return rows


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
    # The vCPU thread's CPU time is measured inside the run's wall-clock
    # time, never more (a busy guest's short run read 101% before).
    assert 0 < snap["vcpu_thread_cpu_ns"] <= snap["seconds"] * 1e9 + 500


def test_summary_on_stderr_in_human_form():
    result = run_pyvmm("--stats", guest("hello"))
    assert result.returncode == 0
    lines = result.stderr.splitlines()
    assert re.fullmatch(SUMMARY, lines[0])
    assert any(re.match(r"  VM exits: \d+ counted by KVM, \d+ reached pyvmm", x) for x in lines)
    assert any(x.startswith("  hypercalls: halt 1, puts ") for x in lines)
    assert re.fullmatch(r"  CPU time: vCPU thread [0-9.]+ s \(\d+% of the run\)", lines[-1])
    assert "SUCCESS" in result.stdout  # the guest's output is untouched


def test_live_rates_per_interval_and_json_lines(tmp_path):
    path = tmp_path / "live.jsonl"
    started = time.time()
    vm = popen_pyvmm("--stats=10ms", f"--stats-json={path}", guest("spin"))
    seen = ""
    try:
        # Past the second header: it repeats every HEADER_EVERY rows.
        while len(live_rows(seen)) < HEADER_EVERY + 2:
            seen += wait_for_line(vm, r"^pyvmm: ")
    finally:
        vm.send_signal(signal.SIGINT)
        out, err = vm.communicate(timeout=30)
    ended = time.time()
    assert vm.returncode == 130, err
    assert "pyvmm: stopped by SIGINT" in err
    err = seen + err
    # A header first, then again after HEADER_EVERY rows (groups and headings).
    lines = [x for x in err.splitlines() if is_live_line(x)]
    headers = [i for i, x in enumerate(lines) if not re.match(r"pyvmm: +[0-9]", x)]
    assert headers[:4] == [0, 1, HEADER_EVERY + 2, HEADER_EVERY + 3], lines[:3]
    # Fixed columns (live_rows checks each row against its header), every one
    # on every row, zero or not, each with its unit, one number format.
    rows = live_rows(err)
    assert all(list(r) == list(rows[0]) for r in rows)
    assert list(rows[0]) == [
        "time: s",
        "VM exits: KVM/s",
        "VM exits: to pyvmm/s",
        "VM exits: Python/s",
        "CPU: vCPU %",
    ]
    for r in rows:
        assert re.fullmatch(r"\d+\.\d", r["time: s"])
        assert all(re.fullmatch(r"\d+", v) for k, v in r.items() if k != "time: s"), r
    assert any(r["VM exits: to pyvmm/s"] == "0" for r in rows)  # spinning: shown at zero
    # The JSON lines: one per interval, then the final one with the status.
    snaps = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(snaps) >= HEADER_EVERY + 2  # the intervals and the final snapshot
    assert [s["record"] for s in snaps] == ["interval"] * (len(snaps) - 1) + ["final"]
    assert snaps[-1]["exit_status"] == 130
    assert all("exit_status" not in s for s in snaps[:-1])
    seconds = [s["seconds"] for s in snaps]
    assert seconds == sorted(seconds)
    wall = [s["unix_time"] for s in snaps]
    assert wall == sorted(wall) and started <= wall[0] and wall[-1] <= ended
    assert all(s["schema"] == "pyvmm-stats/1" for s in snaps)


def test_json_final_record_has_the_guests_exit_status(tmp_path):
    path = tmp_path / "stats.json"
    result = run_pyvmm(f"--stats-json={path}", guest("args"), "7")
    assert result.returncode == 7
    (snap,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert snap["record"] == "final" and snap["exit_status"] == 7


def test_json_to_dash_stays_out_of_the_guests_console():
    """``-`` is standard error: standard output is the guest's console."""
    plain = run_pyvmm(guest("hello"))
    result = run_pyvmm("--stats-json=-", guest("hello"))
    assert result.returncode == 0
    assert result.stdout == plain.stdout  # the console alone
    (line,) = result.stderr.splitlines()
    snap = json.loads(line)
    assert snap["record"] == "final" and snap["exit_status"] == 0


@pytest.mark.parametrize("stats", [[], ["--stats"], ["--stats=3600s"], ["--stats=50ms"]])
def test_sigusr1_prints_counters_and_the_guest_runs_on(stats):
    """With or without --stats, with any interval (the live view's thread
    must not take the signal and drop it)."""
    vm = popen_pyvmm(*stats, guest("spin"))
    try:
        assert vm.stdout.readline() == "spinning\n"
        vm.send_signal(signal.SIGUSR1)
        wait_for_line(vm, SUMMARY)
        vm.send_signal(signal.SIGUSR1)
        wait_for_line(vm, SUMMARY)
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
        ns.add_quiet_tap("tap100", neighbour=("10.0.0.2", "02:00:00:00:00:02"))
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
    rates = [int(r["net service0: rx fr/s"]) for r in live_rows(err)]
    assert max(rates) >= 1000, err


@pytest.mark.netns
@pytest.mark.parametrize("shm", ["off", "event"])
def test_the_taps_own_drops_are_reported_beside_pyvmms(tmp_path, shm):
    """Datagrams sent while nobody reads the tap (pyvmm stopped with
    SIGSTOP) are dropped by the kernel once the tap's queue is full: --stats
    reports them as the tap's, apart from pyvmm's own drops, exactly as the
    kernel counts them, and with what the guest received they add up to
    what was sent."""
    from pyvmm.devices.net.tap import link_stats

    path = tmp_path / "drops.jsonl"
    with NetNamespace() as ns:
        ns.add_quiet_tap("tap100", neighbour=("10.0.0.2", "02:00:00:00:00:02"))

        def kernel() -> dict:  # pyroute2's reading: not the one under test
            with ns.iproute() as ipr:
                return dict(ipr.get_links(ifname="tap100")[0].get("stats64"))

        before = kernel()
        vm, head = ns.start_pyvmm(
            "--stats=100ms",
            f"--stats-json={path}",
            f"--shm={shm}",
            "--net:service0=tap100",
            "--net-mac:service0=02:00:00:00:00:02",
            guest("udpsink"),
            "10.0.0.2",
            "5000",
            "0",
            "500",
        )
        vm.send_signal(signal.SIGSTOP)
        try:
            sent = ns.run(
                [sys.executable, "-m", "testkit.traffic", "10.0.0.2", "5000"]
                + ["--count", "3000", "--rate", "20000", "--size", "200"],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
        finally:
            vm.send_signal(signal.SIGCONT)
        out, err = vm.communicate(timeout=60)
        after = kernel()
        with ns.inside():
            index = ns.link("tap100")["index"]
            ours = link_stats(index)
    assert vm.returncode == 0, head + out + err
    # pyvmm's reader and pyroute2's agree on every counter.
    assert {k: ours[k] for k in after if k in ours} == {k: after[k] for k in ours if k in after}
    final = json.loads(path.read_text().splitlines()[-1])
    dropped = final["taps"]["service0"]["tx_dropped"]
    assert dropped == after["tx_dropped"] - before["tx_dropped"] > 0
    frames = int(helpers.guest_report(head + out)["frames"])
    assert frames + dropped == json.loads(sent.stdout)["sent"]
    lines = err.splitlines()
    assert (
        f"    dropped by pyvmm: none; by the tap (the kernel): {dropped} to the guest "
        "(not read in time), 0 from it"
    ) in lines, err
    rows = live_rows(err)
    assert any(int(r["dropped: tap/s"]) > 0 for r in rows), err
    assert all(r["dropped: pyvmm/s"] == "0" for r in rows)


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


def test_the_vcpu_thread_s_switches_are_counted_while_the_guest_runs():
    """A guest waiting in a poll hypercall sleeps on the vCPU thread: the
    live counters (read while it runs) already count those switches, and
    the final ones no fewer."""
    out: list[bytes] = []
    vm = Guest(guest("resume"), "1024", "60000", mem=8, console=out.append)
    vm.start()
    try:
        deadline = time.monotonic() + 30
        while b"before:" not in b"".join(out):  # in its wait from now on
            assert time.monotonic() < deadline and vm.error is None, vm.error
            time.sleep(0.02)
        time.sleep(0.2)
        live = vm.counters()
        assert live["vcpu_thread_voluntary_switches"] > 0, live
    finally:
        vm.stop()
    assert vm.wait(timeout=30) == 143
    final = vm.counters()
    assert final["vcpu_thread_voluntary_switches"] >= live["vcpu_thread_voluntary_switches"]
