"""--trace: the start-up and shut-down timeline on
stderr, and the Trace Event JSON file Perfetto and chrome://tracing open."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, guest, run_pyvmm

LAUNCHER = ROOT / "pyvmm" / "_launcher"

# Every run of a guest without devices goes through these, in this order.
PHASES = [
    "interpreter start",
    "imports: command line",
    "argument parsing",
    "imports: VMM",
    "plan: options, memory size",
    "load ELF (headers, notes, manifest)",
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
    # Back to back: each phase starts where the one before ended.
    for before, after in zip(spans, spans[1:], strict=False):
        assert after["ts"] == pytest.approx(before["ts"] + before["dur"], abs=0.002)
    assert spans[0]["ts"] == 0
    # The same timeline on stderr, one line per phase and a total.
    lines = result.stderr.splitlines()
    assert all(line.startswith("pyvmm: trace: ") for line in lines), result.stderr
    for name in PHASES:
        assert any(line[len("pyvmm: trace: ") :].startswith(name) for line in lines), name
    assert "total (to process exit)" in lines[-1]


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
        "from pyvmm import trace\n"
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
