"""Guests of one image share its read-only pages: pyvmm maps whole file
pages copy-on-write instead of copying them, only for a file nobody but
root and pyvmm's user can write and nobody has open for writing, under a
read lease that holds back anyone who opens it for writing later until
the pages are copied (docs/security.md); a guest's writes never reach the
file, and nobody's write to the file reaches the guest."""

from __future__ import annotations

import hashlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import ROOT, guest, run_pyvmm
from pyvmm.serve.client import call
from testkit import smaps

pytestmark = pytest.mark.kvm

KIB = 1024
TABLE_KIB = 64  # imgshare's read-only table (guests/imgshare.c)
DATA_KIB = 12  # and its initialised data
IDLE_WITHIN = 30.0  # seconds: generous on a loaded 2-core machine


class Guest:
    """imgshare running under pyvmm -v: its process and its output so far."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.out, self.err = proc, b"", b""
        self.status: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for(self, text: bytes, count: int = 1) -> None:
        """Read its output until ``text`` appeared ``count`` more times."""
        want = self.out.count(text) + count
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + IDLE_WITHIN
            while self.out.count(text) < want:
                left = deadline - time.monotonic()
                assert left > 0 and sel.select(left), f"no {text!r}: {self.out!r}"
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                assert chunk, f"ended: {self.out!r} {self.proc.stderr.read()!r}"
                self.out += chunk

    def end(self, *, stop: bool = True) -> int:
        """Its status once it ended (sent SIGTERM first with ``stop``); its
        output and -v lines are kept."""
        if self.status is None:
            if stop and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            out, self.err = self.proc.communicate(timeout=60)
            self.out += out
            self.status = self.proc.returncode
        return self.status


@contextmanager
def running_guest(
    image: Path, *opts: str, arg: str = "", ready: bytes = b"idle\n", env: dict | None = None
) -> Iterator[Guest]:
    """imgshare running (its memory set up and touched) until ``ready``;
    stopped by SIGTERM at the end unless it ended already."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyvmm", "-v", "--mem", "16", *opts, str(image), arg],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    guest = Guest(proc)
    try:
        guest.wait_for(ready)
        assert b"data: 0 wrong bytes" in guest.out
        yield guest
    finally:
        guest.end()
        assert b"CHANGED" not in guest.out, guest.out


@contextmanager
def idle_guest(image: Path, *opts: str, env: dict[str, str] | None = None) -> Iterator[int]:
    """imgshare running and idle: its pid. It must end by the SIGTERM."""
    with running_guest(image, *opts, env=env) as guest:
        yield guest.pid
    assert guest.status == 128 + signal.SIGTERM, guest.err


def image_mappings(pid: int, image: Path) -> list[smaps.Mapping]:
    """The mappings of ``image`` in guest memory (not the whole-file map the
    loader parses it from: offset 0)."""
    real = os.path.realpath(image)
    return [m for m in smaps.read(pid) if m.path in (real, real + " (deleted)") and m.offset]


def private_copy(tmp_path: Path, mode: int = 0o755) -> Path:
    dst = tmp_path / "imgshare.hvt"
    shutil.copyfile(guest("imgshare"), dst)
    os.chmod(dst, mode)
    return dst


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_guests_share_the_read_only_pages(tmp_path: Path) -> None:
    image = private_copy(tmp_path)  # mapped by these two guests only
    with idle_guest(image) as first, idle_guest(image) as second:
        for pid in (first, second):
            # Text and read-only data only: initialised data is copied.
            maps = {m.perms: m for m in image_mappings(pid, image)}
            assert set(maps) == {"r-xp", "r--p"}, maps
            rodata = maps["r--p"]
            # Every table page is resident and counted half in each guest.
            assert rodata["Rss"] >= TABLE_KIB
            assert rodata["Pss"] * 2 <= rodata["Rss"] + 4
            assert rodata["Private_Clean"] + rodata["Private_Dirty"] == 0


