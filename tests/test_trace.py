"""--trace: the start-up and shut-down timeline on
stderr, and the Trace Event JSON file Perfetto and chrome://tracing open."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, guest, run_pyvmm
from testkit.netns import NetNamespace

LAUNCHER = ROOT / "pyvmm" / "_launcher"

# Every run of a guest without devices goes through these, in this order.
PHASES = [
    "interpreter start",
    "imports: command line",
    "argument parsing",
    "imports: VMM",
    "plan: options, memory size",
    "load ELF (headers, notes, manifest)",
    "plan: the host architecture's code (its first import)",
    "plan",
    "devices and taps",
    "open /dev/kvm",
    "create VM",
    "map guest memory",
    "page tables, ELF segments placed",
    "vCPU set-up, boot info, hypercall table",
    "counters (SIGUSR1 watcher)",
    "sandbox (seccomp filter)",
    "to the first KVM_RUN (first guest instruction)",
    "guest: to the first hypercall (puts)",
    "guest: run to its end",
    "tear-down: counters",
    "tear-down: vCPU, eventfds, IO service",
    "tear-down: unmap guest memory",
    "tear-down: destroy VM",
    "tear-down: close /dev/kvm",
    "tear-down: devices (taps, disks)",
    "flush and exit",
]


def _events(path) -> list[dict]:
    data = json.loads(path.read_text())
    assert set(data) >= {"traceEvents"}
    return data["traceEvents"]


def _named(events: list[dict]) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    """The process_name and thread_name metadata: every event's process and
    thread have exactly one name."""
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    meta = [e for e in events if e["ph"] == "M"]
    assert len(meta) == len(processes) + len(threads)  # one each
    for event in events:
        if event["ph"] == "X":
            assert event["pid"] in processes and (event["pid"], event["tid"]) in threads, event
    return processes, threads


@pytest.mark.kvm
@pytest.mark.parametrize("how", ["launcher", "python -m"])
def test_trace_file_is_trace_event_json_with_every_phase(tmp_path, how):
    out = tmp_path / "trace.json"
    args = [f"--trace={out}", str(guest("hello"))]
    if how == "launcher":
        result = subprocess.run(
            [str(LAUNCHER), *args], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
    else:
        result = run_pyvmm(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout == run_pyvmm(guest("hello")).stdout  # the guest's output unchanged
    events = _events(out)
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in spans] == PHASES
    for event in spans:
        assert set(event) >= {"name", "ph", "ts", "dur", "pid", "tid"}, event
        assert event["dur"] >= 0 and event["ts"] >= 0
    # One process, its main thread (no other thread runs a phase here).
    pid = spans[0]["pid"]
    assert {(e["pid"], e["tid"]) for e in spans} == {(pid, pid)}
    processes, threads = _named(events)
    assert processes == {pid: "pyvmm"} and threads == {(pid, pid): "main: set-up, vCPU, tear-down"}
    # Back to back: each phase starts where the one before ended.
    for before, after in zip(spans, spans[1:], strict=False):
        assert after["ts"] == pytest.approx(before["ts"] + before["dur"], abs=0.002)
    assert spans[0]["ts"] == 0
    # Facts where there are some.
    by_name = {e["name"]: e for e in spans}
    start = "the launcher's exec" if how == "launcher" else "/proc/self/stat"
    assert by_name["interpreter start"]["args"] == {"from": start}
    assert by_name["map guest memory"]["args"] == {"bytes": 512 << 20}
    assert by_name["plan"]["args"]["privilege"] in ("kernel", "user")
    assert by_name["tear-down: counters"]["args"] == {"exit_status": 0}
    # The same timeline on stderr, one line per phase and a total.
    lines = result.stderr.splitlines()
    assert all(line.startswith("pyvmm: trace: ") for line in lines), result.stderr
    for name in PHASES:
        assert any(line[len("pyvmm: trace: ") :].startswith(name) for line in lines), name
    assert "total (to process exit)" in lines[-1]


@pytest.mark.kvm
@pytest.mark.netns
def test_trace_events_on_their_own_threads(tmp_path):
    """With net devices and the live counters, the IO thread's life and each
    row of counters are events on their own threads, each named, the IO
    thread's with its counters as args; each thread's phases back to back."""
    out = tmp_path / "trace.json"
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, head = ns.start_pyvmm(
            f"--trace={out}",
            "--stats=20ms",
            "--shm=event",
            "--net:service0=tap100",
            guest("ping"),
            "10.0.0.2",
        )
        ns.run(["ping", "-c", "3", "-i", "0.1", "10.0.0.2"], check=True, capture_output=True)
        vm.send_signal(signal.SIGTERM)
        _, err = vm.communicate(timeout=30)
    assert vm.returncode == 143, err
    events = _events(out)
    processes, threads = _named(events)
    spans = [e for e in events if e["ph"] == "X"]
    pid = spans[0]["pid"]
    assert list(processes) == [pid]
    io = [e for e in spans if e["name"] == "IO thread (event): serving the net devices"]
    rows = [e for e in spans if e["name"] == "counters: one interval's row"]
    assert len(io) == 1 and rows
    (io_tid,) = {e["tid"] for e in io}
    (rows_tid,) = {e["tid"] for e in rows}
    assert len({pid, io_tid, rows_tid}) == 3  # three threads
    assert threads[(pid, io_tid)] == "IO thread" and threads[(pid, rows_tid)] == "pyvmm-stats"
    assert io[0]["args"]["wakeups"] > 0 and io[0]["args"]["cpu_ns"] > 0
    assert [e["args"]["row"] for e in rows] == list(range(1, len(rows) + 1))
    # The IO thread lives from its start to its stop, within the guest's run.
    marks = {e["name"]: e for e in spans if e["tid"] == pid}
    start, stop = marks["IO thread start"], marks["tear-down: IO thread stop"]
    assert start["ts"] + start["dur"] <= io[0]["ts"] + 0.002
    assert io[0]["ts"] + io[0]["dur"] <= stop["ts"] + stop["dur"] + 0.002
    main = [e for e in spans if e["tid"] == pid]
    for before, after in zip(main, main[1:], strict=False):
        assert after["ts"] == pytest.approx(before["ts"] + before["dur"], abs=0.002)
    # On stderr, the other threads' spans say whose they are.
    assert any(
        line.startswith("pyvmm: trace: IO thread (event): serving the net devices [IO thread] ")
        for line in err.splitlines()
    ), err


@pytest.mark.kvm
def test_trace_through_the_launcher_puts_its_part_in_its_process(tmp_path):
    """pyvmm serve: the launcher's part of a start is an event of the
    launcher's own process (named), the VM's phases of the child's."""
    from test_serve import Launcher, client

    server = Launcher(tmp_path)
    try:
        out = tmp_path / "trace.json"
        proc = client(server, f"--trace={out}", "--mem=64", guest("hello"))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        assert server.stop() == 128 + signal.SIGTERM
    events = _events(out)
    processes, threads = _named(events)
    spans = [e for e in events if e["ph"] == "X"]
    launcher = [e for e in spans if e["pid"] == server.proc.pid]
    assert [e["name"] for e in launcher] == ["launcher: request read, parsed, planned; fork"]
    assert processes[server.proc.pid] == "pyvmm serve"
    assert threads[(server.proc.pid, server.proc.pid)] == "launcher"
    (child,) = set(processes) - {server.proc.pid}
    assert processes[child] == "pyvmm"
    assert {e["pid"] for e in spans} == {server.proc.pid, child}
    # The child's first phase begins where the launcher's part ended.
    first = next(e for e in spans if e["pid"] == child)
    assert first["ts"] == pytest.approx(launcher[0]["ts"] + launcher[0]["dur"], abs=0.002)


@pytest.mark.kvm
def test_trace_without_file_is_stderr_only():
    result = run_pyvmm("--trace", guest("hello"))
    assert result.returncode == 0
    assert "pyvmm: trace: interpreter start" in result.stderr
    assert "pyvmm: trace:" not in result.stdout


def test_trace_file_that_cannot_be_created_is_one_line(tmp_path):
    result = run_pyvmm(f"--trace={tmp_path}/missing/t.json", guest("hello"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"pyvmm: --trace: cannot create {tmp_path}/missing/t.json: No such file or directory"
    ]


def test_trace_is_a_no_op_until_enabled():
    """Off, ``mark`` is the module's empty function (no list, no clock)."""
    code = (
        "from pyvmm.common import trace\n"
        "before = len(trace._marks)\n"
        "trace.mark('x')\n"
        "assert len(trace._marks) == before and trace.mark.__code__.co_code is not None\n"
        "assert trace.mark is not trace._mark\n"
        "trace.enable()\n"
        "trace.mark('y')\n"
        "assert trace._marks[-1][0] == 'y'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
