"""Guests of one image share its pages: pyvmm maps whole
file pages copy-on-write instead of copying them, only for a file nobody
but root and pyvmm's user can write (docs/security.md), and a guest's
writes never reach the file."""

from __future__ import annotations

import hashlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import ROOT, guest, run_pyvmm
from testkit import smaps

pytestmark = pytest.mark.kvm

KIB = 1024
TABLE_KIB = 64  # imgshare's read-only table (guests/imgshare.c)
DATA_KIB = 12  # and its initialised data
IDLE_WITHIN = 30.0  # seconds: generous on a loaded 2-core machine


@contextmanager
def idle_guest(image: Path, *opts: str, env: dict[str, str] | None = None) -> Iterator[int]:
    """imgshare running and idle (its memory set up and touched): its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyvmm", "--mem", "16", *opts, str(image)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + IDLE_WITHIN
            out = b""
            while b"idle\n" not in out:
                left = deadline - time.monotonic()
                assert left > 0 and sel.select(left), f"not idle: {out!r}"
                chunk = os.read(proc.stdout.fileno(), 4096)
                assert chunk, f"ended: {out!r} {proc.stderr.read()!r}"
                out += chunk
        assert b"data: 0 wrong bytes" in out
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM, err


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
            maps = {m.perms: m for m in image_mappings(pid, image)}
            assert set(maps) == {"r-xp", "r--p", "rw-p"}, maps
            rodata = maps["r--p"]
            # Every table page is resident and counted half in each guest.
            assert rodata["Rss"] >= TABLE_KIB
            assert rodata["Pss"] * 2 <= rodata["Rss"] + 4
            assert rodata["Private_Clean"] + rodata["Private_Dirty"] == 0
            # The data the guest rewrote: private copies, nothing shared.
            data = maps["rw-p"]
            assert data["Rss"] == data["Private_Dirty"] == DATA_KIB


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


@pytest.mark.parametrize("mode, reaches", [(0o755, True), (0o775, False)], ids=["own", "group"])
def test_a_rewrite_in_place_reaches_only_a_shared_image(tmp_path: Path, mode, reaches) -> None:
    """The rule's reason (docs/security.md): a page the guest has not
    written is the page cache's, so a write into the file shows in the
    guest. Only a file no one but root and pyvmm's user can write is
    mapped; a group-writable one is copied, and its writer changes nothing."""
    image = private_copy(tmp_path, mode)
    # A page of imgshare's table, in the file and in the guest (its rodata
    # segment maps file offset 0x3000 to 0x102000: readelf -l).
    offset = -(-image.read_bytes().find(b"\xa5" * 8192) // 4096) * 4096
    gpa = 0x102000 + offset - 0x3000
    new = b"\x3c" * 16
    with idle_guest(image) as pid:
        (base, _end), *_ = smaps.guest_memory(smaps.read(pid), 16 << 20)
        with open(image, "r+b") as f:  # in place, as cp onto it would
            f.seek(offset)
            f.write(new)
        # Read once, after the write: here a /proc/PID/mem read before it
        # was seen to detach that page from the file (old bytes after).
        with open(f"/proc/{pid}/mem", "rb") as mem:
            mem.seek(base + gpa)
            seen = mem.read(16)
    assert seen == (new if reaches else b"\xa5" * 16)


@pytest.mark.parametrize("cpl", ["0", "3"])
def test_faults_stay_faults_on_mapped_pages(cpl: str) -> None:
    """Text mapped from the file is read-only to the guest as copied text was."""
    result = run_pyvmm(f"--cpl={cpl}", "-v", guest("fault_wtext"))
    assert result.returncode == 1
    assert "shared from the page cache" in result.stderr
    assert "read-only" in result.stderr.splitlines()[-1]
