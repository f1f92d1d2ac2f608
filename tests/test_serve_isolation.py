"""A VM's process forked by the warm launcher keeps nothing of the other
VMs or of the launcher once its guest runs: no fd of theirs, no mapping of
another VM's image and no copy of one in its memory (docs/security.md,
"The warm launcher's children"). Checked on a running child from outside,
through /proc/PID/fd, /proc/PID/maps and /proc/PID/mem."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from test_serve import Launcher, wait_for

from conftest import ROOT, guest

pytestmark = pytest.mark.kvm


#: What a VM's own process holds: its console, KVM's objects, its eventfds,
#: the signalfd of SIGUSR1, its own image (the lease on it), and the
#: launcher's fds it let go of, each left as /dev/null.
def own_thread_status(target: str, pid: int) -> bool:
    """The VM's own threads' status files, opened before its sandbox for
    the context-switch counters: its own, so no other VM's."""
    parts = target.split("/")
    return (
        len(parts) == 6
        and parts[:3] == ["", "proc", str(pid)]
        and parts[3] == "task"
        and parts[4].isdigit()
        and parts[5] == "status"
        and os.path.isdir(f"/proc/{pid}/task/{parts[4]}")
    )


OWN = {
    "/dev/null",
    "/dev/kvm",
    "anon_inode:kvm-vm",
    "anon_inode:kvm-vcpu:0",
    "anon_inode:kvm-vcpu-stats:0",
    "anon_inode:[eventfd]",
    "anon_inode:[signalfd]",
}
OTHERS = ("args", "hello", "compute")


def fd_targets(pid: int) -> dict[int, str]:
    out = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:
            pass
    return out


def readable_memory(pid: int) -> bytes:
    """Every readable mapping of ``pid`` (what code running in it can read)."""
    chunks = []
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split()
                if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("[v")):
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                for at in range(start, end, 1 << 20):
                    try:
                        chunks.append(os.pread(fd, min(1 << 20, end - at), at))
                    except OSError:
                        pass
    finally:
        os.close(fd)
    return b"".join(chunks)


def markers(image: Path, own: bytes) -> list[bytes]:
    """Windows of ``image``'s bytes found nowhere in ``own`` (the child's
    own image: every guest links the same runtime) and varied enough to be
    found by chance nowhere else."""
    data = image.read_bytes()
    out = []
    for at in range(4096, len(data) - 64, 251):
        window = data[at : at + 48]
        if len(set(window)) >= 20 and window not in own:
            out.append(window)
        if len(out) == 8:
            break
    assert len(out) >= 4, image
    return out


def others_running(launcher: Launcher, tmp_path: Path) -> dict:
    """Other VMs in every state the launcher keeps: two ended (their images
    read and cached), one running (its channel, pidfd and stderr pipe),
    one prepared in a pool, and a client halfway through a request."""
    for name in OTHERS[:2]:
        status, vm = launcher.create("--mem=64", guest(name), stdout=str(tmp_path / name))
        assert status == 201, vm
        assert launcher.api("GET", f"/vms/{vm['id']}/wait")[0] == 200
    out = tmp_path / "running"
    status, running = launcher.create("--mem=64", guest("spin"), stdout=str(out))
    assert status == 201, running
    wait_for(out, "spinning")
    argv = ["--mem=64", str(guest(OTHERS[2]))]
    status, pool = launcher.api("POST", "/pool", {"argv": argv, "size": 1})
    assert status == 201, pool
    deadline = time.monotonic() + 30
    while launcher.api("GET", "/pool")[1]["pools"][0]["ready"] != 1:
        assert time.monotonic() < deadline, "the pool never got ready"
        time.sleep(0.05)
    client = socket.socket(socket.AF_UNIX)
    client.connect(launcher.path)
    client.sendall(b"POST /vms HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{")
    return {"running": running, "client": client}


