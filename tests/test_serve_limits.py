"""The launcher (pyvmm serve) against hostile clients and VM processes:
who may talk to whom on the API socket, the limits on what a client can
make it hold (fds, connections, time, VMs, pools, paths, nesting, the
head), a launcher out of file descriptors, and messages a VM's process
should never send. Each ends in one line or a refusal, nothing but the
offending VM ends, and the launcher serves on (docs/serve.md)."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_serve import Launcher, raw_request, wait_for

from conftest import ROOT, guest
from pyvmm.serve import http
from pyvmm.serve.client import call, receive

pytestmark = pytest.mark.kvm
NOBODY = 65534


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    server = Launcher(tmp_path_factory.mktemp("limits"))
    yield server
    assert server.stop() == 128 + signal.SIGTERM, server.log.read_text()
    assert "Traceback" not in server.log.read_text()


@pytest.fixture
def shared_dir():
    """A directory other users can reach (not list, not write), outside
    pytest's own 0700 one."""
    path = Path(tempfile.mkdtemp(prefix="pyvmm-serve-"))
    path.chmod(0o711)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle(pid: int, count: int) -> None:
    """Wait until ``pid`` holds ``count`` fds (what it closes, it closes
    as it gets to it)."""
    deadline = time.monotonic() + 10
    while fds_of(pid) != count:
        assert time.monotonic() < deadline, (count, fds_of(pid))
        time.sleep(0.02)


