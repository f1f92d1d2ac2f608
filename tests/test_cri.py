"""The path kubelet takes: containerd's CRI plugin with a ``pyvmm`` runtime
handler, driven by a CRI client (docs/orchestration.md, "CRI").

A private containerd with its CRI plugin on (``testkit.cri``) runs inside a
network namespace this module creates, with Debian's CNI plugins (bridge +
host-local + loopback): the bridge, the pods' veths and their addresses
never touch the host's namespace. The ``pyvmm`` handler is
io.containerd.runc.v2 with the checkout's pyvmm-oci as its BinaryName; the
pod sandbox (pause) is a static program built here and imported, which
pyvmm-oci hands to runc. The client speaks CRI v1 over gRPC with messages
generated at run time from ``testkit/cri/cri.proto``. After each pod and
after the module: no pod, container, shim, guest, cgroup, network
namespace, tap or mount is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from conftest import guest, need_tool
from pyvmm.oci import image as oci_image
from pyvmm.oci.cgroups import is_v2
from testkit.containerd import mounts_under, pids_mentioning
from testkit.cri import stubs
from testkit.cri.containerd import BRIDGE, CNI_RESULTS, CriContainerd, cgroup_dirs

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

NATIVE = Path(oci_image.__file__).parent.parent / "_oci"
IMAGES = {  # name: (kernel, net-args template)
    "hello": ("hello", None),
    "args": ("args", None),
    "spin": ("spin", None),
    "ping": ("ping", "{ip}"),
}
#: kubelet's container log format (CRI): RFC 3339 nano time, stream, tag (F
#: a full line, P a partial one), the line.
LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+(?:Z|[+-]\d\d:\d\d)) (stdout|stderr) ([FP]) (.*)$"
)


def ref(name: str) -> str:
    return f"docker.io/pyvmm/{name}:latest"


@pytest.fixture(scope="module")
def cri():
    for tool in ("containerd", "ctr", "containerd-shim-runc-v2", "runc", "gcc"):
        need_tool(tool)
    if not os.access(NATIVE, os.X_OK):
        pytest.fail(f"{NATIVE} is missing: run scripts/setup")
    try:
        stubs.generate()  # the CRI client's messages, once per machine
    except stubs.StubError as err:
        pytest.fail(str(err))
    ctd = CriContainerd(str(NATIVE))
    owner = os.getpid()

    def on_term(signum: int, _frame: object) -> None:
        # A SIGTERM (CI's timeout, a killed run) ends the session through
        # the teardowns, so containerd and its pods go too; a forked helper
        # (pyroute2's) that gets one just exits.
        if os.getpid() != owner:
            os._exit(128 + signum)
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        archives = []
        for name, (kernel, net_args) in IMAGES.items():
            archive = ctd.dir / f"{name}.tar"
            oci_image.build(str(guest(kernel)), str(archive), net_args=net_args)
            archives.append(archive)
        ctd.start(archives)
        yield ctd
    finally:
        forced = ctd.stop()
        signal.signal(signal.SIGTERM, previous)
    # Nothing of it anywhere: its directory (state, sockets, pods' netns
    # mounts), its processes, its cgroups, its namespace, CNI's results.
    assert not forced, forced
    assert not ctd.dir.exists()
    assert pids_mentioning(str(ctd.dir)) == []
    assert cgroup_dirs(ctd.cgroup_parent) == []
    assert not ctd.ns.exists()
    assert mounts_under(str(ctd.dir)) == []  # the pods' network namespaces were mounted there
    if os.path.isdir(CNI_RESULTS):
        assert [f for f in os.listdir(CNI_RESULTS) if f.startswith(ctd.network)] == []


def _log_lines(path: Path) -> list[tuple[str, str, str]]:
    """The CRI log's (stream, tag, line) entries; every line must parse."""
    entries = []
    for raw in path.read_text().splitlines():
        match = LOG_LINE.match(raw)
        assert match, f"not kubelet's log format: {raw!r}"
        entries.append(match.group(2, 3, 4))
    return entries


