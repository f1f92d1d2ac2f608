"""Access control of every socket and file pyvmm creates, checked after
creation: its mode bits, its owner, and whether a peer with other
credentials (uid 65534, nobody, in a forked child that drops to it with
setgroups, setgid, setuid) gets in. pyvmm runs under umask 000 in every
test, so a mode that is not set by pyvmm itself shows as the widest one.

| what | mode | owner | another uid |
|---|---|---|---|
| `serve --api-sock` socket | 0600 [1] | launcher's user | EACCES; 403 if chmod 0666 [2] |
| the launcher's socketpairs | no name [3] | - | nothing to connect to |
| a VM's `"stdout"` file [8] | 0644 less umask | launcher's user | cannot write it |
| `--gdb-socket` | 0600 [4] | the `--user` | EACCES; refused if chmod 0666 [4] |
| `--dumpcore` core | 0600 [5] | the `--user` | cannot read it |
| `--snapshot-dir` and files | 0700, 0600 [6] | who runs pyvmm | cannot list or read |
| `--stats-json` file | 0666 less umask [7] | who runs pyvmm | - |
| `--trace` file | 0644 less umask [7] | who runs pyvmm | cannot write it |

[1] docs/security.md: umask 0177 around bind(2), so never wider.
[2] SO_PEERCRED: the launcher reads the peer's uid before a byte.
[3] its wake-up pair and each VM's channel (SOCK_SEQPACKET): the API
    socket is the only named one the launcher or its VMs hold (checked in
    the kernel's /proc/net/unix, paths and abstract names alike).
[4] docs/debugging.md: owner-only whatever the umask, and the peer's
    uid checked at accept (root, pyvmm's user or the --user).
[5] docs/debugging.md: made with O_TMPFILE after --user dropped privileges.
[6] docs/snapshots.md; a restore demands the directory be the restorer's
    own, so it stays the user who ran pyvmm, also with --user.
[7] not documented as owner-only (counters and timings, no guest data):
    created as a shell's redirection would be.
[8] a console file the launcher creates at a path a request names
    (docs/serve.md), opened by the VM's process before its guest runs.

The gdb socket is owner-only whatever the umask (mode set on the socket
before bind), and the stub also checks the peer's credentials
(host/peer.py), so a mode widened by hand lets no other user debug.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_serve import Launcher, wait_for

from conftest import ROOT, guest
from testkit.helpers import answer_in_fork

pytestmark = pytest.mark.kvm

NOBODY = 65534
#: A third user, neither the runner nor the --user.
OTHER = 4242
#: pyvmm runs under this umask in every test here: the widest.
UMASK = 0o000


def as_uid(uid: int, action: Callable[[], str]) -> str:
    """``action()``'s answer, run in a forked child that has become ``uid``
    (no supplementary groups): another user's credentials, as the kernel
    records them at connect(2) and checks them at open(2)."""

    def as_that_user() -> str:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        try:
            return action()
        except OSError as err:
            return f"error {err.errno}"

    return answer_in_fork(as_that_user)


def connect(path: str) -> str:
    """'connected', or the errno connect(2) failed with."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        return "connected"


def http_status(path: str) -> str:
    """The status line a GET on the API socket is answered with."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        # A refused peer is answered before the launcher reads a byte, and
        # the connection closed: the request may then meet a closed socket.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"GET /v1/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
        got = b""
        while b"\r\n" not in got and (chunk := sock.recv(4096)):
            got += chunk
        return got.split(b"\r\n", 1)[0].decode()


def read_file(path: str) -> str:
    with open(path, "rb") as f:
        f.read(1)
    return "read"


def list_dir(path: str) -> str:
    os.listdir(path)
    return "listed"


def write_file(path: str) -> str:
    with open(path, "ab"):
        pass
    return "opened for writing"


EACCES = f"error {errno.EACCES}"


def mode_of(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (not list, not write), outside
    pytest's own 0700 one, so a refusal is the object's own."""
    path = Path(tempfile.mkdtemp(prefix="pyvmm-access-"))
    path.chmod(0o711)
    yield path
    for child in sorted(path.rglob("*"), reverse=True):
        if child.is_dir() and not child.is_symlink():
            child.rmdir()
        else:
            child.unlink()
    path.rmdir()


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """pyvmm ARGS under umask 000, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "pyvmm", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        umask=UMASK,
        **kwargs,
    )


def start(*args: str) -> subprocess.Popen:
    """pyvmm ARGS under umask 000, running (stderr piped, text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pyvmm", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        umask=UMASK,
    )