def test_guest_writes_do_not_reach_the_file(tmp_path: Path) -> None:
    image = private_copy(tmp_path)
    before = digest(image)
    for _ in range(2):  # the second run sees the file's data, not the first's
        result = run_pyvmm("-v", image, "exit")
        assert result.returncode == 0, result.stderr
        assert "data: 0 wrong bytes, 12288 written" in result.stdout
        assert "KiB shared from the page cache" in result.stderr
    assert digest(image) == before


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda p: os.chmod(p, 0o775), "writable by group or others"),
        (lambda p: os.chmod(p, 0o757), "writable by group or others"),
        (lambda p: os.chown(p, 65534, -1), "owned by uid 65534"),
        (lambda p: None, "PYVMM_IMAGE_SHARING=0"),
    ],
    ids=["group-writable", "other-writable", "other-owner", "turned-off"],
)
def test_a_file_others_can_write_is_copied(tmp_path: Path, change, why: str) -> None:
    image = private_copy(tmp_path)
    change(image)
    env = dict(os.environ, PYVMM_IMAGE_SHARING="0") if why.startswith("PYVMM") else None
    result = run_pyvmm("-v", image, "exit", env=env)
    assert result.returncode == 0, result.stderr
    assert f"copied, not shared: {why}" in result.stderr
    with idle_guest(image, env=env) as pid:
        assert image_mappings(pid, image) == []


def test_a_file_replaced_under_a_running_guest_leaves_it_alone(tmp_path: Path) -> None:
    """Replacing (rename over, as install and cp --remove-destination do) is
    the safe way to update an image: the guest keeps the old file's pages."""
    image = private_copy(tmp_path)
    before = digest(image)
    with idle_guest(image) as pid:
        new = tmp_path / "new.hvt"
        shutil.copyfile(guest("hello"), new)
        os.replace(new, image)
        maps = image_mappings(pid, image)
        assert maps and all(m.path.endswith(" (deleted)") for m in maps)
    assert digest(image) != before
    assert run_pyvmm(image).returncode == 0  # the new file is hello


