"""The read lease under a shared image (pyvmm/loader/lease.py,
csrc/imagelease.c) and the copies that survive a file page gone from
under them (pyvmm_copy_guarded, csrc/guestmem.c).

The lease: it cannot be taken while anyone has the file open for
writing; a writer who comes later waits until every range mapped under it
is copied into anonymous memory, and then goes on; a forked child's copy
of it does not keep it alive. The guard: a copy that meets a page its
file lost is an error, not a SIGBUS; any other SIGBUS keeps its action.
Cases that could kill the process run in a child, whose end is checked.
"""

from __future__ import annotations

import errno
import mmap
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pyvmm._native import ffi, lib
from pyvmm.kvm.memory import PAGE_SIZE, GuestMemory, Protection
from pyvmm.loader.lease import CLOSED, COPIED, HELD, ImageLease

ROOT = Path(__file__).resolve().parents[2]
PAGES = 16
BASE = 0x200000


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "app.hvt"
    path.write_bytes(bytes(range(256)) * (PAGES * PAGE_SIZE // 256))
    path.chmod(0o755)
    return path


@contextmanager
def opened(path: Path, flags: int = os.O_RDONLY) -> Iterator[int]:
    fd = os.open(path, flags)
    try:
        yield fd
    finally:
        os.close(fd)


def file_mappings(path: Path) -> list[str]:
    """This process's mappings of ``path`` (/proc/self/maps lines)."""
    with open("/proc/self/maps") as f:
        return [line for line in f if line.rstrip().endswith(str(path))]


def writer(path: Path, how: str) -> int:
    """Another process opens ``path`` for writing (or truncates it), the way
    a user's cp or truncate does; its exit status once that returned."""
    code = {
        "open": f"import os; os.close(os.open({str(path)!r}, os.O_WRONLY))",
        "truncate": f"import os; os.truncate({str(path)!r}, 0)",
    }[how]
    return subprocess.run([sys.executable, "-c", code], timeout=60).returncode


def test_no_lease_while_someone_has_the_file_open_for_writing(image: Path) -> None:
    with opened(image, os.O_RDWR), opened(image) as fd:
        assert ImageLease.take(str(image), fd) == "open for writing by another process"
    # A writable shared mapping whose descriptor was closed writes as well.
    with opened(image, os.O_RDWR) as fd:
        shared = mmap.mmap(fd, PAGE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    with opened(image) as fd:
        assert ImageLease.take(str(image), fd) == "open for writing by another process"
    shared.close()
    with opened(image) as fd:
        lease = ImageLease.take(str(image), fd)
        assert isinstance(lease, ImageLease) and lease.state == HELD
        lease.release()
        assert lease.state == CLOSED


@pytest.mark.parametrize("how", ["open", "truncate"])
def test_a_writer_waits_until_the_mapped_pages_are_copied(image: Path, how: str) -> None:
    """The loader's view and a run of guest memory, both mapped under the
    lease, read the same bytes after the writer truncated the file, and
    neither is the file's any more."""
    before = image.read_bytes()
    with opened(image) as fd, GuestMemory(4 << 20) as memory:
        lease = ImageLease.take(str(image), fd)
        assert isinstance(lease, ImageLease)
        view = lease.view(fd, len(before))
        assert view is not None and bytes(view) == before
        assert memory.map_file(BASE, 4 * PAGE_SIZE, fd, PAGE_SIZE, lease=lease.slot) == 0
        memory.protect(BASE, 4 * PAGE_SIZE, Protection(write=False))
        assert len(file_mappings(image)) == 2
        copied = lib.pyvmm_lease_counters().bytes_copied

        assert writer(image, how) == 0

        assert lease.state == COPIED
        assert lib.pyvmm_lease_counters().bytes_copied - copied == len(before) + 4 * PAGE_SIZE
        assert file_mappings(image) == []
        assert bytes(view) == before
        assert memory.read(BASE, 4 * PAGE_SIZE) == before[PAGE_SIZE : 5 * PAGE_SIZE]
        assert memory.is_read_only(BASE, BASE + 4 * PAGE_SIZE)
        # Broken: nothing more is mapped under it (the caller copies).
        broken = memory.map_file(BASE + 0x10000, PAGE_SIZE, fd, 0, lease=lease.slot)
        assert broken == lib.PYVMM_LEASE_BROKEN
        lease.release()


def test_guest_memory_closed_is_no_longer_watched(image: Path) -> None:
    """Once guest memory is unmapped, a break copies nothing into the
    addresses it had (something else may live there by then)."""
    with opened(image) as fd:
        lease = ImageLease.take(str(image), fd)
        assert isinstance(lease, ImageLease)
        with GuestMemory(4 << 20) as memory:
            assert memory.map_file(BASE, PAGE_SIZE, fd, 0, lease=lease.slot) == 0
        copied = lib.pyvmm_lease_counters().ranges_copied
        assert writer(image, "open") == 0
        assert lease.state == COPIED
        assert lib.pyvmm_lease_counters().ranges_copied == copied


def test_a_forked_child_does_not_keep_the_lease(image: Path) -> None:
    """A child shares the parent's lease descriptor; unless it closes its
    copy, the parent's release would not end the lease, and a writer would
    wait for the lease-break time for a holder who never answers."""
    with opened(image) as fd:
        lease = ImageLease.take(str(image), fd)
        assert isinstance(lease, ImageLease)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: alive until killed
            os.write(ready_w, b"1")
            signal.pause()
            os._exit(0)
        try:
            assert os.read(ready_r, 1) == b"1"
            assert lease.state == HELD
            lease.release()
            # A writer that does not wait: EAGAIN if any lease were left.
            os.close(os.open(image, os.O_WRONLY | os.O_NONBLOCK))
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(ready_r)
            os.close(ready_w)


def in_child(body: str, image: Path, *, writable: bool = False) -> subprocess.CompletedProcess:
    """``body`` run by a fresh interpreter with a truncated file mapped into
    guest memory at BASE (no lease: nothing copies it first), read-only as
    an image's text or, with ``writable``, as a restored snapshot's data."""
    prologue = f"""
        import os
        from pyvmm._native import ffi, lib
        from pyvmm.common.errors import GuestFault
        from pyvmm.kvm.memory import GuestMemory, PagesGone, Protection
        memory = GuestMemory(4 << 20)
        fd = os.open({str(image)!r}, os.O_RDONLY)
        assert memory.map_file({BASE}, {4 * PAGE_SIZE}, fd, 0) == 0
        memory.protect({BASE}, {4 * PAGE_SIZE}, Protection(write={writable}))
        assert memory.read({BASE}, 16) == bytes(range(16))
        os.truncate({str(image)!r}, {PAGE_SIZE})
    """
    code = textwrap.dedent(prologue) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_a_read_of_a_page_gone_is_a_guest_fault(image: Path) -> None:
    result = in_child(
        f"""
        assert memory.read({BASE}, 16) == bytes(range(16))  # the page still there
        try:
            memory.read({BASE} + {PAGE_SIZE} - 8, 16, what="puts hypercall")
        except GuestFault as e:
            print(e)
        assert memory.gone_page() == {BASE + PAGE_SIZE}
        """,
        image,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"guest fault: puts hypercall at {BASE + PAGE_SIZE - 8:#x}+0x10: its pages are gone "
        "(the file they were mapped from was truncated)"
    )


def test_a_set_up_copy_from_a_page_gone_is_an_error(image: Path) -> None:
    result = in_child(
        f"""
        source = ffi.buffer(ffi.cast("uint8_t *", memory.host_addr + {BASE + PAGE_SIZE}), 64)
        try:
            memory.write(0x300000, memoryview(source), what="kernel load")
        except PagesGone as e:
            print(e)
        """,
        image,
    )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip()
        == "kernel load: the bytes to copy are gone (their file was truncated)"
    )


def test_a_hypercall_struct_on_a_page_gone_is_a_guest_fault(image: Path) -> None:
    """Guest memory mapped from a file (a restored snapshot's is, all of
    it) may hold a hypercall's struct: reading it, and writing its result,
    are guarded copies."""
    result = in_child(
        f"""
        from pyvmm.kvm.memory import GuestStruct
        for gpa in ({BASE + PAGE_SIZE}, {BASE + PAGE_SIZE - 8}):
            try:
                memory.request("struct hvt_hc_net_read", gpa, what="net_read hypercall")
            except GuestFault as e:
                print(e)
        copy, guest = memory.request("struct hvt_hc_poll", {BASE}, what="poll hypercall")
        guest.ret = 7
        print(isinstance(guest, GuestStruct), memory.read({BASE} + 16, 4) == bytes([7, 0, 0, 0]))
        """,
        image,
        writable=True,
    )
    assert result.returncode == 0, result.stderr
    gone = "its pages are gone (the file they were mapped from was truncated)"
    assert result.stdout.splitlines() == [
        f"guest fault: net_read hypercall at {BASE + PAGE_SIZE:#x}+0x20: {gone}",
        f"guest fault: net_read hypercall at {BASE + PAGE_SIZE - 8:#x}+0x20: {gone}",
        "True True",
    ]


def test_a_system_call_on_a_page_gone_answers_efault(image: Path) -> None:
    """A frame sent from a page gone: the tap's write fails (EFAULT), and
    the hypercall answers EUNSPEC as for any other send failure."""
    result = in_child(
        f"""
        from pyvmm.devices.net.hypercalls import NetHypercalls
        r, w = os.pipe()
        class Pipe:
            max_frame = 1514
            def write(self, data):
                os.write(w, data)
        arg = memory.struct("struct hvt_hc_net_write", 0x300000)
        arg.handle, arg.data, arg.len = 0, {BASE + PAGE_SIZE}, 64
        NetHypercalls(memory, {{0: Pipe()}}).net_write(0x300000)
        print(arg.ret == lib.HVT_RET_EUNSPEC)
        """,
        image,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_a_sigbus_outside_a_guarded_copy_still_ends_the_process(image: Path) -> None:
    result = in_child(
        f"""
        memory.read({BASE}, 16)  # the guard's handler is installed
        ffi.buffer(ffi.cast("uint8_t *", memory.host_addr + {BASE + PAGE_SIZE}), 16)[:]
        print("survived")
        """,
        image,
    )
    assert result.returncode == -signal.SIGBUS, result.stderr
    assert "survived" not in result.stdout


@pytest.mark.parametrize("sent_by", ["kill", "raise"])
def test_a_sigbus_sent_to_the_process_keeps_its_action(image: Path, sent_by: str) -> None:
    """A SIGBUS another process sends (si_code SI_USER, 0) or the process
    raises (SI_TKILL, negative) is no fault of a guarded copy: it ends the
    process as it would without the guard's handler."""
    send = (
        "os.kill(os.getpid(), signal.SIGBUS)"
        if sent_by == "kill"
        else "signal.raise_signal(signal.SIGBUS)"
    )
    result = in_child(
        f"""
        import signal
        memory.read({BASE}, 16)  # the guard's handler is installed
        {send}
        print("survived")
        """,
        image,
    )
    assert result.returncode == -signal.SIGBUS, result.stdout + result.stderr
    assert "survived" not in result.stdout


@pytest.mark.parametrize("gone_side", ["destination", "source"])
@pytest.mark.parametrize("other", [0x100000, BASE + 8 * PAGE_SIZE])
def test_a_copy_with_a_page_gone_answers_efault_from_either_side(
    image: Path, gone_side: str, other: int
) -> None:
    """The guard covers the destination and the source, wherever one lies
    from the other (here the other side in guest memory below the gone
    page, then above it)."""
    args = "gone, other" if gone_side == "destination" else "other, gone"
    result = in_child(
        f"""
        gone = ffi.cast("uint8_t *", memory.host_addr + {BASE + PAGE_SIZE})
        other = ffi.cast("uint8_t *", memory.host_addr + {other})
        print(lib.pyvmm_copy_guarded({args}, 64), lib.pyvmm_guard_in_force())
        """,
        image,
        writable=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(-errno.EFAULT), "0"]


def test_a_guarded_copy_answers_efault_and_copies_otherwise() -> None:
    src, dst = b"abcdefgh", bytearray(8)
    assert lib.pyvmm_copy_guarded(ffi.from_buffer(dst), src, 8) == 0
    assert dst == src
    assert lib.pyvmm_copy_guarded(ffi.from_buffer(dst), src, 0) == 0