def launcher(directory: Path) -> Launcher:
    return Launcher(directory, popen=functools.partial(subprocess.Popen, umask=UMASK))


# -- pyvmm serve ----------------------------------------------------------------------


def test_the_api_socket_is_its_users_only_whatever_the_umask(shared_dir):
    server = launcher(shared_dir)
    try:
        info = os.lstat(server.path)
        assert stat.S_ISSOCK(info.st_mode)
        assert (mode_of(server.path), info.st_uid) == (0o600, os.geteuid())
        assert as_uid(NOBODY, lambda: connect(server.path)) == EACCES
        # SO_PEERCRED, not the mode alone: opened to everyone, still refused.
        os.chmod(server.path, 0o666)
        assert as_uid(NOBODY, lambda: http_status(server.path)) == "HTTP/1.1 403 Forbidden"
        assert http_status(server.path) == "HTTP/1.1 200 OK"  # its own user is served
    finally:
        server.stop()


def unix_socket_names() -> dict[int, str]:
    """Every AF_UNIX socket of this network namespace with a name, by inode
    (the kernel's table: a path, or ``@name`` in the abstract namespace)."""
    names = {}
    with open("/proc/net/unix") as table:
        next(table)
        for line in table:
            fields = line.split()
            if len(fields) >= 8:
                names[int(fields[6])] = fields[7]
    return names


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if match := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(int(match.group(1)))
    return inodes


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdecimal():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == pid:
                found.append(int(entry))
    return found


def test_the_launchers_only_named_socket_is_its_api_socket(shared_dir):
    """Its wake-up pair and each VM's channel are socketpairs: no path, no
    abstract name, nothing another process could connect to."""
    server = launcher(shared_dir)
    out = shared_dir / "vm.out"
    try:
        status, vm = server.create("--mem=64", guest("spin"), stdout=str(out))
        assert status == 201, vm
        wait_for(out, "spinning")
        pids = [server.proc.pid, *children(server.proc.pid)]
        assert len(pids) >= 2  # the launcher and the VM's process
        names = unix_socket_names()
        held = {names[i] for pid in pids for i in socket_inodes(pid) if i in names}
        assert held == {server.path}, held
        status, _ = server.api("DELETE", f"/vms/{vm['id']}", {"signal": "SIGKILL"})
        assert status == 200
    finally:
        server.stop()


def test_a_console_file_the_launcher_creates_is_not_writable_by_others(shared_dir):
    server = launcher(shared_dir)
    console = shared_dir / "console"
    try:
        status, vm = server.create("--mem=64", guest("hello"), stdout=str(console), wait=True)
        assert status == 200 and vm["exit_status"] == 0, vm
    finally:
        server.stop()
    assert "SUCCESS" in console.read_text()
    info = console.lstat()
    assert stat.S_ISREG(info.st_mode)
    assert (mode_of(console), info.st_uid) == (0o644, os.geteuid())
    assert as_uid(NOBODY, lambda: write_file(str(console))) == EACCES


# -- the gdb socket -------------------------------------------------------------------


def gdb_socket(path: Path, *options: str) -> subprocess.Popen:
    """pyvmm waiting for gdb on ``path`` (it waits before the guest runs)."""
    vm = start(*options, f"--gdb-socket={path}", guest("hello"))
    deadline = time.monotonic() + 30
    while not os.path.lexists(path):
        assert vm.poll() is None, vm.stderr.read()
        assert time.monotonic() < deadline, "no gdb socket"
        time.sleep(0.02)
    return vm


def stop(vm: subprocess.Popen) -> None:
    vm.terminate()
    vm.communicate(timeout=30)