def as_nobody(script: str, *args: str) -> subprocess.Popen:
    """``script`` in a Python started as root that becomes nobody at
    ``drop()`` (after its imports: nobody may not read the interpreter)."""
    prelude = (
        f"import os\ndef drop():\n    os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", prelude + script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


# -- who may talk to whom -----------------------------------------------------------

FAKE_LISTENER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
drop()  # the kernel records the listener's user at listen()
s.listen(1)
print("listening", flush=True)
s.settimeout(60)
conn, _ = s.accept()
got, fds = b"", 0
while b"\\r\\n\\r\\n" not in got:
    data, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(16 * 4))
    fds += sum(len(payload) // 4 for _, _, payload in ancillary)
    if not data:
        break
    got += data
print(len(got), fds, flush=True)
"""


def test_run_sends_nothing_to_a_socket_another_user_listens_on(tmp_path):
    """A user who binds the path (a world-writable directory, a launcher
    that is not running) gets neither the request nor the terminal's fds:
    the client says who listens there and exits 1."""
    path = str(tmp_path / "api.sock")
    fake = as_nobody(FAKE_LISTENER, path)
    try:
        assert fake.stdout.readline() == "listening\n", fake.stderr.read()
        proc = subprocess.run(
            [sys.executable, "-m", "pyvmm", "run", "--api-sock", path, guest("hello")],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert proc.returncode == 1, proc
        assert proc.stderr == (
            f"pyvmm: --api-sock={path}: the process listening there is uid {NOBODY}, "
            "neither root nor this user (uid 0): nothing sent to it\n"
        )
        out, err = fake.communicate(timeout=30)
        assert out == "0 0\n", (out, err)  # no byte, no fd
    finally:
        fake.kill()
        fake.wait()


NOBODY_CLIENT = """
import json, sys
from pyvmm.serve.client import ClientError, call
drop()
try:
    print(json.dumps(call(sys.argv[1], "GET", "/v1/")))
except ClientError as err:
    print(json.dumps(str(err)))
"""


def nobody_asks(path: str):
    proc = as_nobody(NOBODY_CLIENT, path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out)


@pytest.mark.parametrize("allowed", [False, True])
def test_the_launcher_serves_root_its_own_user_and_those_allowed(shared_dir, allowed):
    """Even with its socket opened to everyone (chmod 0666), a launcher
    answers another user 403 with one line, unless --allow-uid names it."""
    options = [f"--allow-uid={NOBODY}"] if allowed else []
    server = Launcher(shared_dir, options=options)
    try:
        os.chmod(server.path, 0o666)
        status, body = nobody_asks(server.path)
        if allowed:
            assert status == 200 and body["limits"]["allow_uids"] == [NOBODY], body
        else:
            assert (status, body) == (
                403,
                {
                    "error": f"pyvmm: uid {NOBODY} may not use this launcher (it serves root, "
                    "uid 0 and those of pyvmm serve --allow-uid)",
                    "exit_status": None,
                },
            )
        assert server.api("GET", "/")[0] == 200  # root is served, and it serves on
    finally:
        assert server.stop() == 128 + signal.SIGTERM, server.log.read_text()


def test_the_api_socket_is_connectable_by_its_user_only(shared_dir):
    """Mode 0600, the launcher's user's: another user cannot connect
    (though it can reach the directory)."""
    server = Launcher(shared_dir)
    try:
        info = os.stat(server.path)
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
        answer = nobody_asks(server.path)
        assert answer.startswith(f"--api-sock={server.path}: cannot connect: Permission denied")
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["writable by others", "another user's"])
def test_the_launcher_refuses_a_directory_where_its_socket_could_be_replaced(tmp_path, how):
    directory = tmp_path / "run"
    directory.mkdir()
    if how == "writable by others":
        directory.chmod(0o777)
        expected = f"{directory} is writable by others (mode 0777): another user could replace"
    else:
        os.chown(directory, NOBODY, NOBODY)
        expected = f"{directory} belongs to uid {NOBODY}: put the socket in a directory"
    path = directory / "api.sock"
    proc = subprocess.run(
        [sys.executable, "-m", "pyvmm", "serve", "--api-sock", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"pyvmm: --api-sock={path}: {expected}"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and not path.exists()


# -- passed fds, connections, time ----------------------------------------------------


def head_with_fds(sock: socket.socket, pieces: int) -> None:
    """A request head sent in ``pieces`` messages, each with one fd, never
    finished."""
    with open(os.devnull) as null:
        for n in range(pieces):
            try:
                socket.send_fds(sock, [b"POST /vms HTTP/1.1\r\nX-%d: y\r\n" % n], [null.fileno()])
            except BrokenPipeError:
                return  # refused already


def test_fds_past_the_limit_refuse_the_request_and_are_closed(launcher):
    before = fds_of(launcher.proc.pid)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(launcher.path)
    sock.settimeout(30)
    with sock:
        head_with_fds(sock, 200)
        status, body = receive(sock)
    assert (status, body) == (
        400,
        {"error": "at most 2 file descriptors (stdout, stderr)", "exit_status": None},
    )
    settle(launcher.proc.pid, before)


def test_fds_sent_while_a_request_waits_are_closed_at_once(launcher, tmp_path):
    """A waiting connection ("wait": true) cannot be used to pile up fds."""
    out = tmp_path / "console"
    argv = ["--mem=64", str(guest("spin"))]
    body = {"argv": argv, "id": "waiter", "stdout": str(out), "wait": True}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(launcher.path)
    with sock:
        sock.sendall(http.request_bytes("POST", "/v1/vms", body))
        wait_for(out, "spinning")
        before = fds_of(launcher.proc.pid)
        with open(os.devnull) as null:
            for _ in range(100):
                socket.send_fds(sock, [b"x"], [null.fileno(), null.fileno()])
        settle(launcher.proc.pid, before)
        assert launcher.api("DELETE", "/vms/waiter")[0] == 200
        status, end = receive(sock)
    assert status == 200 and end["exit_status"] == 128 + signal.SIGTERM, end


def test_connections_past_the_limit_are_refused_with_one_line(tmp_path):
    server = Launcher(tmp_path, options=["--max-connections=2"])
    try:
        idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        for sock in idle:
            sock.connect(server.path)
        assert server.api("GET", "/") == (
            503,
            {
                "error": "pyvmm: the launcher has 2 connections open (pyvmm serve "
                "--max-connections): try again later",
                "exit_status": None,
            },
        )
        for sock in idle:
            sock.close()
        deadline = time.monotonic() + 10
        while server.api("GET", "/")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        assert server.stop() == 128 + signal.SIGTERM


def test_a_request_that_does_not_arrive_in_time_gets_408(tmp_path):
    server = Launcher(tmp_path, options=["--request-timeout=0.2"])
    try:
        before = fds_of(server.proc.pid)
        for sent in (
            b"",
            b"GET /vms HTTP/1.1\r\n",
            b"POST /vms HTTP/1.1\r\nContent-Length: 9\r\n\r\n{",
        ):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(server.path)
            sock.settimeout(30)
            with sock:
                sock.sendall(sent)
                assert receive(sock) == (
                    408,
                    {"error": "the request did not arrive in 0.2 s", "exit_status": None},
                ), sent
        settle(server.proc.pid, before)
        assert server.api("GET", "/")[0] == 200
    finally:
        assert server.stop() == 128 + signal.SIGTERM


def test_out_of_fds_the_launcher_answers_then_stops_polling_its_listener(tmp_path):
    """accept(2) fails with EMFILE while the listener stays readable: the
    waiting client is told why (the fd kept in reserve for this), the
    listener is left out of the loop's poll for a while (no spin), and
    once it is back a waiting client is served."""
    from pyvmm.serve.server import Launcher as Server
    from pyvmm.serve.warm import HostFacts

    server = Server(str(tmp_path / "s.sock"), HostFacts())
    clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        for sock in clients:
            sock.connect(server.path)
            sock.settimeout(10)
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
        try:
            while True:  # every fd number under the limit taken
                fillers.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            pass
        server._accept(1)
        for fd in fillers:
            os.close(fd)
        fillers.clear()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert receive(clients[0]) == (
            503,
            {
                "error": "pyvmm: the launcher is out of file descriptors (Too many open files)",
                "exit_status": None,
            },
        )
        polled = [key.fileobj for key in server.selector.get_map().values()]
        assert server.listener not in polled  # readable (a client waits), and not polled
        assert [key for key, _ in server.selector.select(0)] == []
        server._run_timers()  # not yet: the pause is still on
        assert server.listener not in [k.fileobj for k in server.selector.get_map().values()]
        server.timers = [(0.0, *rest) for _, *rest in server.timers]  # the pause is over
        server._run_timers()
        clients[1].sendall(http.request_bytes("GET", "/v1/"))
        deadline = time.monotonic() + 10
        while not select.select([clients[1]], [], [], 0)[0]:  # the launcher's loop, by hand
            for key, mask in server.selector.select(0.05):
                key.data(mask)
            assert time.monotonic() < deadline
        status, info = receive(clients[1])
        assert status == 200 and info["api"] == "v1", info
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for sock in clients:
            sock.close()
        server._close()


# -- a VM's process that says what none says ---------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
SYS_PIDFD_GETFD = 438


def channel_of(pid: int) -> int:
    """A copy of the VM process's end of its channel to the launcher
    (pidfd_getfd): what it writes there, the launcher reads as the VM's."""
    sockets = [
        int(fd)
        for fd in os.listdir(f"/proc/{pid}/fd")
        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    ]
    assert len(sockets) == 1, sockets
    pidfd = os.pidfd_open(pid)
    try:
        fd = _libc.syscall(SYS_PIDFD_GETFD, pidfd, sockets[0], 0)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "pidfd_getfd")
        return fd
    finally:
        os.close(pidfd)


