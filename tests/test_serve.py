"""The warm launcher (pyvmm serve) and its client (pyvmm run --api-sock):
the API's create, list, wait, stats and stop; its errors, each the line the
command prints, with the launcher serving on; the client's exit status,
console and stop signals; and a launcher stopped or killed with running VMs
leaves no VM process and no tap held behind (docs/serve.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, guest, run_pyvmm
from pyvmm.serve.client import call
from testkit.netns import NetNamespace

pytestmark = pytest.mark.kvm


class Launcher:
    """A ``pyvmm serve`` process on a socket in ``tmp``."""

    def __init__(self, tmp: Path, popen=subprocess.Popen, env=None, options=()) -> None:
        self.path = str(tmp / "api.sock")
        self.log = tmp / "launcher.err"
        self.out = tmp / "launcher.out"
        self.proc = popen(
            [sys.executable, "-m", "pyvmm", "serve", "--api-sock", self.path, *options],
            stdout=open(self.out, "w"),
            stderr=open(self.log, "w"),
            cwd=ROOT,
            env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the launcher ended: {self.log.read_text()}")
            try:
                if self.api("GET", "/")[0] == 200:
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def api(self, method: str, target: str, body=None, fds=None):
        return call(self.path, method, target, body, fds)

    def create(self, *argv: str, **extra) -> tuple[int, dict]:
        return self.api("POST", "/vms", {"argv": [str(a) for a in argv], **extra})

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    server = Launcher(tmp_path_factory.mktemp("launcher"))
    yield server
    assert server.stop() == 128 + signal.SIGTERM, server.log.read_text()
    assert not os.path.exists(server.path)  # the socket goes with it
    log = server.log.read_text()
    assert "Traceback" not in log
    assert log.endswith(
        f"pyvmm: launcher {server.proc.pid}: stopped by SIGTERM (Exiting on signal 15)\n"
    )


def cli_line(*args) -> str:
    """The one line the command prints for the same arguments."""
    result = run_pyvmm(*args)
    assert result.returncode == 1, result
    return result.stderr.strip()


def wait_for(path: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"no {text!r} in {path}"
        time.sleep(0.02)


def gone(pid: int, timeout: float = 15) -> bool:
    """Whether ``pid`` ended (a zombie has: whoever reaps it is not ours)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.02)
    return False


# -- create, list, wait, stats, stop ----------------------------------------------


def test_create_runs_the_guest_and_wait_reports_its_exit_status(launcher, tmp_path):
    out = tmp_path / "console"
    status, vm = launcher.create("--mem=64", guest("args"), "7", "x", stdout=str(out))
    assert status == 201, vm
    assert vm["state"] in ("running", "exited") and vm["pid"] > 0
    assert vm["start_latency_us"] > 0
    status, end = launcher.api("GET", f"/vms/{vm['id']}/wait")
    assert status == 200, end
    assert end["state"] == "exited" and end["exit_status"] == 7
    assert "cmdline: 7 x" in out.read_text()
    # Everything the run needs was imported before the fork.
    assert "imported_after_fork" not in end, end
    status, again = launcher.api("GET", f"/vms/{vm['id']}")
    assert status == 200 and again["exit_status"] == 7


def test_list_stats_and_stop(launcher, tmp_path):
    out = tmp_path / "console"
    status, vm = launcher.create("--mem=64", guest("spin"), stdout=str(out))
    assert status == 201, vm
    vm_id = vm["id"]
    wait_for(out, "spinning")
    status, listing = launcher.api("GET", "/vms")
    assert status == 200
    listed = {v["id"]: v for v in listing["vms"]}
    assert listed[vm_id]["state"] == "running" and listed[vm_id]["pid"] == vm["pid"]
    status, stats = launcher.api("GET", f"/vms/{vm_id}/stats")
    assert status == 200, stats
    assert stats["schema"] == "pyvmm-stats/1" and stats["seconds"] > 0
    status, end = launcher.api("POST", f"/vms/{vm_id}/stop")
    assert status == 200, end
    assert end["state"] == "exited" and end["exit_status"] == 128 + signal.SIGTERM
    assert gone(vm["pid"], timeout=1)
    status, final = launcher.api("GET", f"/vms/{vm_id}/stats")  # the counters at the end
    assert status == 200 and final["schema"] == "pyvmm-stats/1"
    status, _ = launcher.api("DELETE", f"/vms/{vm_id}")
    assert status == 200
    assert launcher.api("GET", f"/vms/{vm_id}")[0] == 404