def _wait_for_log(path: Path, text: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for _, _, line in _log_lines(path)] if path.exists() else []
        if any(line.startswith(text) for line in lines):
            return lines
        assert time.monotonic() < deadline, f"no {text!r} in {path}: {lines}"
        time.sleep(0.05)


def _assert_pod_gone(cri: CriContainerd, pod) -> None:
    """After RemovePodSandbox: nothing of the pod in the CRI, in either
    runtime's state, among processes, cgroups, mounts or links."""
    assert [p.id for p in cri.cri.rt("ListPodSandbox").items] == []
    assert list(cri.cri.rt("ListContainers").containers) == []
    state = cri.pyvmm_root / "k8s.io"
    assert sorted(os.listdir(state)) in ([], [".runc"]), os.listdir(state)
    if (state / ".runc").exists():
        assert os.listdir(state / ".runc") == []
    assert pids_mentioning(pod.id) == []
    assert cgroup_dirs(pod.cgroup) == []
    assert [m for m in mounts_under(str(cri.dir)) if pod.id in m] == []
    # The bridge stays (CNI's, for the next pod); the pod's veth and tap went.
    assert sorted(cri.ns.links()) == sorted(["lo", BRIDGE])


def _pyvmm_threads_cgroup(pid: int) -> set[str]:
    """The cpuacct (v1) or unified (v2) cgroup of each of pyvmm's threads."""
    paths = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                if (names == "") if is_v2() else ("cpuacct" in names.split(",")):
                    paths.add(path)
    return paths


def _cpu_usage_ns(cgroup: str) -> int:
    """The cgroup's own CPU time, as the shim reads it (v1 cpuacct, v2 cpu.stat)."""
    name = "cpu.stat" if is_v2() else "cpuacct.usage"
    (path,) = [p for d in cgroup_dirs(cgroup) if os.path.exists(p := os.path.join(d, name))]
    with open(path) as f:
        if not is_v2():
            return int(f.read())
        return 1000 * int(next(x for x in f if x.startswith("usage_usec")).split()[1])


def test_a_unikernel_pod_runs_hello_and_its_log_status_and_exit_code_are_kubelet_s(cri):
    """RunPodSandbox (CNI) with the pyvmm handler, whose pause pyvmm-oci gives
    runc; CreateContainer and StartContainer of the hello unikernel;
    ContainerStatus says exited 0, Completed; the CRI log is kubelet's
    format; StopPodSandbox and RemovePodSandbox leave nothing."""
    pod = cri.run_pod("hello", "pyvmm")
    try:
        status = pod.status()
        assert status.state == cri.cri.pb.SANDBOX_READY
        assert status.runtime_handler == "pyvmm"
        assert status.network.ip.startswith("10.88.0."), status.network.ip
        verbose = cri.cri.rt("PodSandboxStatus", pod_sandbox_id=pod.id, verbose=True)
        spec = json.loads(verbose.info["info"])["runtimeSpec"]
        (netns,) = [n["path"] for n in spec["linux"]["namespaces"] if n["type"] == "network"]
        assert netns.startswith(f"{cri.dir}/state/")  # so the teardown's mount check covers it
        # The pause container went to runc, below pyvmm-oci's root.
        assert (cri.pyvmm_root / "k8s.io" / ".runc" / pod.id).is_dir()
        cid = pod.create("hello", ref("hello"))
        assert pod.container(cid).state == cri.cri.pb.CONTAINER_CREATED
        spec = pod.info(cid)["runtimeSpec"]
        assert spec["linux"]["cgroupsPath"] == f"{pod.cgroup}/{cid}"
        pod.start(cid)
        done = pod.wait_exited(cid)
        assert (done.exit_code, done.reason) == (0, "Completed")
        assert done.started_at <= done.finished_at
        assert done.log_path == str(pod.log_path("hello"))
        entries = _log_lines(pod.log_path("hello"))
        assert ("stdout", "F", "Hello, world") in entries
        assert entries[-1] == ("stdout", "F", "SUCCESS")
        assert cgroup_dirs(f"{pod.cgroup}/{cid}") == []  # the VM's cgroup went at its end
        assert os.listdir(cri.pyvmm_root / "k8s.io") == [".runc"]  # only the pause is left
    finally:
        pod.remove()
    _assert_pod_gone(cri, pod)


