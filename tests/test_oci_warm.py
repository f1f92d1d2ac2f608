"""pyvmm-oci's warm path under the real containerd (docs/orchestration.md).

A ``pyvmm serve`` runs for this module; ``ctr run --annotation
org.pyvmm.launcher=SOCK`` makes the native front end's create ask it for
the container's VM instead of starting pyvmm cold. Each containerd test
checks that the launcher did run the VM (one new ``oci-`` VM in its list,
with the container's status), so a silent fall-back to the cold path
fails. The create/start split and the fall-back's log line are checked
with the runtime called directly, in a child subreaper as the shim is.
Everything made (containers, cgroups, state, VMs' processes) is checked
gone; the launcher is stopped at the end and must stop cleanly.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_oci import _cgroup_dirs, _cgroups_of, native_runtime, ref
from test_oci import containerd as _containerd  # noqa: F401 (test_oci's fixture)

from conftest import guest
from pyvmm.oci.cgroups import DEFAULT_ROOT, is_v2
from pyvmm.serve.client import call
from pyvmm.serve.server import REFILL_DELAY
from testkit.containerd import CTR_TIMEOUT, pids_mentioning

pytestmark = pytest.mark.kvm

ROOT = Path(__file__).resolve().parent.parent
ANNOTATION = "org.pyvmm.launcher"


@pytest.fixture(scope="module")
def containerd(request):
    """test_oci.py's private containerd, its images imported."""
    return request.getfixturevalue("_containerd")


class Launcher:
    def __init__(self, tmp: Path) -> None:
        self.path = str(tmp / "api.sock")
        self.log = tmp / "launcher.err"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pyvmm", "serve", "--api-sock", self.path],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"),  # noqa: SIM115
            cwd=ROOT,
        )
        deadline = time.monotonic() + 30
        while not os.path.exists(self.path):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def vms(self) -> dict[str, dict]:
        status, answer = call(self.path, "GET", "/v1/vms")
        assert status == 200, answer
        return {vm["id"]: vm for vm in answer["vms"] if vm["id"].startswith("oci-")}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    server = Launcher(tmp_path_factory.mktemp("warm"))
    try:
        yield server
    finally:
        status = server.stop()
    assert status == 128 + signal.SIGTERM, server.log.read_text()
    assert "Traceback" not in server.log.read_text()


def warm(launcher: Launcher) -> tuple[str, ...]:
    return ("--annotation", f"{ANNOTATION}={launcher.path}")


def the_new_vm(launcher: Launcher, before: dict[str, dict]) -> dict:
    """The one VM the launcher ran for the container: the warm path was taken."""
    new = [vm for vm_id, vm in launcher.vms().items() if vm_id not in before]
    assert len(new) == 1, new
    return new[0]


def test_hello_runs_warm_prints_its_output_and_exits_0(containerd, launcher):
    before = launcher.vms()
    done = containerd.run(ref("hello"), "warm1", options=warm(launcher))
    assert done.returncode == 0, done.stderr
    assert "Hello, world" in done.stdout and done.stdout.rstrip().endswith("SUCCESS")
    vm = the_new_vm(launcher, before)
    assert vm["state"] == "exited" and vm["exit_status"] == 0, vm
    assert containerd.containers() == []
    assert _cgroup_dirs("/default/warm1") == []


def test_the_guest_s_exit_status_comes_through_the_relay(containerd, launcher):
    before = launcher.vms()
    done = containerd.run(ref("args"), "warm2", "7", "foo", options=warm(launcher))
    assert done.returncode == 7, done.stderr
    assert "cmdline: 7 foo" in done.stdout
    assert the_new_vm(launcher, before)["exit_status"] == 7
    assert containerd.containers() == []


def test_a_terminal_goes_through_the_console_socket_on_the_warm_path(containerd, launcher):
    """ctr run -t: the relay makes the pty, sends its master to the
    console socket and hands the VM the slave as its stdio."""
    before = launcher.vms()
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            containerd.run_argv(ref("args"), "warm6", "5", "tty", options=("-t", *warm(launcher))),
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
        assert proc.wait(timeout=CTR_TIMEOUT) == 5, output
        assert b"cmdline: 5 tty\r" in output  # through a terminal: CR LF
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert the_new_vm(launcher, before)["exit_status"] == 5
    assert containerd.containers() == []