def test_delete_stops_a_running_vm_with_the_signal_asked(launcher, tmp_path):
    out = tmp_path / "console"
    status, vm = launcher.create("--mem=64", guest("spin"), stdout=str(out), id="spinner")
    assert status == 201 and vm["id"] == "spinner", vm
    assert launcher.create(guest("hello"), id="spinner")[0] == 409  # ids are unique
    wait_for(out, "spinning")
    status, end = launcher.api("DELETE", "/vms/spinner", {"signal": "SIGINT"})
    assert status == 200 and end["exit_status"] == 128 + signal.SIGINT, end
    assert launcher.api("GET", "/vms/spinner")[0] == 404


@pytest.mark.parametrize("pooled", [False, True])
def test_the_commands_notes_reach_the_vms_stderr(launcher, tmp_path, pooled):
    """The plan is made in the launcher (and a pooled VM is set up before it
    has a console): its lines still reach the VM's stderr, as the command's."""
    argv = ["-v", "--mem=3", str(guest("hello").relative_to(ROOT))]
    err = tmp_path / "err"
    vm = start(launcher, tmp_path, argv, pooled, stderr=str(err), stdout=os.devnull)
    assert launcher.api("GET", f"/vms/{vm['id']}/wait")[1]["exit_status"] == 0
    command = run_pyvmm(*argv)
    assert command.returncode == 0
    assert err.read_text() == command.stderr
    assert "adjusting memory to 2097152 bytes" in command.stderr
    if pooled:
        launcher.api("DELETE", "/pool")


@pytest.mark.parametrize("pooled", [False, True])
def test_stats_json_to_the_vms_stderr(launcher, tmp_path, pooled):
    """--stats-json=-: the counters on the VM's standard error (its stdout
    is the guest's console), pooled or not."""
    import json

    argv = ["--stats-json=-", "--mem=64", str(guest("hello").relative_to(ROOT))]
    if pooled:
        assert launcher.api("POST", "/pool", {"argv": argv, "cwd": str(ROOT)})[0] == 201
        deadline = time.monotonic() + 30
        while launcher.api("GET", "/pool")[1]["pools"][0]["ready"] != 1:
            assert time.monotonic() < deadline, "the pool never got ready"
            time.sleep(0.05)
    out = tmp_path / "stderr"
    status, end = launcher.create(*argv, cwd=str(ROOT), stderr=str(out), wait=True)
    assert status == 200 and end["exit_status"] == 0 and end.get("pooled", False) == pooled
    last = json.loads(out.read_text().splitlines()[-1])
    assert last["schema"] == "pyvmm-stats/1"
    assert last["record"] == "final" and last["exit_status"] == 0
    if pooled:
        launcher.api("DELETE", "/pool")


# -- errors: one line, the command's, and the launcher serves on -------------------


