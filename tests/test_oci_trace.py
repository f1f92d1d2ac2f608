"""A container's start-up timeline under the real containerd (docs/orchestration.md).

``ctr run --rm`` through pyvmm-oci with the annotation ``org.pyvmm.trace=DIR``
(or containerd started with ``PYVMM_OCI_TIMELINE=DIR``) leaves one Trace
Event file, ``DIR/ID.trace.json``: the runtime's calls, the shim's start,
the gaps between calls and the VM's own phases, on one clock, in the order
they can only have happened in; on the warm path (a ``pyvmm serve`` of the
test's own), the native calls and the VM's phases from the launcher's
hand-over, after ``start``. Without either, nothing is traced. The
private containerd is testkit's (its own directories, taken down after).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import guest, need_tool
from pyvmm.oci import image as oci_image
from pyvmm.oci import timeline
from testkit.containerd import Containerd

pytestmark = pytest.mark.kvm

HELLO = "docker.io/pyvmm/hello:latest"
SPIN = "docker.io/pyvmm/spin:latest"
NATIVE = Path(oci_image.__file__).parent.parent / "_oci"
FIRST_RUN = "to the first KVM_RUN (first guest instruction)"


def _start(env: dict[str, str] | None = None) -> Containerd:
    need_tool("containerd-shim-runc-v2")
    if not os.access(NATIVE, os.X_OK):
        pytest.fail(f"{NATIVE} is missing: run 'python3 setup.py build_ext --inplace'")
    ctd = Containerd(str(NATIVE), need_tool, env=env)
    try:
        ctd.start()
        for name in ("hello", "spin"):
            archive = os.path.join(ctd.dir, f"{name}.tar")
            oci_image.build(str(guest(name)), archive)
            ctd.ctr("image", "import", archive)
    except BaseException:
        ctd.stop()
        raise
    return ctd


def _stopped(ctd: Containerd) -> None:
    leftovers = ctd.stop()
    assert not os.path.exists(ctd.dir)
    assert not leftovers, leftovers


@pytest.fixture(scope="module")
def containerd():
    ctd = _start()
    try:
        yield ctd
    finally:
        _stopped(ctd)


@pytest.fixture
def trace_dir(tmp_path) -> Path:
    where = tmp_path / "traces"
    where.mkdir(mode=0o700)
    return where


def _run_traced(ctd: Containerd, cid: str, where: Path, runtime: str | None = None) -> dict:
    done = subprocess.run(
        ctd.run_argv(
            HELLO, cid, options=("--annotation", f"{timeline.ANNOTATION}={where}"), runtime=runtime
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Hello, world" in done.stdout
    assert ctd.containers() == []
    assert sorted(os.listdir(where)) == [f"{cid}.trace.json"]
    path = where / f"{cid}.trace.json"
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()
    with open(path) as f:
        return json.load(f)  # one valid JSON document


def _check_timeline(trace: dict, runtimes: dict[str, str]) -> None:
    """The calls, the VM's phases and the gaps, in the only order they can
    have: each call after the previous one; the VM after create, its first
    instruction after start began (OCI's create/start split), delete after
    the VM's exit; every gap between the calls it names."""
    assert trace["otherData"]["clock"] == "CLOCK_MONOTONIC"
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    calls = sorted((e for e in spans if e["cat"] == timeline.CALL), key=lambda e: e["ts"])
    names = [c["name"] for c in calls]
    assert names[0] == "create" and names[-1] == "delete" and "start" in names, names
    for before, after in zip(calls, calls[1:], strict=False):
        # A call the Python runtime began on its own starts at its process's
        # start time, in clock ticks: up to 10 ms early.
        early = 10_000 if after["args"].get("begin") == timeline.STAT_BEGIN else 0
        assert before["ts"] + before["dur"] <= after["ts"] + early, (before, after)
    for call in calls:
        assert call["args"]["status"] == 0, call
        expected = runtimes.get(call["name"], runtimes.get("*"))
        assert call["args"]["runtime"] == expected, call
    by_name = {c["name"]: c for c in calls}
    create, start, delete = by_name["create"], by_name["start"], by_name["delete"]

    vm = [e for e in spans if e["cat"] == "pyvmm"]
    vm_pid = vm[0]["pid"]
    assert vm_pid not in {c["args"]["pid"] for c in calls}
    main = sorted((e for e in vm if e["tid"] == vm_pid), key=lambda e: e["ts"])
    phases = [e["name"] for e in main]
    assert phases[0] == "interpreter start" and FIRST_RUN in phases, phases
    assert "guest: run to its end" in phases
    for before, after in zip(main, main[1:], strict=False):  # a chain: back to back
        assert before["ts"] + before["dur"] <= after["ts"] + 0.002, (before, after)
    first_run = next(e for e in main if e["name"] == FIRST_RUN)
    vm_end = max(e["ts"] + e["dur"] for e in vm)
    assert create["ts"] + create["dur"] <= main[0]["ts"]
    assert start["ts"] <= first_run["ts"]
    assert vm_end <= delete["ts"] + (
        10_000 if delete["args"].get("begin") == timeline.STAT_BEGIN else 0
    )

    gaps = sorted((e for e in spans if e["name"] == "between calls"), key=lambda e: e["ts"])
    assert len(gaps) == len(calls) - 1
    for gap, before, after in zip(gaps, calls[:-1], calls[1:], strict=True):
        assert gap["args"] == {"after": before["name"], "before": after["name"]}
        assert gap["ts"] == pytest.approx(before["ts"] + before["dur"], abs=0.002)
        assert gap["ts"] + gap["dur"] == pytest.approx(after["ts"], abs=0.002)
    shim = [e for e in spans if e["cat"] == timeline.GAP and e["name"] != "between calls"]
    assert len(shim) == 1 and shim[0]["args"]["comm"].startswith("containerd-shim")
    assert shim[0]["ts"] <= create["ts"]
    named = {e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {timeline.RUNTIME_PID, timeline.CONTAINERD_PID, vm_pid} <= named


def test_ctr_run_with_the_annotation_leaves_one_timeline_of_calls_and_vm_phases(
    containerd, trace_dir
):
    trace = _run_traced(containerd, "trace1", trace_dir)
    # create execs the Python runtime; the front end answers the others itself.
    _check_timeline(trace, {"create": "python", "*": "native"})


def test_the_python_runtime_alone_writes_the_same_timeline(containerd, trace_dir):
    python_only = Path(sys.executable).with_name("pyvmm-oci")
    if not python_only.exists():
        pytest.fail(f"{python_only} is missing: scripts/setup installs the package")
    trace = _run_traced(containerd, "trace2", trace_dir, runtime=str(python_only))
    _check_timeline(trace, {"*": "python"})


def test_a_link_at_the_destination_is_replaced_not_followed(containerd, trace_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("unchanged\n")
    (trace_dir / "trace3.trace.json").symlink_to(victim)
    trace = _run_traced(containerd, "trace3", trace_dir)
    assert victim.read_text() == "unchanged\n"
    assert any(e["name"] == FIRST_RUN for e in trace["traceEvents"])


def test_nothing_is_traced_when_not_asked(containerd, trace_dir):
    proc = subprocess.Popen(
        containerd.run_argv(SPIN, "untraced1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("spinning")
        state_dir = Path(containerd.runc_root) / "default" / "untraced1"
        assert not (state_dir / timeline.LOG).exists()
        assert not (state_dir / timeline.VM_TRACE).exists()
        argv = json.loads((state_dir / "state.json").read_text())["argv"]
        assert not any(a.startswith("--trace") for a in argv), argv
        containerd.ctr("task", "kill", "untraced1")
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "pyvmm: trace:" not in proc.stderr.read()
    assert os.listdir(trace_dir) == []
    assert containerd.containers() == []


@pytest.mark.parametrize(
    "value, line",
    [
        ("traces", "org.pyvmm.trace: 'traces' is not an absolute path of a directory"),
        ("/nonexistent/traces", "org.pyvmm.trace: /nonexistent/traces: No such file or directory"),
        ("LINK", "org.pyvmm.trace: {value} is not a directory (a link is not followed)"),
    ],
)
def test_a_bad_trace_directory_fails_create_with_one_line(containerd, tmp_path, value, line):
    if value == "LINK":
        (tmp_path / "real").mkdir()
        (tmp_path / "link").symlink_to(tmp_path / "real")
        value = str(tmp_path / "link")
    done = containerd.run(
        HELLO, "badtrace1", options=("--annotation", f"{timeline.ANNOTATION}={value}")
    )
    assert done.returncode != 0
    line = line.format(value=value)
    assert f"OCI runtime create failed: {line}" in done.stderr, done.stderr
    assert containerd.containers() == []


def test_the_runtime_s_environment_traces_every_container(trace_dir):
    ctd = _start({timeline.ENVIRONMENT: str(trace_dir)})
    try:
        done = ctd.run(HELLO, "envtrace1")
        assert done.returncode == 0, done.stderr
        with open(trace_dir / "envtrace1.trace.json") as f:
            _check_timeline(json.load(f), {"create": "python", "*": "native"})
    finally:
        _stopped(ctd)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    from test_oci_warm import Launcher

    server = Launcher(tmp_path_factory.mktemp("warm-trace"))
    try:
        yield server
    finally:
        status = server.stop()
    assert status == 128 + signal.SIGTERM, server.log.read_text()


def test_the_warm_path_s_timeline_has_its_calls_and_the_vm_only_after_start(
    containerd, launcher, trace_dir
):
    """On the warm path the VM was prepared at create in the launcher: the
    timeline shows the native calls and the VM's phases from the launcher's
    hand-over, which begins only after start began."""
    before = set(launcher.vms())
    options = (
        "--annotation",
        f"{timeline.ANNOTATION}={trace_dir}",
        "--annotation",
        f"org.pyvmm.launcher={launcher.path}",
    )
    done = containerd.run(HELLO, "warmtrace1", options=options)
    assert done.returncode == 0, done.stderr
    assert len(set(launcher.vms()) - before) == 1  # the warm path, not a fall-back
    with open(trace_dir / "warmtrace1.trace.json") as f:
        trace = json.load(f)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    calls = sorted((e for e in spans if e["cat"] == timeline.CALL), key=lambda e: e["ts"])
    assert [c["name"] for c in calls][0] == "create" and calls[-1]["name"] == "delete"
    assert {c["args"]["runtime"] for c in calls} == {"native"}
    for before_call, after in zip(calls, calls[1:], strict=False):
        assert before_call["ts"] + before_call["dur"] <= after["ts"]
    start = next(c for c in calls if c["name"] == "start")
    vm = [e for e in spans if e["cat"] == "pyvmm"]
    assert any(e["name"].startswith("launcher:") for e in vm), vm
    first_run = next(e for e in vm if e["name"] == FIRST_RUN)
    assert start["ts"] <= min(e["ts"] for e in vm) <= first_run["ts"]
    assert max(e["ts"] + e["dur"] for e in vm) <= calls[-1]["ts"]