def test_a_pod_s_args_reach_the_guest_and_its_exit_code_the_cri(cri):
    pod = cri.run_pod("args", "pyvmm")
    try:
        cid = pod.create("args", ref("args"), args=["7", "foo"])
        pod.start(cid)
        done = pod.wait_exited(cid)
        assert (done.exit_code, done.reason) == (7, "Error")
        lines = [line for _, _, line in _log_lines(pod.log_path("args"))]
        assert any("7 foo" in line for line in lines), lines
    finally:
        pod.remove()
    _assert_pod_gone(cri, pod)


def test_a_networked_unikernel_pod_answers_ping_on_its_pod_ip(cri):
    """The ping unikernel takes the pod's CNI address (the veth's, through
    pyvmm-oci's tap) and answers ping from the bridge's side, in the test's
    namespace. Told to answer 3 requests, it exits 0 after the third: the
    answers were the guest's, not the pod namespace's own stack."""
    pod = cri.run_pod("ping", "pyvmm")
    try:
        ip = pod.status().network.ip
        cid = pod.create("ping", ref("ping"), args=["3"])
        pod.start(cid)
        lines = _wait_for_log(pod.log_path("ping"), "ready")
        assert f"IP: {ip}" in lines, lines
        route = cri.ns.run(["ip", "route", "get", ip], capture_output=True, text=True).stdout
        assert f"dev {BRIDGE}" in route, route  # the bridge, in the test's namespace
        done = cri.ns.run(
            ["ping", "-c", "3", "-i", "0.2", "-W", "5", ip], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert " 0% packet loss" in done.stdout
        finished = pod.wait_exited(cid)
        assert (finished.exit_code, finished.reason) == (0, "Completed")
        lines = [line for _, _, line in _log_lines(pod.log_path("ping"))]
        assert "answered 3 echo requests" in lines, lines
    finally:
        pod.remove()
    _assert_pod_gone(cri, pod)


def test_container_stats_are_the_vm_s_cgroup_s_and_stop_container_ends_it(cri):
    """A spinning unikernel: pyvmm and every thread of it sit in the
    container's cgroup (cgroupsPath below the pod's), ContainerStats' CPU
    time lies between two readings of that cgroup's own accounting taken
    around the call, and StopContainer ends it with SIGTERM (143)."""
    pod = cri.run_pod("spin", "pyvmm")
    try:
        cid = pod.create("spin", ref("spin"))
        pod.start(cid)
        _wait_for_log(pod.log_path("spin"), "spinning")
        info = pod.info(cid)
        cgroup = info["runtimeSpec"]["linux"]["cgroupsPath"]
        assert cgroup == f"{pod.cgroup}/{cid}"
        assert _pyvmm_threads_cgroup(info["pid"]) == {cgroup}
        before = _cpu_usage_ns(cgroup)
        stats = cri.cri.rt("ContainerStats", container_id=cid).stats
        after = _cpu_usage_ns(cgroup)
        assert stats.attributes.id == cid
        assert 0 < before <= stats.cpu.usage_core_nano_seconds.value <= after
        assert stats.memory.working_set_bytes.value > 0
        cri.cri.rt("StopContainer", container_id=cid, timeout=10)
        stopped = pod.wait_exited(cid)
        assert stopped.exit_code == 128 + signal.SIGTERM
        assert cgroup_dirs(cgroup) == []
    finally:
        pod.remove()
    _assert_pod_gone(cri, pod)