def test_errors_are_the_commands_lines_and_the_launcher_serves_on(launcher, tmp_path):
    junk = tmp_path / "junk.hvt"
    junk.write_bytes(b"not an ELF file at all" * 10)
    cases = [
        ("--mem=64", tmp_path / "missing.hvt"),  # no such kernel
        ("--mem=64", junk),  # a kernel that fails to load
        ("--bogus", guest("hello")),  # an unknown option
        ("--mem=64", "--net=pyvmmnosuch0", guest("udpsink"), "10.0.0.2", "5000"),  # no tap
        ("--mem=64",),  # no kernel
    ]
    for argv in cases:
        status, body = launcher.create(*argv)
        assert status == 400, (argv, body)
        assert body["error"] == cli_line(*argv), argv
    # A descriptor number in a request would name one of the launcher's own.
    for option in ("--net=@3", "--block:storage=@0"):
        status, body = launcher.create("--mem=64", option, guest("blocktest"))
        assert status == 400, (option, body)
        assert body["error"].startswith(f"pyvmm: {option}: the launcher cannot take a descriptor")
    assert launcher.api("GET", "/vms/nosuchvm")[0] == 404
    assert launcher.api("GET", "/nothing")[0] == 404
    assert launcher.api("PUT", "/vms")[0] == 405
    # Bad JSON, and JSON that is not a request.
    for raw in (b"{not json", b"[1, 2]", b'{"argv": "hello.hvt"}', b'{"argv": [], "x": 1}'):
        status, body = raw_request(launcher.path, b"POST", b"/vms", raw)
        assert status == 400 and body["error"], raw
    # Failed creates leave no VM behind in the list.
    listed = launcher.api("GET", "/vms")[1]["vms"]
    assert all(v.get("error") is None or v["state"] == "exited" for v in listed)
    status, vm = launcher.create("--mem=64", guest("args"), "3")
    assert status == 201, vm
    assert launcher.api("GET", f"/vms/{vm['id']}/wait")[1]["exit_status"] == 3