MESSAGES = {
    "a time that is a string": b'{"event": "running", "times": {"running": "x"}, "cpu_ns": 1}',
    "a CPU time of 1e400": b'{"event": "running", "times": {}, "cpu_ns": 1e400}',
    "times without end": json.dumps(
        {"event": "prepared", "times": {f"t{n}": n for n in range(5000)}}
    ).encode(),
    "nested 30000 deep": b"[" * 30000 + b"]" * 30000,
    "longer than the channel's limit": b'{"event": "final", "report": "' + b"x" * 70000 + b'"}',
    "not JSON": b"\xff\xfe{",
    "an unknown event": b'{"event": "nosuch"}',
    "an error of the wrong types": b'{"event": "error", "message": 1, "status": "x"}',
    "counters that are not": b'{"event": "stats", "report": [1, 2]}',
}


@pytest.mark.parametrize("message", MESSAGES.values(), ids=MESSAGES.keys())
def test_a_malformed_message_ends_only_its_vm(launcher, tmp_path, message):
    vms = []
    for name in ("bystander", "victim"):
        out = tmp_path / name
        status, vm = launcher.create("--mem=64", guest("spin"), stdout=str(out), stderr=os.devnull)
        assert status == 201, vm
        wait_for(out, "spinning")
        vms.append(vm)
    bystander, victim = vms
    fd = channel_of(victim["pid"])
    try:
        os.write(fd, message)
    finally:
        os.close(fd)
    deadline = time.monotonic() + 30
    while True:
        status, listing = launcher.api("GET", "/vms")
        assert status == 200, listing
        listed = {vm["id"]: vm for vm in listing["vms"]}
        if listed[victim["id"]]["state"] == "exited":
            break
        assert time.monotonic() < deadline, listed[victim["id"]]
        time.sleep(0.02)
    end = listed[victim["id"]]
    assert end["exit_status"] == 128 + signal.SIGKILL and end["signal"] == "SIGKILL", end
    assert end["error"].startswith("pyvmm: the VM's process sent a malformed message ("), end
    assert end["error"].endswith("): ended") and len(end["error"]) < 300, end
    assert listed[bystander["id"]]["state"] == "running"
    assert f"pyvmm: vm {victim['id']} (pid {victim['pid']}): a malformed message" in (
        launcher.log.read_text()
    )
    status, end = launcher.api("DELETE", f"/vms/{bystander['id']}")
    assert status == 200 and end["exit_status"] == 128 + signal.SIGTERM, end
    assert launcher.api("GET", "/")[0] == 200


# -- sizes: paths, nesting, the head, VMs and pools ------------------------------------


def ready(server: Launcher, count: int = 1) -> None:
    deadline = time.monotonic() + 30
    while server.api("GET", "/pool")[1]["pools"][0]["ready"] != count:
        assert time.monotonic() < deadline, server.api("GET", "/pool")
        time.sleep(0.05)


