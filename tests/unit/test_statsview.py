"""The human forms of the counters (pyvmm/vm/statsview.py), from snapshots
made here: the live view's fixed columns and repeating header, the
summary's labels, the tap's drops beside pyvmm's, and the JSON records."""

from __future__ import annotations

import io
import json
import os
import re
import time

from pyvmm.vm import statsview
from pyvmm.vm.statsview import HEADER_EVERY, LiveView, StatsOutput, is_live_line, summary


def snapshot(seconds: float, k: int = 1, *, shm: bool = True) -> dict:
    """A run of one net device after ``seconds``, every counter ``k`` times
    a base value (k = 0: nothing moved)."""
    snap = {
        "schema": "pyvmm-stats/1",
        "seconds": seconds,
        "cpl": 3,
        "privilege": "user",
        "exits_to_pyvmm": {"IoOut": 900 * k},
        "hypercalls": {"poll": 880 * k, "puts": 20 * k},
        "hypercalls_in_c": {"answered": 880 * k},
        "kvm": {"exits": 1100 * k, "irq_exits": 5 * k},
        "vcpu_thread_cpu_ns": int(0.3e9 * k),
        "taps": {
            "service0": {
                "tx_packets": 212_000 * k,
                "tx_bytes": 277_000_000 * k,
                "tx_dropped": 3_000 * k,
                "rx_packets": 0,
                "rx_bytes": 0,
                "rx_dropped": 0,
            }
        },
    }
    thread = {
        "wakeups": 9 * k,
        "kicks": 0,
        "sleeps": 9 * k,
        "busy_passes": 100 * k,
        "idle_spins": 12_345_678 * k,
        "cpu_ns": int(0.98e9 * k),
    }
    if shm:
        device = {
            "rx_frames": 209_000 * k,
            "rx_bytes": 273_000_000 * k,
            "rx_drops_full": 7 * k,
            "rx_drops_oversize": 0,
            "rx_bad_index": 0,
            "tx_frames": 0,
            "tx_bytes": 0,
            "tx_drops_bad_len": 0,
            "tx_drops_backend": 0,
            "tx_bad_index": 0,
            "notify_sent": 9 * k,
            "notify_suppressed": 3 * k,
        }
        snap["shmstream"] = {"mode": "poll", "thread": thread, "devices": {"service0": device}}
    else:
        snap["tap_drops"] = {"rx_oversize": 2 * k, "tx": 0}
    return snap


def live_lines(steps: list[int], **kw) -> list[str]:
    """The live view's lines for snapshots a second apart, the counters
    growing by ``steps[i]`` base values in second i."""
    view = LiveView(snapshot(0.0, 0, **kw))
    total, lines = 0, []
    for i, step in enumerate(steps):
        total += step
        lines += view.next(snapshot(float(i + 1), total, **kw)).split("\n")
    return lines


def cells(line: str) -> list[tuple[int, str]]:
    """(right edge, text) of each number on a row."""
    return [(m.end(), m.group()) for m in re.finditer(r"\S+", line[len("pyvmm:") :])]


def test_header_first_and_again_every_n_rows():
    lines = live_lines([1] * (2 * HEADER_EVERY + 5))
    headers = [i for i, line in enumerate(lines) if not re.match(r"pyvmm: +[0-9]", line)]
    # Two header lines (groups, headings) before rows 0, N and 2N.
    step = HEADER_EVERY + 2
    assert headers == [0, 1, step, step + 1, 2 * step, 2 * step + 1]
    assert all(is_live_line(line) for line in lines)
    assert not is_live_line("pyvmm: stopped by SIGINT (Exiting on signal 2)")
    assert not is_live_line("pyvmm: counters after the guest ran 1.000 s (wall clock), x")


def test_fixed_columns_units_in_the_header_one_number_format():
    # A busy second, an idle one (every rate zero), a busy one again.
    groups, headings, *rows = live_lines([1, 0, 1])
    layouts = [[edge for edge, _ in cells(r)] for r in rows]
    assert layouts[0] == layouts[1] == layouts[2]  # nothing vanishes at zero
    assert len(rows[0]) == len(rows[1]) == len(headings)
    # Each heading ends where its column's numbers end.
    edges = layouts[0]
    names = [
        headings[len("pyvmm:") :][a:b].strip() for a, b in zip([0, *edges], edges, strict=False)
    ]
    assert names[0] == "s"
    assert all(n.endswith(("/s", "%")) for n in names[1:]), names
    assert {"rx fr/s", "rx kB/s", "tap/s", "KVM/s", "epoll/s", "wake guest/s"} <= set(names)
    # One number format: the time with one decimal, every rate a whole number.
    for r in rows:
        texts = [text for _, text in cells(r)]
        assert re.fullmatch(r"\d+\.\d", texts[0])
        assert all(re.fullmatch(r"\d+", t) for t in texts[1:]), texts
    assert set(t for _, t in cells(rows[1])[1:]) == {"0"}
    # The groups line spans the same width, a group over its columns.
    assert len(groups) == len(headings)
    assert "net service0" in groups and "IO thread" in groups and "dropped" in groups