def table_offset(image: Path) -> int:
    """The file offset of a whole page of imgshare's table."""
    return -(-image.read_bytes().find(b"\xa5" * 8192) // 4096) * 4096


def rewrite_in_place(image: Path) -> None:
    with open(image, "r+b") as f:  # in place, as cp onto it would
        f.seek(table_offset(image))
        f.write(b"\x3c" * 8192)


def truncate(image: Path) -> None:
    os.truncate(image, 4096)


def run_as_writer(image: Path, change: Callable[[Path], None]) -> None:
    """``change`` made by another process (as a user's cp or dd would),
    which returns once the change is made."""
    pid = os.fork()
    if pid == 0:  # the child
        status = 1
        try:
            change(image)
            status = 0
        finally:
            os._exit(status)
    assert os.waitpid(pid, 0)[1] == 0


@pytest.mark.parametrize("change", [rewrite_in_place, truncate], ids=["rewrite", "truncate"])
def test_a_writer_while_the_guest_runs_waits_until_its_pages_are_copied(
    tmp_path: Path, change
) -> None:
    """Whoever opens the image for writing or truncates it while a guest
    shares its pages is held back by the lease until pyvmm copied them: the
    guest, which sums its text and table every 20 ms, sees no change and
    runs on; no page of the file is left in its memory."""
    image = private_copy(tmp_path)
    with running_guest(image, arg="watch", ready=b"watching\n") as guest:
        assert image_mappings(guest.pid, image)
        run_as_writer(image, change)
        guest.wait_for(b"tick ", 3)
        assert image_mappings(guest.pid, image) == []
    assert guest.status == 128 + signal.SIGTERM, guest.err
    assert b"opened for writing while the guest ran" in guest.err
    assert b"pages were copied first, then the writer went on" in guest.err


def test_a_file_open_for_writing_before_the_start_is_copied(tmp_path: Path) -> None:
    """Someone who kept a descriptor open for writing while the file became
    root's (the owner and mode rule alone would share it) is seen by the
    lease, which cannot be taken: the image is copied, and their later
    writes and truncation change nothing in the guest."""
    image = private_copy(tmp_path, 0o644)
    os.chown(image, 65534, 65534)
    offset = table_offset(image)
    opened_r, opened_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own file's writer, as nobody
        status = 1
        try:
            os.close(opened_r)
            os.close(go_w)
            fd = os.open(image, os.O_RDWR)
            os.setgid(65534)
            os.setuid(65534)
            os.write(opened_w, b"1")
            os.read(go_r, 1)  # until the guest runs
            os.pwrite(fd, b"\x3c" * 8192, offset)
            os.ftruncate(fd, 4096)
            status = 0
        finally:
            os._exit(status)
    os.close(opened_w)
    os.close(go_r)
    try:
        assert os.read(opened_r, 1) == b"1", "the writer did not open the file"
        os.chown(image, 0, 0)
        os.chmod(image, 0o755)
        with running_guest(image, arg="watch", ready=b"watching\n") as guest:
            assert image_mappings(guest.pid, image) == []
            os.write(go_w, b"1")
            pid, status = 0, os.waitpid(pid, 0)[1]
            assert status == 0, "the writer failed"
            guest.wait_for(b"tick ", 3)
        assert guest.status == 128 + signal.SIGTERM, guest.err
        assert b"copied, not shared: open for writing by another process" in guest.err
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(opened_r)
        os.close(go_w)


@contextmanager
def lease_break_time(seconds: int) -> Iterator[None]:
    """/proc/sys/fs/lease-break-time for a while: how long the kernel holds
    a writer back before it ends a lease by itself."""
    path = Path("/proc/sys/fs/lease-break-time")
    before = path.read_text()
    path.write_text(f"{seconds}\n")
    try:
        yield
    finally:
        path.write_text(before)


def test_a_truncation_no_lease_held_back_is_one_guest_fault_line(tmp_path: Path) -> None:
    """pyvmm stopped (SIGSTOP) past the lease-break time cannot copy its
    pages: the kernel ends the lease and the truncation takes them. What
    follows is a guest fault, one line and status 1, never a SIGBUS."""
    image = private_copy(tmp_path)
    with running_guest(image, arg="watch", ready=b"watching\n") as guest:
        os.kill(guest.pid, signal.SIGSTOP)
        try:
            with lease_break_time(1):
                run_as_writer(image, truncate)  # let through after a second
        finally:
            os.kill(guest.pid, signal.SIGCONT)
        assert guest.end(stop=False) == 1, guest.err
    last = guest.err.decode().strip().splitlines()[-1]
    assert "is gone: the file it was mapped from was truncated" in last, guest.err
    assert b"some of its shared pages were already gone" in guest.err


@pytest.mark.parametrize("cpl", ["0", "3"])
def test_faults_stay_faults_on_mapped_pages(cpl: str) -> None:
    """Text mapped from the file is read-only to the guest as copied text was."""
    result = run_pyvmm(f"--cpl={cpl}", "-v", guest("fault_wtext"))
    assert result.returncode == 1
    assert "shared from the page cache" in result.stderr
    assert "read-only" in result.stderr.splitlines()[-1]


def test_a_writer_under_a_launchers_guest_waits_for_its_copy(tmp_path: Path) -> None:
    """Through pyvmm serve: the launcher reads the image into its memory
    and holds no lease; the VM's own process takes one, and a writer
    waits for that process's copy as for a command's."""
    image = private_copy(tmp_path)
    sock, out, err = tmp_path / "api.sock", tmp_path / "console", tmp_path / "stderr"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "pyvmm", "serve", "--api-sock", str(sock)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + IDLE_WITHIN
        while not sock.exists():
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        argv = ["-v", "--mem=16", str(image), "watch"]
        status, vm = call(
            str(sock), "POST", "/vms", {"argv": argv, "stdout": str(out), "stderr": str(err)}
        )
        assert status == 201, vm
        deadline = time.monotonic() + IDLE_WITHIN
        while b"watching" not in out.read_bytes():
            assert time.monotonic() < deadline, out.read_bytes()
            time.sleep(0.05)
        assert image_mappings(vm["pid"], image)
        assert not [m for m in smaps.read(launcher.pid) if m.path == os.path.realpath(image)]
        run_as_writer(image, rewrite_in_place)
        ticks = out.read_bytes().count(b"tick ")
        while out.read_bytes().count(b"tick ") < ticks + 3:
            assert time.monotonic() < deadline and b"CHANGED" not in out.read_bytes()
            time.sleep(0.05)
        assert image_mappings(vm["pid"], image) == []
        status, end = call(str(sock), "DELETE", f"/vms/{vm['id']}", {"signal": "SIGTERM"})
        assert status == 200 and end["exit_status"] == 128 + signal.SIGTERM, err.read_text()
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
    assert "pages were copied first, then the writer went on" in err.read_text()