def test_the_next_container_of_an_image_takes_a_vm_prepared_ahead(containerd, launcher):
    """Once a container's VM runs, the launcher prepares the next one for
    the same image and command line (a child of the launcher's, waiting);
    the next create takes that process, and it runs as the first did."""
    children = Path(f"/proc/{launcher.proc.pid}/task/{launcher.proc.pid}/children")

    def launcher_children() -> set[int]:
        return {int(pid) for pid in children.read_text().split()}

    # Earlier tests' pools (other images, other command lines) wait too, and
    # the last of them may still be refilled (REFILL_DELAY after its VM
    # started): their children are known once none has come for a while.
    earlier, quiet_since = launcher_children(), time.monotonic()
    deadline = quiet_since + 10
    while time.monotonic() - quiet_since < 20 * REFILL_DELAY:
        assert time.monotonic() < deadline, "the launcher kept forking"
        time.sleep(REFILL_DELAY)
        now = launcher_children()
        if now - earlier:
            quiet_since = time.monotonic()
        earlier = now
    waiting: set[int] = set()
    for cid in ("warm5a", "warm5b"):
        before = launcher.vms()
        done = containerd.run(ref("hello"), cid, options=warm(launcher))
        assert done.returncode == 0 and "Hello, world" in done.stdout, done.stderr
        vm = the_new_vm(launcher, before)
        assert vm["exit_status"] == 0, vm
        deadline = time.monotonic() + 10
        while not waiting and cid == "warm5a":  # the one prepared ahead
            waiting = launcher_children() - earlier
            assert time.monotonic() < deadline, "no VM was prepared ahead"
            time.sleep(0.05)
    # warm5b's VM is the one prepared ahead (taken ready, or still setting up).
    assert vm["pid"] in waiting, (vm, waiting, earlier)
    assert containerd.containers() == []
    assert _cgroup_dirs("/default/warm5b") == []


def _cpu_ns(path: str) -> int:
    with open(os.path.join(DEFAULT_ROOT, "cpuacct", path.lstrip("/"), "cpuacct.usage")) as f:
        return int(f.read())