def test_rates_are_per_second_in_the_headings_units():
    _, headings, busy = live_lines([2])
    edges = [edge for edge, _ in cells(busy)]
    names = [
        headings[len("pyvmm:") :][a:b].strip() for a, b in zip([0, *edges], edges, strict=False)
    ]
    values = dict(zip(names, (text for _, text in cells(busy)), strict=True))
    assert values["rx fr/s"] == "418000"  # the ring's frames to the guest
    assert values["rx kB/s"] == "546000"
    assert values["tap/s"] == "6000"  # the kernel's drops
    assert values["pyvmm/s"] == "14"  # pyvmm's own drops
    assert values["to pyvmm/s"] == "1800" and values["Python/s"] == "40"  # VM exits
    assert values["vCPU %"] == "60" and values["IO %"] == "196"


def test_hypercall_path_frames_and_drops_come_from_the_tap():
    devices = statsview.net_devices(snapshot(1.0, 1, shm=False))
    assert devices == {
        "service0": {
            "rx_frames": 212_000,
            "rx_bytes": 277_000_000,
            "tx_frames": 0,
            "tx_bytes": 0,
            "drops_oversize": 2,
            "drops_refused": 0,
            "tap_to_guest": 3_000,
            "tap_from_guest": 0,
        }
    }
    assert statsview.pyvmm_drops(snapshot(1.0, 1, shm=False)) == 2


def test_summary_labels_the_run_time_the_cpu_time_and_both_drops():
    text = summary(snapshot(2.0, 1))
    lines = text.splitlines()
    assert lines[0] == (
        "pyvmm: counters after the guest ran 2.000 s (wall clock), privilege user (CPL 3)"
    )
    assert (
        "  net service0: to the guest 209000 frames (273.0 MB), from the guest 0 frames (0 B)"
        in lines
    )
    assert (
        "    dropped by pyvmm: 7 (guest's ring full); by the tap (the kernel): "
        "3000 to the guest (not read in time), 0 from it"
    ) in lines
    assert lines[-1] == (
        "  CPU time: vCPU thread 0.300 s (15% of the run), IO thread 0.980 s (49% of the run)"
    )
    io_line = next(x for x in lines if x.startswith("  IO thread (poll): "))
    assert "returns from epoll 9" in io_line and "woke the guest 9 times" in io_line
    # Nothing dropped anywhere: said so, and the tap is still named.
    quiet = snapshot(1.0, 0)
    assert (
        "    dropped by pyvmm: none; by the tap (the kernel): 0 to the guest (not read in time), "
        "0 from it"
    ) in summary(quiet).splitlines()


def test_json_records_say_which_they_are_when_and_how_it_ended():
    out = io.StringIO()
    out.close = lambda: None  # read it afterwards
    stats = StatsOutput(lambda: snapshot(1.0), summary_at_exit=False, interval=None, json_out=out)
    before = time.time()
    stats.finish(snapshot(1.5), exit_status=141)
    (record,) = [json.loads(x) for x in out.getvalue().splitlines()]
    assert record["record"] == "final" and record["exit_status"] == 141
    assert before <= record["unix_time"] <= time.time()
    assert record["seconds"] == 1.5 and record["schema"] == "pyvmm-stats/1"


def test_json_dash_is_standard_error(capfd):
    out = statsview.open_json("-")
    out.write("{}\n")
    out.close()
    captured = capfd.readouterr()
    assert captured.err == "{}\n" and captured.out == ""


def test_a_stop_right_after_the_start_ends_the_watchers_whenever_they_begin():
    """The watcher threads' start does not wait for them to run, so a run
    may stop before they have: each stop must still end them (no signal
    to a thread that has none yet, no sigwait left waiting). In a child,
    so a hang is a failure, not a stuck suite."""
    import subprocess
    import sys

    program = (
        "import signal, threading\n"
        "from pyvmm.vm.statsview import StatsOutput\n"
        "for _ in range(300):\n"
        "    out = StatsOutput(lambda: {}, summary_at_exit=False, interval=0.5, json_out=None)\n"
        "    out.start()\n"
        "    out.stop()\n"
        "assert threading.active_count() == 1, threading.active_count()\n"
        "assert signal.SIGUSR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_sigusr1_prints_the_counters_from_the_watcher_thread():
    import signal

    live = io.StringIO()
    sampled = []

    def sample():
        sampled.append(1)
        return snapshot(1.0)

    out = StatsOutput(sample, summary_at_exit=False, interval=None, json_out=None, live=live)
    out.start()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # blocked in every thread but the watcher's sigwait
        deadline = time.monotonic() + 10
        while not live.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        out.stop()
    assert sampled and live.getvalue().splitlines()[0] == summary(snapshot(1.0)).splitlines()[0]