def test_a_slow_client_blocks_nobody_and_nothing_leaks(launcher, tmp_path):
    """Half a request on one connection while others are served; after a
    batch of VMs (passed fds, failures, pools) the launcher holds the fds
    it held before."""
    import socket

    def fds() -> int:
        return len(os.listdir(f"/proc/{launcher.proc.pid}/fd"))

    # The launcher keeps a kernel it has read mapped (warm.KernelCache):
    # read this one before counting.
    assert launcher.create("--mem=64", guest("args"), stdout=os.devnull, wait=True)[0] == 200
    before = fds()
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.connect(launcher.path)
    slow.sendall(b"POST /vms HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
    with open(os.devnull, "w") as null:
        for n in range(5):
            status, vm = launcher.api(
                "POST",
                "/vms",
                {"argv": ["--mem=64", str(guest("args")), str(n)]},
                fds=[null.fileno()],
            )
            assert status == 201, vm
            assert launcher.api("GET", f"/vms/{vm['id']}/wait")[1]["exit_status"] == n
            assert launcher.api("DELETE", f"/vms/{vm['id']}")[0] == 200
            assert launcher.create("--bogus", guest("hello"))[0] == 400
    slow.close()
    deadline = time.monotonic() + 5
    while fds() != before:
        assert time.monotonic() < deadline, (before, fds())
        time.sleep(0.05)


def raw_request(path: str, method: bytes, target: bytes, body: bytes):
    import socket

    from pyvmm.serve.client import receive

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    with sock:
        sock.sendall(
            method
            + b" "
            + target
            + b" HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        return receive(sock)


def test_a_guest_fault_after_start_is_reported_on_the_vm(launcher, tmp_path):
    err = tmp_path / "err"
    status, vm = launcher.create("--mem=64", guest("fault_badptr"), stderr=str(err))
    assert status == 201, vm
    end = launcher.api("GET", f"/vms/{vm['id']}/wait")[1]
    assert end["exit_status"] == 1
    line = cli_line("--mem=64", guest("fault_badptr"))
    assert end["error"] == line
    assert err.read_text().strip() == line


# -- the client ---------------------------------------------------------------------


def client(launcher: Launcher, *args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pyvmm", "run", "--api-sock", launcher.path, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        **kwargs,
    )


def test_run_client_exits_with_the_guests_status_and_its_console(launcher):
    proc = client(launcher, "--mem=64", guest("args").relative_to(ROOT), "5", "--x")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 5, err
    assert "cmdline: 5 --x" in out and err == ""


def test_create_and_wait_for_guests_that_end_at_once(launcher):
    """ "wait": true: a guest over before the launcher heard of its start
    is still a guest that ran (its status, not a start-up failure)."""
    for n in range(12):
        body = {"argv": ["--mem=64", str(guest("args")), str(n)], "wait": True}
        status, end = launcher.api("POST", "/vms", {**body, "stdout": os.devnull})
        assert status == 200 and end["exit_status"] == n, end
        assert end["start_latency_us"] > 0, end


def test_run_client_errors_are_the_commands(launcher):
    for argv in (["--mem=64", "guests/bin/nosuch.hvt"], ["--what", guest("hello")]):
        proc = client(launcher, *argv)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1
        assert err.strip() == cli_line(*argv)
    proc = client(launcher)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.strip() == cli_line(), err
    result = run_pyvmm("run", "--api-sock", "/nonexistent/api.sock", guest("hello"))
    assert result.returncode == 1
    assert result.stderr == (
        "pyvmm: --api-sock=/nonexistent/api.sock: cannot connect: No such file or directory "
        "(is `pyvmm serve --api-sock=/nonexistent/api.sock` running?)\n"
    )


def test_trace_through_the_launcher_starts_at_the_request(launcher, tmp_path):
    """--trace: the command's timeline (docs/startup.md), from the request's
    first byte: the launcher's part, then the child's phases."""
    import json

    trace = tmp_path / "trace.json"
    proc = client(launcher, f"--trace={trace}", "--mem=64", guest("hello"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    names = [e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert names[0] == "launcher: request read, parsed, planned; fork", names
    # The child's own part from its first line after the fork.
    child = ["child: the launcher's fds closed, signals", "child: console, --stats-json"]
    assert names[1:3] == child, names
    assert "to the first KVM_RUN (first guest instruction)" in names
    assert "pyvmm: trace: launcher: request read" in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_run_client_passes_a_stop_signal_to_the_vm(launcher, sig):
    proc = client(launcher, "--mem=64", guest("spin"))
    assert proc.stdout.readline().strip() == "spinning"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig
    assert err.strip() == f"pyvmm: stopped by {sig.name} (Exiting on signal {sig.value})"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_run_client_when_the_launcher_ends(tmp_path, sig):
    """Stopped, the launcher stops the VM and the client exits as the VM
    did; killed, the VM dies with it and the client says so in one line."""
    server = Launcher(tmp_path)
    proc = client(server, "--mem=64", guest("spin"))
    assert proc.stdout.readline().strip() == "spinning"
    vm = server.api("GET", "/vms")[1]["vms"][0]
    server.stop(sig)
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM
        assert err.strip() == "pyvmm: stopped by SIGTERM (Exiting on signal 15)"
    else:  # the client's line, and the VM's own (it shares the client's stderr)
        assert proc.returncode == 1
        lines = err.strip().splitlines()
        ours = [line for line in lines if line.startswith("pyvmm: the launcher closed")]
        assert len(ours) == 1, err
        rest = [line for line in lines if line not in ours]
        assert rest in ([], ["pyvmm: stopped by SIGTERM (Exiting on signal 15)"]), err
    assert gone(vm["pid"])


# -- a launcher that ends with running VMs ------------------------------------------


def holders(tap: str) -> list[int]:
    """Pids of every process with ``tap`` open (/proc/PID/fdinfo: iff)."""
    found = []
    for pid in filter(str.isdecimal, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fdinfo"):
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    if f"iff:\t{tap}\n" in f.read():
                        found.append(int(pid))
        except OSError:
            continue
    return found


SEND_50 = (
    "import socket\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "for _ in range(50): s.sendto(b'x' * 64, ('10.0.0.2', 5000))\n"
)


@pytest.mark.netns
@pytest.mark.parametrize("shm", ["poll", "off"])
def test_a_networked_vm_through_the_launcher(tmp_path, shm):
    """A tap in the test's namespace: the VM receives, its counters show it,
    its run imports nothing after the fork, and a stop releases the tap."""
    tap = f"pvn{os.getpid() % 100000}"
    with NetNamespace() as ns:
        ns.add_tap(tap, address="10.0.0.1/24")
        server = Launcher(tmp_path, popen=ns.popen)
        try:
            out = tmp_path / "console"
            argv = [f"--shm={shm}", f"--net={tap}", guest("udpsink"), "10.0.0.2", "5000"]
            status, vm = server.create("--mem=64", *argv, stdout=str(out))
            assert status == 201, vm
            wait_for(out, "ready")
            ns.run([sys.executable, "-c", SEND_50], check=True)
            status, stats = server.api("GET", f"/vms/{vm['id']}/stats")
            assert status == 200 and stats["schema"] == "pyvmm-stats/1", stats
            status, end = server.api("POST", f"/vms/{vm['id']}/stop")
            assert end["exit_status"] == 128 + signal.SIGTERM, end
            assert "imported_after_fork" not in end, end
            assert holders(tap) == []
        finally:
            assert server.stop() == 128 + signal.SIGTERM


@pytest.mark.netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_launcher_ended_leaves_no_vm_and_no_tap_behind(tmp_path, sig):
    tap = f"pvs{os.getpid() % 100000}"
    with NetNamespace() as ns:
        ns.add_tap(tap, address="10.0.0.1/24")
        server = Launcher(tmp_path, popen=ns.popen)
        pids = []
        for n in range(2):
            out = tmp_path / f"console{n}"
            if n == 0:  # a guest waiting for frames, its IO thread polling the tap
                argv = ["--mem=64", "--shm=poll", f"--net={tap}", guest("udpsink"), "10.0.0.2"]
                argv.append("5000")
            else:  # a guest that never leaves KVM_RUN by itself
                argv = ["--mem=64", guest("spin")]
            status, vm = server.create(*argv, stdout=str(out))
            assert status == 201, vm
            wait_for(out, "ready" if n == 0 else "spinning")
            pids.append(vm["pid"])
        assert holders(tap) == [pids[0]]
        assert server.stop(sig) == (128 + sig if sig != signal.SIGKILL else -sig)
        for pid in pids:
            assert gone(pid), f"VM process {pid} outlived its launcher"
        assert holders(tap) == []
        assert [p for p in ns.pids() if p != os.getpid()] == []
        if sig == signal.SIGKILL:
            # The socket it left is stale: a new launcher takes its place.
            again = Launcher(tmp_path, popen=ns.popen)
            assert again.stop() == 128 + signal.SIGTERM
        assert not os.path.exists(server.path)


# -- pools --------------------------------------------------------------------------


def test_a_pool_prepares_vms_that_a_matching_create_starts(launcher, tmp_path):
    argv = ["--mem=64", str(guest("args").relative_to(ROOT)), "4"]
    status, pool = launcher.api("POST", "/pool", {"argv": argv, "cwd": str(ROOT), "size": 1})
    assert status == 201 and pool["size"] == 1, pool
    deadline = time.monotonic() + 30
    while launcher.api("GET", "/pool")[1]["pools"][0]["ready"] != 1:
        assert time.monotonic() < deadline, "the pool never got ready"
        time.sleep(0.05)
    out = tmp_path / "console"
    status, vm = launcher.create(*argv, cwd=str(ROOT), stdout=str(out))
    assert status == 201 and vm["pooled"], vm
    assert vm["start_us"]["go"] < vm["start_us"]["running"]
    end = launcher.api("GET", f"/vms/{vm['id']}/wait")[1]
    assert end["exit_status"] == 4 and "cmdline: 4" in out.read_text()
    # The client's command line and directory match the pool: it takes one too.
    proc = client(launcher, *argv)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4 and "cmdline: 4" in out and err == "", err
    # A pool answers bad options as a create does; DELETE ends its VMs.
    status, body = launcher.api("POST", "/pool", {"argv": ["--bogus", str(guest("hello"))]})
    assert status == 400 and body["error"] == cli_line("--bogus", guest("hello"))
    pids = pooled_pids(launcher)
    assert pids
    assert launcher.api("DELETE", "/pool") == (200, {"pools": []})
    for pid in pids:
        assert gone(pid)


def pooled_pids(launcher: Launcher) -> list[int]:
    """The launcher's children that no listed VM accounts for: pooled ones."""
    listed = {v["pid"] for v in launcher.api("GET", "/vms")[1]["vms"]}
    with open(f"/proc/{launcher.proc.pid}/task/{launcher.proc.pid}/children") as f:
        return [int(pid) for pid in f.read().split() if int(pid) not in listed]


# -- the sandbox and the counters in a VM's process ----------------------------------


def start(launcher: Launcher, tmp_path: Path, argv: list[str], pooled: bool, **extra) -> dict:
    """Create a VM (from a pool of one prepared for it, with ``pooled``)."""
    if pooled:
        status, pool = launcher.api("POST", "/pool", {"argv": argv, "cwd": str(ROOT)})
        assert status == 201, pool
        deadline = time.monotonic() + 30
        while launcher.api("GET", "/pool")[1]["pools"][0]["ready"] != 1:
            assert time.monotonic() < deadline, "the pool never got ready"
            time.sleep(0.05)
    status, vm = launcher.create(*argv, cwd=str(ROOT), **extra)
    assert status == 201 and vm.get("pooled", False) == pooled, vm
    if pooled:
        assert launcher.api("DELETE", "/pool")[0] == 200
    return vm


def comm(pid: int, tid: str) -> str:
    with open(f"/proc/{pid}/task/{tid}/comm") as f:
        return f.read().strip()


@pytest.mark.parametrize("pooled", [False, True], ids=["fork", "pooled"])
def test_every_thread_of_a_vm_is_filtered_once_its_guest_runs(launcher, tmp_path, pooled):
    """The child loads the filter the launcher compiled (docs/serve.md): on
    every thread, with no_new_privs, without forcing SSBD, as the command."""
    from test_sandbox import speculation, thread_status

    out = tmp_path / "console"
    argv = ["--stats=1s", "--mem=64", str(guest("spin").relative_to(ROOT))]
    vm = start(launcher, tmp_path, argv, pooled, stdout=str(out), stderr=str(tmp_path / "err"))
    wait_for(out, "spinning")
    threads = thread_status(vm["pid"])
    assert set(threads.values()) == {("2", "1")}, threads
    # The vCPU's, the channel's and the live counters' threads (none waits
    # for SIGUSR1: the channel's thread takes it); KVM's own workers
    # (kvm-nx-lpage-recovery) aside.
    ours = [t for t in threads if not comm(vm["pid"], t).startswith("kvm-")]
    assert len(ours) == 3, threads
    assert set(speculation(vm["pid"]).values()) == set(speculation(os.getpid()).values())
    # The launcher asked KVM its facts through a throw-away VM, and still
    # forks with one thread (docs/serve.md).
    assert os.listdir(f"/proc/{launcher.proc.pid}/task") == [str(launcher.proc.pid)]
    status, end = launcher.api("DELETE", f"/vms/{vm['id']}")
    assert status == 200 and end["exit_status"] == 128 + signal.SIGTERM, end
    assert "imported_after_fork" not in end


def test_the_sandbox_self_test_through_the_launcher(tmp_path):
    """PYVMM_SANDBOX_SELFTEST=1 in the launcher's environment: each VM says
    what its filter refused, as the command does (tests/test_sandbox.py)."""
    server = Launcher(tmp_path, env=dict(os.environ, PYVMM_SANDBOX_SELFTEST="1"))
    try:
        err = tmp_path / "err"
        status, end = server.create(guest("hello"), stdout=os.devnull, stderr=str(err), wait=True)
        assert status == 200 and end["exit_status"] == 0, end
        command = run_pyvmm(guest("hello"), env=dict(os.environ, PYVMM_SANDBOX_SELFTEST="1"))
        assert command.returncode == 0, command
        lines = err.read_text().splitlines()
        assert lines == command.stderr.splitlines()
        for refused in ("socket", "execve", "open for writing", "non-KVM ioctl"):
            line = f"pyvmm: sandbox self-test: {refused}: refused: Operation not permitted"
            assert line in lines, lines
        assert "imported_after_fork" not in end
    finally:
        assert server.stop() == 128 + signal.SIGTERM, server.log.read_text()


@pytest.mark.parametrize("pooled", [False, True], ids=["fork", "pooled"])
def test_sigusr1_prints_a_vms_counters_and_it_runs_on(launcher, tmp_path, pooled):
    """SIGUSR1 to a VM's process: the counters on its stderr, as the
    command prints them (the channel's thread takes the signal)."""
    out, err = tmp_path / "console", tmp_path / "err"
    argv = ["--mem=64", str(guest("spin").relative_to(ROOT))]
    vm = start(launcher, tmp_path, argv, pooled, stdout=str(out), stderr=str(err))
    wait_for(out, "spinning")
    for count in (1, 2):
        os.kill(vm["pid"], signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while err.read_text().count("pyvmm: counters after the guest ran") < count:
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.02)
    assert launcher.api("GET", f"/vms/{vm['id']}")[1]["state"] == "running"
    status, end = launcher.api("DELETE", f"/vms/{vm['id']}")
    assert status == 200 and end["exit_status"] == 128 + signal.SIGTERM, end


def test_the_rehearsal_of_a_create_that_no_longer_plans_changes_nothing(tmp_path):
    """Once a VM runs, the launcher prepares its create again and throws
    it away (its copy-on-write faults off the next request's path:
    docs/serve.md); a kernel or directory gone since is no error."""
    from pyvmm.serve.server import Launcher as Server
    from pyvmm.serve.warm import HostFacts

    server = Server(str(tmp_path / "s.sock"), HostFacts())
    try:
        server._rehearse()  # no create yet
        server._last_create = {"argv": [str(tmp_path / "gone.hvt")], "cwd": None}
        server._rehearse()
        server._last_create = {"argv": [str(guest("hello"))], "cwd": str(tmp_path / "gone")}
        server._rehearse()
        assert not server.vms and not server.live
    finally:
        server._close()


# -- the API's description, its versions, its errors, its log ------------------------


class Described:
    """Requests whose every answer is checked against the launcher's own
    OpenAPI document (GET /openapi.json): the status is one the operation
    lists (an error: any, with the one Error shape) and the body matches
    its schema. Records which operations it saw."""

    def __init__(self, launcher: Launcher) -> None:
        from openapi_spec_validator import validate

        status, self.doc = launcher.api("GET", "/openapi.json")
        assert status == 200
        validate(self.doc)  # an OpenAPI 3.1 document
        assert self.doc["openapi"].startswith("3.")
        self.launcher = launcher
        self.seen: set[tuple[str, str]] = set()

    def template(self, path: str) -> str | None:
        import re

        path = path.split("?")[0].removeprefix("/v1").rstrip("/") or "/"
        for template in self.doc["paths"]:
            if re.fullmatch(re.sub(r"\{[^/]+\}", "[^/]+", template), path):
                return template
        return None

    def check(self, method: str, path: str, status: int, body) -> None:
        from openapi_schema_validator import OAS31Validator, validate

        template = self.template(path)
        operation = self.doc["paths"].get(template, {}).get(method.lower())
        if operation is None:  # not described: a 404 or 405, an error like any
            assert status in (404, 405), (method, path, status, body)
            schema = {"$ref": "#/components/schemas/Error", "components": self.doc["components"]}
            validate(body, schema, cls=OAS31Validator)
            return
        answers = operation["responses"]
        if status < 400:
            assert str(status) in answers, (method, path, status, body)
        answer = answers.get(str(status)) or answers["default"]
        schema = answer["content"]["application/json"]["schema"]
        validate(body, {**schema, "components": self.doc["components"]}, cls=OAS31Validator)
        if status >= 400:
            assert set(body) == {"error", "exit_status"}, body
        self.seen.add((method, template))

    def __call__(self, method: str, path: str, body=None, expect: int | None = None):
        status, answer = self.launcher.api(method, path, body)
        self.check(method, path, status, answer)
        if expect is not None:
            assert status == expect, (method, path, status, answer)
        return status, answer

    def raw(self, method: str, path: str, raw: bytes, expect: int):
        status, answer = raw_request(self.launcher.path, method.encode(), path.encode(), raw)
        self.check(method, path, status, answer)
        assert status == expect, answer
        return answer


def test_the_live_answers_match_the_openapi_document_under_both_prefixes(launcher, tmp_path):
    api = Described(launcher)
    assert launcher.api("GET", "/v1/openapi.json") == (200, api.doc)
    assert api("GET", "/", expect=200)[1]["api"] == "v1"
    assert api("GET", "/v1/", expect=200)[1]["pid"] == launcher.proc.pid
    out = tmp_path / "console"
    spin = ["--mem=64", str(guest("spin"))]
    api("POST", "/v1/vms", {"argv": spin, "id": "doc-spin", "stdout": str(out)}, expect=201)
    wait_for(out, "spinning")
    api("POST", "/v1/vms", {"argv": spin, "id": "doc-spin"}, expect=409)
    listed = api("GET", "/v1/vms", expect=200)[1]["vms"]
    assert "doc-spin" in [vm["id"] for vm in listed]
    api("GET", "/vms/doc-spin", expect=200)
    api("GET", "/v1/vms/doc-spin/stats", expect=200)
    end = api("POST", "/v1/vms/doc-spin/stop", {"signal": "SIGINT"}, expect=200)[1]
    assert end["exit_status"] == 128 + signal.SIGINT
    api("GET", "/v1/vms/doc-spin/wait", expect=200)
    api("GET", "/vms/doc-spin/stats", expect=200)  # the final counters
    api("DELETE", "/v1/vms/doc-spin", expect=200)
    api("GET", "/v1/vms/doc-spin", expect=404)
    args = ["--mem=64", str(guest("args")), "6"]
    assert api("POST", "/vms", {"argv": args, "wait": True}, expect=200)[1]["exit_status"] == 6
    # A pool, and what it lists.
    api("POST", "/v1/pool", {"argv": args, "size": 1}, expect=201)
    assert api("GET", "/v1/pool", expect=200)[1]["pools"][0]["size"] == 1
    api("DELETE", "/pool", expect=200)
    # Errors: one shape, with the exit status where a VM ended.
    assert api("POST", "/v1/vms", {"argv": ["--bogus"]}, expect=400)[1]["exit_status"] is None
    no_tap = ["--mem=64", "--net=pyvmmnosuch0", str(guest("udpsink")), "10.0.0.2", "5000"]
    failed = api("POST", "/v1/vms", {"argv": no_tap}, expect=400)[1]
    assert failed["exit_status"] == 1 and "Could not attach" in failed["error"], failed
    api("PUT", "/v1/vms", expect=405)
    api("GET", "/v1/nothing/here", expect=404)
    api("GET", "/v2/vms", expect=404)
    api("POST", "/v1/vms/nosuch/stop", expect=404)
    api("POST", "/v1/vms/nosuch/start", {"wait": True}, expect=404)
    api("POST", "/v1/containers", {"bundle": "relative"}, expect=400)
    api("POST", "/v1/vms/nosuch/snapshot", {"dir": str(tmp_path / "s")}, expect=404)
    api.raw("POST", "/v1/vms", b"{not json", expect=400)
    api.raw("POST", "/v1/pool", b'{"argv": [], "size": 99}', expect=400)
    # Every operation the document names was asked for, and answered as it says.
    described = {
        (method.upper(), template)
        for template, item in api.doc["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert described == api.seen | {("GET", "/openapi.json")}


def test_the_openapi_document_names_every_route_the_launcher_serves():
    from pyvmm.serve.openapi import document
    from pyvmm.serve.routes import ROUTES

    doc = document()
    served = {(m.lower(), t) for m, t in ROUTES}
    described = {(m, t) for t, item in doc["paths"].items() for m in item if m != "parameters"}
    assert served == described


@pytest.mark.parametrize("pooled", [False, True], ids=["fork", "pooled"])
def test_the_launchers_log_names_the_vm_a_line_is_about(launcher, tmp_path, pooled):
    """A VM with no stderr of its own: its lines (here its stop) reach the
    launcher's log with its id."""
    out = tmp_path / "console"
    argv = ["--mem=64", str(guest("spin").relative_to(ROOT))]
    vm_id = f"named-{'pooled' if pooled else 'fork'}"
    start(launcher, tmp_path, argv, pooled, stdout=str(out), id=vm_id)
    wait_for(out, "spinning")
    status, end = launcher.api("DELETE", f"/v1/vms/{vm_id}")
    assert status == 200 and end["exit_status"] == 128 + signal.SIGTERM, end
    wait_for(launcher.log, f"pyvmm: vm {vm_id}: stopped by SIGTERM (Exiting on signal 15)\n")
    unnamed = [
        line
        for line in launcher.log.read_text().splitlines()
        if line.startswith("pyvmm: stopped by")
    ]
    assert unnamed == [], unnamed
