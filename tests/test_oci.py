"""pyvmm-oci under the real containerd (docs/orchestration.md).

A private containerd (its own --root, --state, socket and config, the CRI
plugin off) runs for this module; images packed by ``pyvmm.oci.image`` are
imported with ``ctr image import`` and run with ``ctr run --runc-binary
pyvmm-oci`` through the standard io.containerd.runc.v2 shim. The network
test prepares two namespaces as CNI would (a veth pair, the pod's end with
an address and a default route) and pings the unikernel from the other
end; no frame touches the host's namespace. Teardown (also on failure):
tasks and containers deleted, containerd stopped, any shim or guest still
alive under the private directories killed by pid, their mounts detached,
the directories removed; the namespaces go with ``NetNamespace``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from conftest import guest, need_tool
from pyvmm.oci import image as oci_image
from pyvmm.oci.cgroups import DEFAULT_ROOT, PYVMM_OVERHEAD_MIB, V1_CONTROLLERS, is_v2
from testkit.containerd import CTR_TIMEOUT, Containerd
from testkit.containerd import pids_mentioning as _pids_mentioning
from testkit.netns import NetNamespace

pytestmark = pytest.mark.kvm

IMAGES = {  # name: (kernel, default args, net-args template)
    "hello": ("hello", [], None),
    "args": ("args", ["3", "default"], None),
    "spin": ("spin", [], None),
    "ping": ("ping", [], "{ip}"),
}


NATIVE = Path(oci_image.__file__).parent.parent / "_oci"


def native_runtime() -> str:
    """pyvmm-oci's native front end, as the build leaves it in the package."""
    if not os.access(NATIVE, os.X_OK):
        pytest.fail(f"{NATIVE} is missing: run 'python3 setup.py build_ext --inplace'")
    return str(NATIVE)


def runtime_binary() -> str:
    """pyvmm-oci as the shim should call it: the native front end, else the
    script installed next to this Python (pip's), else on PATH."""
    if os.access(NATIVE, os.X_OK):
        return str(NATIVE)
    beside = Path(sys.executable).with_name("pyvmm-oci")
    if beside.exists():
        return str(beside)
    return need_tool("pyvmm-oci")


@pytest.fixture(scope="module")
def containerd():
    need_tool("containerd-shim-runc-v2")
    ctd = Containerd(runtime_binary(), need_tool)
    try:
        ctd.start()
        for name, (kernel, args, net_args) in IMAGES.items():
            archive = os.path.join(ctd.dir, f"{name}.tar")
            oci_image.build(str(guest(kernel)), archive, args=args, net_args=net_args)
            ctd.ctr("image", "import", archive)
        yield ctd
    finally:
        leftovers = ctd.stop()
    assert not os.path.exists(ctd.dir)
    assert not leftovers, leftovers


def ref(name: str) -> str:
    return f"docker.io/pyvmm/{name}:latest"


class Lines:
    """A process's stdout, read on a thread, waited for line by line."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, prefix: str, timeout: float = 30) -> str:
        with self.cond:
            ok = self.cond.wait_for(
                lambda: any(x.startswith(prefix) for x in self.lines), timeout=timeout
            )
            assert ok, f"no {prefix!r} line in {self.lines}"
            return next(x for x in self.lines if x.startswith(prefix))


def _cgroup_dirs(path: str) -> list[str]:
    """The container's cgroup directories that exist, in every v1 hierarchy."""
    dirs = [os.path.join(DEFAULT_ROOT, c, path.lstrip("/")) for c in V1_CONTROLLERS]
    return [d for d in dirs if os.path.isdir(d)]