@pytest.mark.parametrize("pooled", [False, True], ids=["fork", "pooled"])
def test_a_vm_holds_no_fd_mapping_or_image_of_other_vms(tmp_path, pooled):
    launcher = Launcher(tmp_path)
    try:
        others = others_running(launcher, tmp_path)
        argv = ["--user=nobody", "--mem=64", str(guest("spin").relative_to(ROOT))]
        if pooled:
            status, pool = launcher.api("POST", "/pool", {"argv": argv, "cwd": str(ROOT)})
            assert status == 201, pool
            deadline = time.monotonic() + 30
            while sum(p["ready"] for p in launcher.api("GET", "/pool")[1]["pools"]) != 2:
                assert time.monotonic() < deadline, "the pool never got ready"
                time.sleep(0.05)
        console, err = tmp_path / "console", tmp_path / "err"
        status, vm = launcher.create(*argv, cwd=str(ROOT), stdout=str(console), stderr=str(err))
        assert status == 201 and vm.get("pooled", False) == pooled, vm
        wait_for(console, "spinning")
        pid = vm["pid"]

        targets = fd_targets(pid)
        sockets = [t for t in targets.values() if t.startswith("socket:")]
        foreign = {
            fd: t
            for fd, t in targets.items()
            if t not in OWN | {str(console), str(err), str(guest("spin"))}
            and not t.startswith("socket:")
            and not own_thread_status(t, pid)
        }
        assert not foreign, targets  # no pidfd, epoll, pipe, other image, launcher file
        assert len(sockets) == 1, targets  # its channel to the launcher, nothing else
        assert set(fd_targets(launcher.proc.pid).values()) & set(sockets) == set()

        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
        for name in OTHERS:
            assert str(guest(name)) not in maps, name

        own = guest("spin").read_bytes()
        child_memory = readable_memory(pid)
        launcher_memory = readable_memory(launcher.proc.pid)
        for name in OTHERS:
            for window in markers(guest(name), own):
                assert window in launcher_memory, name  # the launcher does hold it
                assert window not in child_memory, name

        assert launcher.api("DELETE", f"/vms/{vm['id']}")[0] == 200
        assert launcher.api("DELETE", f"/vms/{others['running']['id']}")[0] == 200
        others["client"].close()
    finally:
        launcher.api("DELETE", "/pool")
        launcher.stop()
    assert "Traceback" not in launcher.log.read_text()


LET_GO = """
import os, socket, sys, types
from pyvmm.serve import child
kept = os.open("/dev/zero", os.O_RDONLY)
stray_file = os.open(sys.argv[1], os.O_RDONLY)
stray_pipe = os.pipe()
stray_sock = socket.socket(socket.AF_UNIX).detach()
spec = types.SimpleNamespace(plan=types.SimpleNamespace(kernel=None))
child._let_go_of_others(spec, {0, 1, 2, kept})
for fd in (kept, stray_file, *stray_pipe, stray_sock):
    print(fd, os.readlink(f"/proc/self/fd/{fd}"))
print("next", os.open("/dev/zero", os.O_RDONLY))
"""


def test_every_fd_but_the_kept_ones_becomes_dev_null_and_keeps_its_number(tmp_path):
    """What the child does to whatever the launcher held at the fork that
    it did not close itself: each such fd is /dev/null from then on, at the
    same number (so no object of the launcher's heap can close one the VM
    opens later), and the kept ones are untouched."""
    import subprocess
    import sys

    secret = tmp_path / "another-vms-file"
    secret.write_text("x")
    result = subprocess.run(
        [sys.executable, "-c", LET_GO, str(secret)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    *lines, last = result.stdout.splitlines()
    targets = dict(line.split(" ", 1) for line in lines)
    kept, *strays = targets
    assert targets[kept] == "/dev/zero"
    assert [targets[fd] for fd in strays] == ["/dev/null"] * 4, targets
    assert int(last.split()[1]) not in {int(fd) for fd in targets}  # the numbers stay taken