@pytest.mark.skipif(is_v2(), reason="the host's cgroups are v2 (the v2 layout: unit tests)")
def test_a_spinning_guest_sits_in_the_container_s_cgroup_under_its_limit_and_ctr_kill_ends_it(
    containerd, launcher
):
    """The VM's process (the launcher's child) and every thread of it, and
    the relay the shim reaps, are in the container's cgroup in every
    controller; --cpus 0.25 holds; ctr task kill reaches the guest
    through the relay (143); nothing stays."""
    before = launcher.vms()
    proc = subprocess.Popen(
        containerd.run_argv(ref("spin"), "warm3", options=(*warm(launcher), "--cpus", "0.25")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline()  # the guest's first line: it runs
        vm = the_new_vm(launcher, before)
        deadline = time.monotonic() + 10  # (its "running" is told a moment after its start)
        while launcher.vms()[vm["id"]]["state"] != "running":
            assert time.monotonic() < deadline, launcher.vms()[vm["id"]]
            time.sleep(0.05)
        tasks = containerd.ctr("task", "ls").stdout
        relay = int(tasks.split("warm3", 1)[1].split()[0])
        assert relay != vm["pid"]
        for pid in (vm["pid"], relay):
            threads = _cgroups_of(pid)
            assert len(threads) >= (2 if pid == vm["pid"] else 1)
            for tid, groups in threads.items():
                for controller in ("cpu", "cpuacct", "cpuset", "memory", "pids"):
                    assert groups[controller] == "/default/warm3", (pid, tid, groups)
        used0, t0 = _cpu_ns("/default/warm3"), time.monotonic()
        time.sleep(2.0)
        used = (_cpu_ns("/default/warm3") - used0) / ((time.monotonic() - t0) * 1e9)
        assert used <= 0.30, f"{used:.3f} of a core under --cpus 0.25"
        containerd.ctr("task", "kill", "warm3")
        _, err = proc.communicate(timeout=CTR_TIMEOUT)
        assert proc.returncode == 128 + signal.SIGTERM, err
    finally:
        if proc.poll() is None:
            containerd.ctr("task", "kill", "-s", "SIGKILL", "warm3", check=False)
            proc.communicate(timeout=CTR_TIMEOUT)
    ended = launcher.vms()[vm["id"]]
    assert ended["exit_status"] == 128 + signal.SIGTERM and "signal" not in ended, ended
    assert containerd.containers() == []
    assert _cgroup_dirs("/default/warm3") == []


def test_a_launcher_that_is_not_running_falls_back_to_the_cold_path(containerd, launcher, tmp_path):
    before = launcher.vms()
    gone = ("--annotation", f"{ANNOTATION}={tmp_path / 'no-launcher.sock'}")
    done = containerd.run(ref("hello"), "warm4", options=gone)
    assert done.returncode == 0, done.stderr
    assert "Hello, world" in done.stdout
    assert launcher.vms() == before  # the cold path's pyvmm ran it
    assert containerd.containers() == []


# -- the runtime on its own, in a child subreaper as the shim is ----------------

# argv[1]: the pyvmm-oci command prefix (JSON), argv[2]: the id, argv[3]: the
# bundle, argv[4]: the socket, argv[5]: "start" or "delete" (before any
# start). Prints one JSON line of what it saw.
SPLIT = r"""
import ctypes, json, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
from pyvmm.serve.client import call
from pyvmm.serve.server import REFILL_DELAY
oci, cid, bundle, sock = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
root = oci[oci.index("--root") + 1]
pidfile, console = os.path.join(bundle, "init.pid"), os.path.join(bundle, "console")
seen = {}
def run(*args):
    done = subprocess.run(oci + list(args), capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr
def cgroups(pid):
    paths = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/cgroup") as f:
            for _, names, path in (line.rstrip().split(":", 2) for line in f):
                if set(names.split(",")) & {"cpu", "cpuacct", "cpuset", "memory", "pids"}:
                    paths.add(path)
    return sorted(paths)
with open(console, "w+") as out, open(os.path.join(bundle, "create.err"), "w+") as err:
    seen["create"] = subprocess.run(
        oci + ["create", "--bundle", bundle, "--pid-file", pidfile, cid],
        stdin=subprocess.DEVNULL, stdout=out, stderr=err, timeout=60).returncode
    err.seek(0)
    seen["create_err"] = err.read()
relay = int(open(pidfile).read())
with open(os.path.join(root, cid, "state.json")) as f:
    vm = json.load(f).get("warm")
seen["warm"] = vm is not None
if vm is not None:
    time.sleep(1.0)  # time enough for a guest that was let go too early to print
    seen["vm_before_start"] = call(sock, "GET", f"/v1/vms/{vm['vm']}")[1]["state"]
    seen["output_before_start"] = open(console).read()
    seen["cgroups"] = {"vm": cgroups(vm["pid"]), "relay": cgroups(relay)}
seen["state_before_start"] = json.loads(run("state", cid)[1])["status"]
if sys.argv[5] == "delete":  # deleted before its start: the relay and the VM go
    seen["delete"] = run("delete", cid)[0]
    seen["exit"] = os.waitstatus_to_exitcode(os.waitpid(relay, 0)[1])
    for _ in range(100):  # (the launcher reaps it as it sees it end)
        seen["vm_after"] = call(sock, "GET", f"/v1/vms/{vm['vm']}")[1]["state"]
        if seen["vm_after"] == "exited":
            break
        time.sleep(0.05)
    seen["output"] = open(console).read()
    print(json.dumps(seen))
    sys.exit(0)
seen["start"] = run("start", cid)[0]
seen["exit"] = os.waitstatus_to_exitcode(os.waitpid(relay, 0)[1])
seen["output"] = open(console).read()
if vm is not None:
    seen["vm_after"] = call(sock, "GET", f"/v1/vms/{vm['vm']}")[1]["exit_status"]
seen["delete"] = run("delete", cid)[0]
print(json.dumps(seen))
"""


def _split(
    tmp_path: Path, cid: str, sock: str, log: Path, then: str = "start", conf: str | None = None
) -> dict:
    """The split script on a hello bundle whose annotation names ``sock``
    (with ``conf``: no annotation, the configuration file ``conf`` says)."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "unikernel").mkdir(parents=True)
    shutil.copy(guest("hello"), bundle / "rootfs" / "unikernel" / "hello.hvt")
    config = {
        "ociVersion": "1.0.2",
        "process": {"args": ["/unikernel/hello.hvt"]},
        "root": {"path": "rootfs"},
        "annotations": {ANNOTATION: sock} if conf is None else {},
        "linux": {"cgroupsPath": f"/pyvmm-warm-test/{cid}"},
    }
    (bundle / "config.json").write_text(json.dumps(config))
    root = tmp_path / "root"
    oci = [native_runtime(), "--root", str(root), "--log", str(log), "--log-format", "json"]
    try:
        done = subprocess.run(
            [sys.executable, "-c", SPLIT, json.dumps(oci), cid, str(bundle), sock, then],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env=dict(os.environ, PYVMM_OCI_CONFIG=conf or "/nonexistent"),
        )
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
    finally:
        for pid in pids_mentioning(str(bundle)):
            os.kill(pid, signal.SIGKILL)
    assert os.listdir(root) == []  # delete left no state
    assert _cgroup_dirs(f"/pyvmm-warm-test/{cid}") == _cgroup_dirs("/pyvmm-warm-test") == []
    return seen


@pytest.mark.skipif(is_v2(), reason="the host's cgroups are v2 (the v2 layout: unit tests)")
def test_the_guest_does_not_start_before_start(launcher, tmp_path):
    """create returns with the VM prepared and held: a second later the
    launcher still says "ready" and the console is empty, while the VM's
    threads and the relay sit in the container's cgroup; start lets it
    run, and the relay exits with its status."""
    log = tmp_path / "log.json"
    seen = _split(tmp_path, "split1", launcher.path, log)
    cgroup = "/pyvmm-warm-test/split1"
    assert seen.pop("output").endswith("SUCCESS\n")
    assert seen == {
        "create": 0,
        "create_err": "",
        "warm": True,
        "vm_before_start": "ready",
        "output_before_start": "",
        "cgroups": {"vm": [cgroup], "relay": [cgroup]},
        "state_before_start": "created",
        "start": 0,
        "exit": 0,
        "vm_after": 0,
        "delete": 0,
    }
    assert not log.exists() or log.read_text() == ""  # nothing to say


def test_the_launcher_can_be_named_for_every_container_in_the_configuration_file(
    launcher, tmp_path
):
    """No annotation: `launcher = PATH` in the file PYVMM_OCI_CONFIG names
    (/etc/pyvmm/oci.conf by default) asks for the warm path."""
    conf = tmp_path / "oci.conf"
    conf.write_text(f"# the node's launcher\nlauncher = {launcher.path}\n")
    seen = _split(tmp_path, "split4", launcher.path, tmp_path / "log.json", conf=str(conf))
    assert seen["warm"] and seen["exit"] == 0 and seen["vm_after"] == 0, seen


@pytest.mark.skipif(is_v2(), reason="the host's cgroups are v2 (the v2 layout: unit tests)")
def test_a_container_deleted_before_its_start_leaves_nothing(launcher, tmp_path):
    """delete of a created container: the relay is killed, the held VM
    with it (it is in the cgroup), its guest never ran; state and cgroup
    go (checked in _split)."""
    seen = _split(tmp_path, "split3", launcher.path, tmp_path / "log.json", then="delete")
    assert seen["warm"] and seen["state_before_start"] == "created", seen
    assert seen["delete"] == 0 and seen["exit"] == -signal.SIGKILL, seen
    assert seen["vm_after"] == "exited" and seen["output"] == "", seen


def test_a_killed_launcher_s_socket_gets_the_cold_path_and_a_line_in_the_log(tmp_path):
    """A launcher killed with SIGKILL leaves its socket, where nobody
    listens now: create says so in the shim's log, in one line, and the
    container runs cold, the same as ever."""
    stale = Launcher(tmp_path)
    stale.proc.kill()
    stale.proc.wait()
    assert os.path.exists(stale.path)
    log = tmp_path / "log.json"
    seen = _split(tmp_path, "split2", stale.path, log)
    assert seen.pop("output").endswith("SUCCESS\n")
    assert seen == {
        "create": 0,
        "create_err": "",
        "warm": False,
        "state_before_start": "created",
        "start": 0,
        "exit": 0,
        "delete": 0,
    }
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["level"], line["msg"]) for line in lines] == [
        (
            "warning",
            f"the warm launcher {stale.path}: cannot connect: Connection refused: a cold start",
        )
    ]