def _cgroups_of(pid: int) -> dict[str, dict[str, str]]:
    """Every thread of ``pid``: its cgroup per v1 controller."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
        threads[tid] = {c: p for _, names, p in lines for c in names.split(",") if c}
    return threads


def _spec_of(root: str, cid: str) -> dict:
    """The config.json containerd wrote for the container (its bundle, as pyvmm-oci keeps it)."""
    with open(os.path.join(root, cid, "state.json")) as f:
        bundle = json.load(f)["bundle"]
    with open(os.path.join(bundle, "config.json")) as f:
        return json.load(f)


def test_hello_prints_its_output_and_exits_0_with_the_memory_limit_as_mem(containerd):
    # The limit less pyvmm's share is 33 MiB: pyvmm's --mem=33 says it rounds
    # down to 32 (its note on stderr).
    limit = (PYVMM_OVERHEAD_MIB + 33) << 20
    done = containerd.run(ref("hello"), "hello1", options=("--memory-limit", str(limit)))
    assert done.returncode == 0, done.stderr
    assert "pyvmm: adjusting memory to 33554432 bytes" in done.stderr
    assert _cgroup_dirs("/default/hello1") == []  # the guest ended, delete removed its cgroup
    assert "Hello, world" in done.stdout
    assert done.stdout.rstrip().endswith("SUCCESS")
    assert containerd.containers() == []
    with open(containerd.trace) as f:
        commands = [json.loads(line.split(" ", 2)[2]) for line in f]
    # What the shim called: create with the bundle and pid file, then start.
    create = next(c for c in commands if "create" in c and c[-1] == "hello1")
    assert "--bundle" in create and "--pid-file" in create and "--root" in create


def test_a_memory_limit_too_small_for_pyvmm_and_a_guest_gets_one_line(containerd):
    done = containerd.run(ref("hello"), "tiny1", options=("--memory-limit", str(8 << 20)))
    assert done.returncode != 0
    assert (
        "OCI runtime create failed: memory limit 8388608 bytes is too small for a VM: pyvmm "
        f"needs {PYVMM_OVERHEAD_MIB} MiB besides the guest's memory" in done.stderr
    ), done.stderr
    assert containerd.containers() == []
    assert _cgroup_dirs("/default/tiny1") == []


@pytest.mark.skipif(is_v2(), reason="the host's cgroups are v2 (the v2 layout: unit tests)")
def test_a_quarter_cpu_limit_holds_a_spinning_guest_in_the_container_s_cgroup(containerd):
    """ctr run --cpus 0.25: pyvmm and each of its threads sit in the
    cgroup the spec names, in every controller; the kernel holds the
    spinning guest to its quota (measured from the cgroup's own CPU
    accounting, not by the clock); delete removes the cgroup."""
    proc = subprocess.Popen(
        containerd.run_argv(ref("spin"), "quarter1", options=("--cpus", "0.25")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        Lines(proc.stdout).wait_for("spinning")
        spec = _spec_of(os.path.join(containerd.runc_root, "default"), "quarter1")
        path = spec["linux"]["cgroupsPath"]
        assert path == "/default/quarter1"  # what ctr 1.6 passes: /NAMESPACE/ID
        assert spec["linux"]["resources"]["cpu"] == {
            "quota": 25000,
            "period": 100000,
            "shares": 1024,
        }
        tasks = containerd.ctr("task", "ls").stdout
        pid = int(tasks.split("quarter1", 1)[1].split()[0])
        threads = _cgroups_of(pid)
        assert len(threads) >= 2  # pyvmm's vCPU thread and its helpers
        for tid, where in threads.items():
            assert {c: where[c] for c in V1_CONTROLLERS} == dict.fromkeys(V1_CONTROLLERS, path), tid
        cpu = os.path.join(DEFAULT_ROOT, "cpu", path.lstrip("/"))
        with open(os.path.join(cpu, "cpu.cfs_quota_us")) as f:
            assert int(f.read()) == 25000
        usage = os.path.join(DEFAULT_ROOT, "cpuacct", path.lstrip("/"), "cpuacct.usage")
        with open(usage) as f:
            before, start = int(f.read()), time.monotonic()
        time.sleep(3)
        with open(usage) as f:
            used, elapsed = int(f.read()) - before, time.monotonic() - start
        # CFS gives the cgroup 25 ms per 100 ms period; 0.30 allows a period's slack.
        assert 0 < used / 1e9 / elapsed <= 0.30, used / 1e9 / elapsed
        # The shim's statistics (CRI's ContainerStats) come from the same cgroup.
        metrics = json.loads(
            containerd.ctr("task", "metrics", "--format", "json", "quarter1").stdout
        )
        assert metrics["pids"]["current"] == len(os.listdir(f"/proc/{pid}/task"))
        assert metrics["cpu"]["usage"]["total"] >= used
        assert metrics["cpu"]["throttling"]["throttled_periods"] > 0  # the quota at work
        assert metrics["memory"]["usage"]["usage"] > 0
        containerd.ctr("task", "kill", "quarter1")
        assert proc.wait(timeout=CTR_TIMEOUT) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert containerd.containers() == []
    assert _cgroup_dirs("/default/quarter1") == []


def test_process_args_are_the_guest_args_and_its_status_the_exit_status(containerd):
    # The image's cmd is "3 default"; ctr's arguments replace it.
    done = containerd.run(ref("args"), "args7", "7", "foo")
    assert done.returncode == 7, done.stderr
    assert "cmdline: 7 foo" in done.stdout


def test_ctr_task_kill_stops_a_running_unikernel(containerd):
    proc = subprocess.Popen(
        containerd.run_argv(ref("spin"), "spin1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        Lines(proc.stdout).wait_for("spinning")
        tasks = containerd.ctr("task", "ls").stdout
        assert "spin1" in tasks and "RUNNING" in tasks
        # The task's pid is pyvmm, the process pyvmm-oci forked and wrote to the pid file.
        pid = int(tasks.split("spin1", 1)[1].split()[0])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"pyvmm" in f.read()
        containerd.ctr("task", "kill", "spin1")
        assert proc.wait(timeout=CTR_TIMEOUT) == 128 + signal.SIGTERM
        assert "stopped by SIGTERM" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert containerd.containers() == []


def test_an_image_without_a_unikernel_gets_one_line(containerd):
    archive = os.path.join(containerd.dir, "notuk.tar")
    # hello's image, but the annotation names the metadata file: not an ELF.
    oci_image.build(
        str(guest("hello")),
        archive,
        name=ref("notuk"),
        annotations={"org.pyvmm.unikernel.binary": "/pyvmm-oci.json"},
    )
    containerd.ctr("image", "import", archive)
    done = containerd.run(ref("notuk"), "notuk1")
    assert done.returncode != 0
    assert "not a unikernel image: /pyvmm-oci.json" in done.stderr, done.stderr
    assert containerd.containers() == []


def _entry(name: str, kind: bytes, data: bytes = b"", **fields) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = kind, len(data), 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


# An image's block annotation names /disk.img; what the image makes of it.
DISK_IMAGES = {
    "a link to a host file": (
        lambda host: [_entry("disk.img", tarfile.SYMTYPE, linkname=str(host))],
        "org.pyvmm.unikernel.block.storage=/disk.img: /disk.img is not a file in the rootfs",
    ),
    "a link out by ..": (
        lambda host: [_entry("disk.img", tarfile.SYMTYPE, linkname="../" * 20 + str(host)[1:])],
        "org.pyvmm.unikernel.block.storage=/disk.img: /disk.img is not a file in the rootfs",
    ),
    "a host block device node": (
        lambda host: [_entry("disk.img", tarfile.BLKTYPE, devmajor=7, devminor=0)],
        "org.pyvmm.unikernel.block.storage=/disk.img: /disk.img is a device node "
        "(an image may name regular files only)",
    ),
    "a file of its own": (
        lambda host: [_entry("disk.img", tarfile.REGTYPE, bytes(64 << 10))],
        None,
    ),
}


@pytest.mark.parametrize("case", DISK_IMAGES)
def test_an_image_s_disk_is_a_file_of_its_rootfs_or_refused(containerd, tmp_path, case):
    """The image may not reach a host file or device through a link or a
    node of its own: create fails with one line and the host file is as it
    was; a disk the image carries is the guest's to write."""
    host = tmp_path / "secret.img"
    host.write_bytes(b"s" * (64 << 10))
    host.chmod(0o600)
    members, refusal = DISK_IMAGES[case]
    name = "disk" + str(list(DISK_IMAGES).index(case))
    archive = os.path.join(containerd.dir, f"{name}.tar")
    oci_image.build(
        str(guest("blocktest")),
        archive,
        name=ref(name),
        annotations={"org.pyvmm.unikernel.block.storage": "/disk.img"},
        members=members(host),
    )
    containerd.ctr("image", "import", archive)
    done = containerd.run(ref(name), name + "c")
    if refusal is None:
        assert done.returncode == 0, done.stderr
        assert done.stdout.rstrip().endswith("SUCCESS")
    else:
        assert done.returncode != 0
        assert f"OCI runtime create failed: {refusal}" in done.stderr, done.stderr
    assert host.read_bytes() == b"s" * (64 << 10)
    assert containerd.containers() == []