def test_a_console_path_longer_than_path_max_is_refused_pooled_or_not(launcher, tmp_path):
    argv = ["--mem=64", str(guest("args")), "3"]
    long = "/tmp/" + "d/" * 35000 + "out"  # over 64 KiB: the pooled VM's start message
    refusal = (400, {"error": '"stdout" is longer than 4095 bytes (PATH_MAX)', "exit_status": None})
    assert launcher.create(*argv, stdout=long) == refusal
    assert launcher.api("POST", "/pool", {"argv": argv})[0] == 201
    try:
        ready(launcher)
        assert launcher.create(*argv, stdout=long) == refusal
        assert launcher.api("GET", "/pool")[1]["pools"][0]["ready"] == 1  # still there
        out = tmp_path / "console"
        status, end = launcher.create(*argv, stdout=str(out), wait=True)
        assert status == 200 and end["pooled"] and end["exit_status"] == 3, end
    finally:
        assert launcher.api("DELETE", "/pool")[0] == 200


def test_json_nested_deep_is_a_400_with_one_line(launcher):
    body = b'{"argv": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert raw_request(launcher.path, b"POST", b"/v1/vms", body) == (
        400,
        {"error": "the request body nests deeper than 32 levels", "exit_status": None},
    )


def test_a_head_over_16_kib_is_refused_even_when_it_arrives_whole(launcher):
    head = b"GET /v1/ HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 17000 + b"\r\n\r\n"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(launcher.path)
    with sock:
        sock.sendall(head)
        assert receive(sock) == (
            413,
            {"error": "request head longer than 16384 bytes", "exit_status": None},
        )


def test_vms_and_pools_past_the_limits_are_refused(tmp_path):
    server = Launcher(tmp_path, options=["--max-vms=2", "--max-pools=1"])
    try:
        spin = ["--mem=64", str(guest("spin"))]
        ids = []
        for _ in range(2):
            status, vm = server.create(*spin, stdout=os.devnull)
            assert status == 201, vm
            ids.append(vm["id"])
        assert server.create(*spin, stdout=os.devnull) == (
            503,
            {
                "error": "pyvmm: the launcher runs 2 VM processes already, pooled ones "
                "included (pyvmm serve --max-vms)",
                "exit_status": None,
            },
        )
        # A pool gets what room there is, and says why it has no more.
        status, pool = server.api("POST", "/pool", {"argv": [str(guest("hello"))], "size": 2})
        assert status == 201 and pool["ready"] + pool["preparing"] == 0, pool
        assert "--max-vms" in pool["error"]
        assert server.api("DELETE", f"/vms/{ids.pop()}")[0] == 200
        status, pool = server.api("POST", "/pool", {"argv": [str(guest("hello"))], "size": 2})
        assert status == 201 and pool["preparing"] == 1 and "--max-vms" in pool["error"], pool
        status, body = server.api("POST", "/pool", {"argv": [str(guest("args"))]})
        assert (status, body["error"]) == (
            503,
            "pyvmm: the launcher has 1 pools already (pyvmm serve --max-pools): DELETE /pool first",
        )
        assert server.api("GET", "/")[1]["limits"] == {
            "max_vms": 2,
            "max_pools": 1,
            "max_connections": 256,
            "request_timeout": 10.0,
            "allow_uids": [],
        }
    finally:
        assert server.stop() == 128 + signal.SIGTERM, server.log.read_text()
    assert "Traceback" not in server.log.read_text()


@pytest.mark.parametrize(
    "option, line",
    [
        ("--max-vms=0", "serve: --max-vms=0: a count from 1 to 1000000"),
        ("--request-timeout=x", "serve: --request-timeout=x: seconds from 0.01 to 3600"),
        ("--allow-uid=root", "serve: --allow-uid=root: user ids (UID[,UID...])"),
        ("--max-pools", "serve: --max-pools: missing value (--max-pools=VALUE)"),
        ("--what=1", "serve: Invalid option: `--what=1' (see pyvmm serve --help)"),
    ],
)
def test_bad_limits_are_one_line(tmp_path, option, line):
    proc = subprocess.run(
        [sys.executable, "-m", "pyvmm", "serve", "--api-sock", str(tmp_path / "s"), option],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert (proc.returncode, proc.stderr) == (1, f"pyvmm: {line}\n")


def test_the_client_still_talks_to_a_launcher_of_its_own_user(launcher):
    """(The peer check passes root's launcher for root's client.)"""
    status, info = call(launcher.path, "GET", "/v1/")
    assert status == 200 and info["pid"] == launcher.proc.pid