def test_the_gdb_socket_goes_to_the_user_and_keeps_others_out_under_umask_022(shared_dir):
    path = shared_dir / "gdb.sock"
    vm = subprocess.Popen(
        [sys.executable, "-m", "pyvmm", "--user=nobody", f"--gdb-socket={path}", guest("hello")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        umask=0o022,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.lexists(path) or os.lstat(path).st_uid != NOBODY:
            assert vm.poll() is None, vm.stderr.read()
            assert time.monotonic() < deadline, "no gdb socket given to nobody"
            time.sleep(0.02)
        assert mode_of(path) & 0o022 == 0  # nobody else may write (connect to) it
        assert as_uid(OTHER, lambda: connect(str(path))) == EACCES
    finally:
        stop(vm)


def test_another_user_cannot_connect_to_the_gdb_socket_whatever_the_umask(shared_dir):
    path = shared_dir / "gdb.sock"
    vm = gdb_socket(path)
    try:
        assert mode_of(path) == 0o600
        assert as_uid(NOBODY, lambda: connect(str(path))) == EACCES
    finally:
        stop(vm)


def recv_after_connect(path: str) -> str:
    """What the other end does with a connection: 'closed' when it hangs up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(path)
        return "closed" if sock.recv(1) == b"" else "kept"


def test_a_peer_let_in_by_a_widened_mode_is_refused_and_gdb_still_connects(shared_dir):
    path = shared_dir / "gdb.sock"
    vm = gdb_socket(path)
    try:
        path.chmod(0o666)  # by hand, after pyvmm made it owner-only
        assert as_uid(NOBODY, lambda: recv_after_connect(str(path))) == "closed"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(20)
            sock.connect(str(path))  # root: still the debugger's socket
            sock.sendall(b"$?#3f")
            assert sock.recv(1) == b"+"
    finally:
        vm.terminate()
        _, err = vm.communicate(timeout=30)
    assert f"pyvmm: gdb: refused a connection from uid {NOBODY}" in err


# -- files ----------------------------------------------------------------------------


def test_the_core_file_is_the_users_and_owner_only(shared_dir):
    cores = shared_dir / "cores"
    cores.mkdir()
    cores.chmod(0o777)  # --user=nobody must be able to make the core there
    result = run("--user=nobody", f"--dumpcore={cores}", guest("fault_zeropage"))
    assert result.returncode == 1, result.stderr
    made = list(cores.iterdir())
    assert len(made) == 1, (made, result.stderr)  # one core; else pyvmm's why
    (core,) = made
    assert core.name.startswith("core.solo5-hvt.")
    info = core.lstat()
    assert stat.S_ISREG(info.st_mode)
    assert (mode_of(core), info.st_uid) == (0o600, NOBODY)
    assert as_uid(OTHER, lambda: read_file(str(core))) == EACCES


def test_the_snapshot_directory_and_its_files_are_owner_only(shared_dir):
    directory = shared_dir / "snap"
    result = run(
        "--snapshot-at=first-wait",
        f"--snapshot-dir={directory}",
        "--snapshot-stop",
        guest("resume"),
    )
    assert result.returncode == 0, result.stderr
    info = directory.lstat()
    assert stat.S_ISDIR(info.st_mode)
    assert (mode_of(directory), info.st_uid) == (0o700, os.geteuid())
    files = sorted(p.name for p in directory.iterdir())
    assert files == ["cpu.state", "memory", "snapshot.json"]
    for name in files:
        info = (directory / name).lstat()
        assert stat.S_ISREG(info.st_mode)
        assert (mode_of(directory / name), info.st_uid) == (0o600, os.geteuid()), name
    assert as_uid(NOBODY, lambda: list_dir(str(directory))) == EACCES
    # The files refuse another user by their own mode too, not only by the
    # directory's: the same check with the directory opened up.
    directory.chmod(0o711)
    assert as_uid(NOBODY, lambda: read_file(str(directory / "snapshot.json"))) == EACCES


def test_the_stats_json_file_follows_the_umask_and_is_the_runners(shared_dir):
    for umask, expected in ((0o000, 0o666), (0o022, 0o644), (0o077, 0o600)):
        path = shared_dir / f"stats-{umask:o}.json"
        result = subprocess.run(
            [sys.executable, "-m", "pyvmm", f"--stats-json={path}", guest("hello")],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            umask=umask,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(path.read_text())["record"] == "final"
        info = path.lstat()
        assert stat.S_ISREG(info.st_mode)
        assert (mode_of(path), info.st_uid) == (expected, os.geteuid()), oct(umask)


def test_the_trace_file_is_never_writable_by_others_and_is_the_runners(shared_dir):
    path = shared_dir / "trace.json"
    result = run(f"--trace={path}", guest("hello"))
    assert result.returncode == 0, result.stderr
    info = path.lstat()
    assert stat.S_ISREG(info.st_mode)
    assert (mode_of(path), info.st_uid) == (0o644, os.geteuid())
    assert as_uid(NOBODY, lambda: write_file(str(path))) == EACCES