def test_a_bad_net_args_template_in_an_image_gets_one_line(containerd):
    """A str.format template would have run {ip.__class__} (or a width of
    a million) for the image; only plain names are filled in."""
    archive = os.path.join(containerd.dir, "badtemplate.tar")
    oci_image.build(
        str(guest("hello")),
        archive,
        name=ref("badtemplate"),
        annotations={"org.pyvmm.unikernel.net-args": "{ip.__class__}"},
    )
    containerd.ctr("image", "import", archive)
    done = containerd.run(ref("badtemplate"), "badtemplate1")
    assert done.returncode != 0
    assert (
        "OCI runtime create failed: org.pyvmm.unikernel.net-args: bad template: "
        "'{ip.__class__}' is not a name it may use: {ip}, {prefix}, " in done.stderr
    ), done.stderr
    assert "Traceback" not in done.stderr
    assert containerd.containers() == []


@pytest.mark.netns
def test_a_networked_unikernel_answers_ping_through_a_cni_style_veth(containerd):
    """The pod's eth0 holds the guest's address, so the pod namespace's own
    stack would answer ping too, were pyvmm-oci's redirect not there: the
    guest is told to answer 3 requests and exit 0 after the third, so the
    answers are proven the guest's."""
    with NetNamespace() as pod, NetNamespace() as peer:
        # What a CNI plugin leaves: a veth pair, the pod's end eth0 with an
        # address and a default route, the other end (here in a namespace of
        # its own, standing in for the host's bridge) with the gateway.
        with peer.iproute() as ipr:
            ipr.link(
                "add", ifname="veth0", kind="veth", peer={"ifname": "eth0", "net_ns_fd": pod.path}
            )
            index = ipr.link_lookup(ifname="veth0")[0]
            ipr.addr("add", index=index, address="10.88.0.1", prefixlen=24)
            ipr.link("set", index=index, state="up")
        with pod.iproute() as ipr:
            index = ipr.link_lookup(ifname="eth0")[0]
            ipr.addr("add", index=index, address="10.88.0.2", prefixlen=24)
            ipr.link("set", index=index, state="up")
            ipr.route("add", dst="0.0.0.0/0", gateway="10.88.0.1")
            mac = ipr.get_links(index)[0].get_attr("IFLA_ADDRESS")
        proc = subprocess.Popen(
            containerd.run_argv(
                ref("ping"), "ping1", "3", options=("--with-ns", f"network:{pod.path}")
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out = Lines(proc.stdout)
            out.wait_for("ready")
            assert out.wait_for("MAC:") == f"MAC: {mac}"
            assert out.wait_for("IP:") == "IP: 10.88.0.2"
            assert set(pod.links()) >= {"eth0"} and any(n.startswith("pvtap") for n in pod.links())
            done = peer.run(
                ["ping", "-c", "3", "-i", "0.2", "-W", "5", "10.88.0.2"],
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert " 0% packet loss" in done.stdout
            assert out.wait_for("answered") == "answered 3 echo requests"
            assert proc.wait(timeout=CTR_TIMEOUT) == 0
        finally:
            if proc.poll() is None:
                containerd.ctr("task", "kill", "-s", "KILL", "ping1", check=False)
                proc.kill()
                proc.wait()
        # delete took the tap and the veth's redirect away.
        assert sorted(pod.links()) == ["eth0", "lo"]
        with pod.iproute() as ipr:
            index = ipr.link_lookup(ifname="eth0")[0]
            kinds = [q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index)]
        assert "ingress" not in kinds
    assert containerd.containers() == []


# -- pyvmm-oci on its own: the life cycle runc's callers see -----------------

# Runs in a child subreaper (as the shim is), so the container's process,
# orphaned when create exits, is reaped here and its status seen. argv[1]:
# the pyvmm-oci command prefix as JSON; argv[2]: the container id; argv[3]:
# the bundle; argv[4]: seconds to let it run; argv[5]: the signal to kill it
# with; argv[6]: exec or in-process. Prints one JSON line of what it saw.
LIFECYCLE = r"""
import ctypes, json, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
oci, cid, bundle = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
pidfile = os.path.join(bundle, "init.pid")
seen = {}
def run(*args):
    if sys.argv[6] == "in-process":  # no interpreter start-up per command
        import contextlib, io
        from pyvmm.oci.runtime import main
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(oci[1:] + list(args))
        return rc, out.getvalue(), err.getvalue()
    done = subprocess.run(oci + list(args), capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr
def create():
    # Not pipes: the container's process inherits create's stdio and keeps it.
    with open(os.path.join(bundle, "create.err"), "w+") as err:
        rc = subprocess.run(oci + ["create", "--bundle", bundle, "--pid-file", pidfile, cid],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                            timeout=60).returncode
        err.seek(0)
        assert rc == 0, err.read()
    return rc
def status():
    rc, out, err = run("state", cid)
    return json.loads(out)["status"] if rc == 0 else err.strip()
seen["create"] = create()
pid = int(open(pidfile).read())
root = oci[oci.index("--root") + 1]
def mode(path):
    return oct(os.stat(path).st_mode & 0o777) if os.path.exists(path) else None
state_dir = os.path.join(root, cid)
seen["modes"] = [mode(state_dir), mode(os.path.join(state_dir, "state.json")), mode(pidfile)]
seen["created"] = status()
seen["start"] = run("start", cid)[0]
time.sleep(float(sys.argv[4]))
seen["running"] = status()
seen["ps"] = run("ps", "--format", "json", cid)[1].strip() == json.dumps([pid])
seen["kill"] = run("kill", cid, sys.argv[5])[0]
_, st = os.waitpid(pid, 0)
seen["exit"] = os.waitstatus_to_exitcode(st)
seen["stopped"] = status()
seen["kill_again"] = run("kill", cid, "KILL")[2].strip()
seen["delete"] = run("delete", cid)[0]
seen["after"] = run("state", cid)[2].strip()
# A container deleted before it started: its waiting process goes too.
cid += "b"
create()
pid = int(open(pidfile).read())
seen["delete_created"] = (status(), run("delete", cid)[0])
seen["created_exit"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(seen))
"""


def _lifecycle(
    root: str, bundle: str, cid: str, settle: float, sig: str, how: str, runtime=None, env=None
) -> dict:
    """create in a process of its own; the other commands the same (``how``
    = "exec"), or called in the subreaper (``how`` = "in-process")."""
    oci = [runtime or runtime_binary(), "--root", root]
    try:
        done = subprocess.run(
            [sys.executable, "-c", LIFECYCLE, json.dumps(oci), cid, bundle, str(settle), sig, how],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)
    finally:  # on failure: whatever is left of the container, by pid and by runc
        for pid in _pids_mentioning(bundle):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        runc_root = os.path.join(root, ".runc")
        if os.path.isdir(os.path.join(runc_root, cid)):
            subprocess.run(["runc", "--root", runc_root, "delete", "--force", cid], check=False)


def _python_logging_its_calls(tmp_path) -> tuple[dict, Path]:
    """An environment whose PYVMM_PYTHON notes each command it runs: the
    front end's is ``-I -S -c BOOT ROOT --root DIR COMMAND ... ID``."""
    calls = tmp_path / "python-calls"
    wrapper = tmp_path / "python"
    script = 'for last; do :; done; (shift 5; echo "$3 $last") >> CALLS\nexec PYTHON "$@"\n'
    wrapper.write_text(
        "#!/bin/sh\n" + script.replace("CALLS", str(calls)).replace("PYTHON", sys.executable)
    )
    wrapper.chmod(0o755)
    return dict(os.environ, PYVMM_PYTHON=str(wrapper)), calls


@pytest.mark.parametrize("how", ["in-process", "native"])
def test_create_start_state_kill_delete_without_containerd(tmp_path, how):
    """The same answers from the Python runtime and from the native front
    end, which starts no interpreter but for create."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "unikernel").mkdir(parents=True)
    shutil.copy(guest("spin"), bundle / "rootfs" / "unikernel" / "kernel.hvt")
    config = {"ociVersion": "1.0.2", "process": {"args": []}, "root": {"path": "rootfs"}}
    (bundle / "config.json").write_text(json.dumps(config))
    root = tmp_path / "root"
    if how == "native":
        env, calls = _python_logging_its_calls(tmp_path)
        seen = _lifecycle(str(root), str(bundle), "spin2", 2.0, "15", "exec", native_runtime(), env)
        # (pyvmm's own launcher, in the container, runs it too: the guest's lines)
        oci_calls = [x for x in calls.read_text().splitlines() if not x.startswith("/proc/")]
        assert oci_calls == ["create spin2", "create spin2b"]
    else:
        seen = _lifecycle(str(root), str(bundle), "spin2", 2.0, "15", "in-process")
    assert seen == {
        "create": 0,
        "modes": ["0o700", "0o600", "0o600"],  # the state and the pid file: root's only
        "created": "created",
        "start": 0,
        "running": "running",
        "ps": True,
        "kill": 0,
        "exit": 128 + signal.SIGTERM,  # pyvmm's status after SIGTERM
        "stopped": "stopped",
        "kill_again": "pyvmm-oci: container not running",
        "delete": 0,
        "after": "pyvmm-oci: container spin2 does not exist",
        "delete_created": ["created", 0],
        "created_exit": -signal.SIGKILL,
    }
    assert os.listdir(root) == []


def test_a_pod_sandbox_container_goes_to_runc(tmp_path):
    """CRI's pause container is a Linux process: runc runs it, state under ROOT/.runc."""
    need_tool("runc")
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    (rootfs / "usr").mkdir(parents=True)
    for name in ("bin", "lib", "lib64"):
        (rootfs / name).symlink_to(f"usr/{name}")
    subprocess.run([need_tool("runc"), "spec"], cwd=bundle, check=True)
    config = json.loads((bundle / "config.json").read_text())
    config["process"].update(args=["sleep", "60"], terminal=False)
    config["mounts"].append(
        {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]}
    )
    config["annotations"] = {"io.kubernetes.cri.container-type": "sandbox"}
    (bundle / "config.json").write_text(json.dumps(config))
    root = tmp_path / "root"
    seen = _lifecycle(str(root), str(bundle), "pause1", 0.5, "KILL", "exec")
    assert seen["create"] == 0 and seen["created"] == "created"
    assert seen["start"] == 0 and seen["running"] == "running" and seen["ps"]
    assert seen["exit"] == -signal.SIGKILL  # (pid 1 of its pid namespace ignores SIGTERM)
    assert seen["stopped"] == "stopped" and seen["delete"] == 0
    assert "does not exist" in seen["after"]
    assert seen["delete_created"] == ["created", 0]
    assert os.listdir(root / ".runc") == []


def test_a_terminal_goes_through_the_console_socket(containerd):
    """ctr run -t: the shim passes --console-socket; pyvmm's stdio is the pty."""
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            containerd.run_argv(ref("args"), "tty1", "5", "tty", options=("-t",)),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        os.close(slave)
        slave = -1
        output = b""
        deadline = time.monotonic() + CTR_TIMEOUT
        while proc.poll() is None or not output.endswith(b"\n"):
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    output += os.read(master, 4096)
                except OSError:  # EIO: every slave fd closed
                    break
            assert time.monotonic() < deadline, output
        assert proc.wait(timeout=CTR_TIMEOUT) == 5
        assert b"cmdline: 5 tty\r" in output  # through a terminal: CR LF (each pty adds a CR)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    with open(containerd.trace) as f:
        assert any('"--console-socket"' in line and '"tty1"' in line for line in f)


@pytest.mark.netns
def test_a_networked_unikernel_without_a_cni_interface_is_refused(tmp_path):
    """create says why in one line and leaves no state and no tap behind."""
    from pyvmm.oci.runtime import main

    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "unikernel").mkdir(parents=True)
    shutil.copy(guest("ping"), bundle / "rootfs" / "unikernel" / "kernel.hvt")
    root = tmp_path / "root"
    with NetNamespace() as pod:  # lo only: no interface with an address
        config = {
            "ociVersion": "1.0.2",
            "process": {"args": []},
            "root": {"path": "rootfs"},
            "linux": {"namespaces": [{"type": "network", "path": pod.path}]},
        }
        (bundle / "config.json").write_text(json.dumps(config))
        log = tmp_path / "log.json"
        argv = ["--root", str(root), "--log", str(log), "--log-format", "json", "create"]
        status = main([*argv, "--bundle", str(bundle), "--pid-file", str(tmp_path / "pid"), "c1"])
        assert status == 1
        assert json.loads(log.read_text())["msg"] == (
            "container network: the container's network namespace has no interface "
            "with an IPv4 address (CNI sets one up)"
        )
        assert pod.links() == ["lo"]
    assert os.listdir(root) == []


# Runs in a child subreaper (as the shim is): create (the guest's stdio
# to BUNDLE/out), start, wait for "spinning"; prints one JSON line with
# each thread's CPU affinity and cgroups, the cgroup's files, and what is
# left after the guest is killed and the container deleted. argv[1]: the
# pyvmm-oci command prefix as JSON; argv[2]: the id; argv[3]: the bundle;
# argv[4]: the cgroup's directory under each hierarchy, as JSON.
CGROUP_RUN = r"""
import ctypes, json, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
oci, cid, bundle, rel = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
out_path = os.path.join(bundle, "out")
with open(out_path, "w") as out:
    rc = subprocess.run(oci + ["create", "--bundle", bundle, "--pid-file",
                        os.path.join(bundle, "pid"), cid], stdin=subprocess.DEVNULL,
                        stdout=out, stderr=out, timeout=60).returncode
assert rc == 0, open(out_path).read()
pid = int(open(os.path.join(bundle, "pid")).read())
assert subprocess.run(oci + ["start", cid], timeout=60).returncode == 0
deadline = time.monotonic() + 30
while "spinning" not in open(out_path).read():
    assert time.monotonic() < deadline, open(out_path).read()
    time.sleep(0.05)
seen = {"threads": {}}
for tid in os.listdir(f"/proc/{pid}/task"):
    with open(f"/proc/{pid}/task/{tid}/cgroup") as f:
        where = {c: p for _, names, p in (l.rstrip().split(":", 2) for l in f)
                 for c in names.split(",") if c}
    seen["threads"][tid] = [sorted(os.sched_getaffinity(int(tid))), where]
def read(controller, name):
    with open(os.path.join("/sys/fs/cgroup", controller, rel, name)) as f:
        return f.read().strip()
seen["files"] = [read("cpuset", "cpuset.cpus"), read("cpu", "cpu.shares"),
                 read("pids", "pids.max"), read("memory", "memory.limit_in_bytes")]
os.kill(pid, 9)  # the VM dies; delete must still leave nothing
seen["exit"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
seen["delete"] = subprocess.run(oci + ["delete", cid], capture_output=True, text=True).stderr
seen["out"] = open(out_path).read()
print(json.dumps(seen))
"""

CGROUP_PATHS = {  # form: (cgroupsPath, the global option, the directory it names)
    "absolute": ("/pyvmm-test-{n}/c1", [], "pyvmm-test-{n}/c1"),
    "systemd": (
        "pyvmmtest-{n}.slice:pyvmm:c1",
        ["--systemd-cgroup"],
        "pyvmmtest.slice/pyvmmtest-{n}.slice/pyvmm-c1.scope",
    ),
}


@pytest.mark.skipif(is_v2(), reason="the host's cgroups are v2 (the v2 layout: unit tests)")
@pytest.mark.parametrize("form", CGROUP_PATHS)
def test_a_cpuset_pins_every_thread_inside_it_and_delete_removes_the_cgroup(tmp_path, form):
    """A spec's cpuset, shares, pids and memory limit reach the cgroup the
    path names (both of runc's forms); pyvmm's threads are all inside it
    and allowed only the set's CPU; -v (pyvmm-oci --debug) names the
    pinning; after the VM is killed, delete leaves no directory behind."""
    n = f"{os.getpid()}x{len(form)}"
    path, options, rel = (x.format(n=n) if isinstance(x, str) else x for x in CGROUP_PATHS[form])
    cpu = sorted(os.sched_getaffinity(0))[-1]
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "unikernel").mkdir(parents=True)
    shutil.copy(guest("spin"), bundle / "rootfs" / "unikernel" / "kernel.hvt")
    resources = {
        "cpu": {"cpus": str(cpu), "shares": 512},
        "pids": {"limit": 32},
        "memory": {"limit": 64 << 20},
    }
    config = {
        "ociVersion": "1.0.2",
        "process": {"args": []},
        "root": {"path": "rootfs"},
        "linux": {"cgroupsPath": path, "resources": resources},
    }
    (bundle / "config.json").write_text(json.dumps(config))
    root = tmp_path / "root"
    oci = [runtime_binary(), "--root", str(root), "--debug", *options]
    try:
        done = subprocess.run(
            [sys.executable, "-c", CGROUP_RUN, json.dumps(oci), "cs1", str(bundle), rel],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
    finally:  # on failure: the guest by pid, the directories by name
        for pid in _pids_mentioning(str(bundle)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for top in {rel.split("/")[0]}:
            for c in V1_CONTROLLERS:
                for dirpath, _, _ in sorted(
                    os.walk(os.path.join(DEFAULT_ROOT, c, top)), key=lambda w: -len(w[0])
                ):
                    with contextlib.suppress(OSError):
                        os.rmdir(dirpath)
    assert len(seen["threads"]) >= 2
    for tid, (affinity, where) in seen["threads"].items():
        assert affinity == [cpu], tid
        assert {c: where[c] for c in V1_CONTROLLERS} == dict.fromkeys(V1_CONTROLLERS, "/" + rel)
    assert seen["files"] == [str(cpu), "512", "32", str(64 << 20)]
    assert (
        f"pyvmm: pinned (--pin): the vCPU thread to CPU {cpu}, the IO thread to CPU {cpu}"
        in (seen["out"])
    )
    assert f"pyvmm: memory: {64 - PYVMM_OVERHEAD_MIB} MiB mapped" in seen["out"]
    assert seen["exit"] == -signal.SIGKILL and seen["delete"] == ""
    assert _cgroup_dirs(rel) == []
    assert _cgroup_dirs(rel.split("/")[0]) == []  # the parents it made, too
    assert os.listdir(root) == []


@pytest.mark.parametrize(
    "command",
    [
        ["state", "nope"],
        ["start", "nope"],
        ["kill", "nope", "KILL"],
        ["delete", "nope"],
        ["delete", "--force", "nope"],
        ["kill", "nope", "NOSUCHSIGNAL"],  # the native front end hands it to Python
        ["state", ".runc"],
        ["ps", "--format", "json", "nope"],
    ],
)
def test_the_native_front_end_says_what_the_python_runtime_says(tmp_path, command):
    """Status, stderr and the --log line, word for word (the time aside)."""
    seen = []
    for runtime in ([native_runtime()], [sys.executable, "-m", "pyvmm.oci"]):
        log = tmp_path / f"log{len(seen)}"
        done = subprocess.run(
            [*runtime, "--root", str(tmp_path / "root"), "--log", str(log), "--log-format", "json"]
            + command,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        seen.append((done.returncode, done.stdout, done.stderr, [x["msg"] for x in lines]))
        assert all(x["level"] == "error" and x["time"].endswith("+00:00") for x in lines)
    assert seen[0] == seen[1]
    assert seen[0][0] == 1 and seen[0][2].startswith("pyvmm-oci: ")


def test_the_native_front_end_answers_about_a_created_container_as_python_does(tmp_path):
    """state, ps, and kill with signal 0 or one the kernel refuses, on a
    container waiting for start: the same status, output and stderr."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "unikernel").mkdir(parents=True)
    shutil.copy(guest("spin"), bundle / "rootfs" / "unikernel" / "kernel.hvt")
    config = {"ociVersion": "1.0.2", "process": {"args": []}, "root": {"path": "rootfs"}}
    (bundle / "config.json").write_text(json.dumps(config))
    root = str(tmp_path / "root")
    python = [sys.executable, "-m", "pyvmm.oci", "--root", root]
    with open(tmp_path / "create.out", "w") as out:  # not a pipe: the container keeps it
        done = subprocess.run(
            [*python, "create", "--bundle", str(bundle), "--pid-file", str(tmp_path / "pid"), "w1"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            timeout=60,
        )
    try:
        assert done.returncode == 0, (tmp_path / "create.out").read_text()
        for command in (["state", "w1"], ["ps", "w1"], ["ps", "-f", "json", "w1"]):
            answers = [
                subprocess.run([*r, *command], capture_output=True, text=True, timeout=60)
                for r in ([native_runtime(), "--root", root], python)
            ]
            seen = [(a.returncode, a.stdout, a.stderr) for a in answers]
            if command[0] == "state":  # the same object, not the same spacing
                seen = [(rc, json.loads(out), err) for rc, out, err in seen]
            assert seen[0] == seen[1], command
        for signal_ in ("0", "99"):
            answers = [
                subprocess.run([*r, "kill", "w1", signal_], capture_output=True, text=True)
                for r in ([native_runtime(), "--root", root], python)
            ]
            seen = [(a.returncode, a.stderr) for a in answers]
            assert seen[0] == seen[1], signal_
        assert answers[0].stderr == "pyvmm-oci: [Errno 22] Invalid argument\n"
    finally:
        subprocess.run([native_runtime(), "--root", root, "delete", "--force", "w1"], timeout=60)
    assert os.listdir(root) == []
