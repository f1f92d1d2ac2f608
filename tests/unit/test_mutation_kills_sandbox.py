"""Edges of the seccomp filter's builder (csrc/sandbox.c) that the mutation
run found untested: a program larger than the caller's buffer is -ENOSPC,
not a silent empty filter, building leaves no descriptor behind, the
self-test calls the syscalls (and madvise) by their numbers in the kernel
headers; and around the filter: --trace's start read before it, only when
tracing, a refused --user switch is one line, and --user's UID:GID takes
every id up to the largest one (2**32 - 2) for the user and the group
alike."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from pyvmm._native import ffi, lib
from pyvmm.host.sandbox import _SYSCALLS, ALLOW
from testkit.helpers import answer_in_fork


def _build(size: int) -> int:
    names = [ffi.new("char[]", n.encode()) for n in ALLOW]
    array = ffi.new("char *[]", names)
    buf = ffi.new("char[]", max(size, 1))
    return lib.pyvmm_sandbox_build(array, len(names), lib.PYVMM_SANDBOX_ERRNO, buf, size)


def test_a_program_larger_than_the_buffer_is_enospc() -> None:
    length = _build(lib.PYVMM_SANDBOX_PROG_MAX)
    assert length > 0 and length % 8 == 0  # whole struct sock_filter instructions
    assert _build(length - 8) == -errno.ENOSPC
    assert _build(8) == -errno.ENOSPC
    assert _build(length) == length


def test_building_leaves_no_descriptor_open() -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert _build(lib.PYVMM_SANDBOX_PROG_MAX) > 0
    assert len(os.listdir("/proc/self/fd")) == before


HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),  # arm64 uses the generic table
}


@pytest.mark.parametrize("arch", sorted(HEADERS))
def test_the_self_tests_syscall_numbers_are_the_kernel_headers(arch: str) -> None:
    """The numbers the self-test calls by (for both architectures, also the
    one this host is not) against the kernel's own headers."""
    text = HEADERS[arch].read_text()
    for name, number in _SYSCALLS[arch].items():
        found = re.search(rf"^#define __NR_{name}\s+(\d+)\s*$", text, re.M)
        assert found, (arch, name)
        assert int(found.group(1)) == number, (arch, name)


def test_the_self_tests_other_numbers_are_the_kernel_headers() -> None:
    """madvise's MADV_HWPOISON, which the self-test asks for by number."""
    from pyvmm.host import sandbox

    text = Path("/usr/include/asm-generic/mman-common.h").read_text()
    found = re.search(r"^#define MADV_HWPOISON\s+(\d+)", text, re.M)
    assert found and int(found.group(1)) == sandbox._MADV_HWPOISON


def test_the_trace_start_is_read_before_the_filter_only_when_tracing(monkeypatch) -> None:
    """--trace's timeline needs the process start from /proc/self/stat,
    which the filter would refuse later: read before it, only with --trace
    and only when the native launcher did not say it."""
    from pyvmm.common import trace
    from pyvmm.host import sandbox

    monkeypatch.setattr(trace, "_stat_start_ns", 0)
    monkeypatch.setattr(trace, "start_ns", 0)
    monkeypatch.setattr(trace, "enabled", False)
    sandbox._before_the_filter()
    assert trace._stat_start_ns == 0
    monkeypatch.setattr(trace, "enabled", True)
    sandbox._before_the_filter()
    assert trace._stat_start_ns > 0
    monkeypatch.setattr(trace, "_stat_start_ns", 0)
    monkeypatch.setattr(trace, "start_ns", 1)
    sandbox._before_the_filter()
    assert trace._stat_start_ns == 0


def test_a_user_switch_the_kernel_refuses_is_one_line() -> None:
    """--user when the switch fails (here: a child that already gave up
    root asks for root back) is a HostError with the reason, no traceback."""
    from pyvmm.common.errors import HostError
    from pyvmm.host.sandbox import drop_privileges

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                drop_privileges("root")
            except HostError as err:
                os.write(write, str(err).encode())
                code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert said == "--user=root: cannot switch user: Operation not permitted"


def test_a_program_that_cannot_be_bound_is_one_line_with_the_reason() -> None:
    from pyvmm.common.errors import HostError
    from pyvmm.host import sandbox

    with pytest.raises(HostError) as caught:
        sandbox.bound(vm_fd=-1, vcpu_fd=-1)
    assert str(caught.value) == (
        "cannot install the sandbox (seccomp): Bad file descriptor (--no-sandbox runs without)"
    )


def test_the_filter_lets_the_two_terminal_queries_through_on_any_fd() -> None:
    """isatty's TCGETS and --stats=live's TIOCGWINSZ pass the loaded filter
    on any descriptor (here a pty made before it); another request there
    is refused. In a child: a filter cannot be taken off."""
    import fcntl
    import termios

    main, tty = os.openpty()
    try:
        said = _filtered(
            [
                lambda r=r: fcntl.ioctl(tty, r, bytes(64))
                for r in (termios.TCGETS, termios.TIOCGWINSZ, termios.FIONREAD)
            ]
        )
    finally:
        os.close(main)
        os.close(tty)
    assert said == ["ok", "ok", "EPERM"]


def _filtered(attempts) -> list[str]:
    """Each attempt's outcome ("ok" or its errno's name) in a forked child
    under the loaded filter (a filter cannot be taken off)."""
    from pyvmm.host import sandbox

    prog = sandbox.bound(vm_fd=0, vcpu_fd=0)

    def action() -> str:
        if lib.pyvmm_sandbox_load(ffi.from_buffer(prog), len(prog)) != 0:
            return "load-failed"
        said = ""
        for attempt in attempts:
            try:
                attempt()
                said += "ok "
            except OSError as err:
                said += errno.errorcode[err.errno] + " "
        return said

    return answer_in_fork(action).split()


def test_the_filter_refuses_executable_memory_of_any_length() -> None:
    """mprotect to PROT_EXEC is refused whatever the length; without
    PROT_EXEC it passes (Python and glibc change protections all the time)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    area = mmap.mmap(-1, 3 * mmap.PAGESIZE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(area))

    def protect(length: int, prot: int):
        def attempt() -> None:
            if libc.mprotect(address, length, prot) < 0:
                raise OSError(ctypes.get_errno(), "mprotect")

        return attempt

    rw, rx = mmap.PROT_READ | mmap.PROT_WRITE, mmap.PROT_READ | mmap.PROT_EXEC
    said = _filtered([protect(n * mmap.PAGESIZE, prot) for prot in (rx, rw) for n in (1, 3)])
    assert said == ["EPERM", "EPERM", "ok", "ok"]


def test_the_program_binds_to_pid_1() -> None:
    """pid 1 is a real pid to bind (pyvmm as a container's first process,
    in its own pid namespace); 0 and below are not."""
    from pyvmm.host import sandbox

    compiled = sandbox.program(kill=False)
    for pid, expected in ((1, 0), (0, -errno.EBADF), (-1, -errno.EBADF)):
        buf = ffi.new("char[]", compiled)
        assert lib.pyvmm_sandbox_bind(buf, len(compiled), pid, 5, 6) == expected, pid


@pytest.mark.parametrize("missing", [0, 1, 2])
def test_a_program_without_one_of_the_placeholders_is_not_bound(missing: int) -> None:
    """Each of the three (pid, VM fd, vCPU fd) must be there to bind: a
    program lacking one is not pyvmm_sandbox_build's, and nothing of it is
    written. Here the compiled program with one placeholder's compares
    turned to another constant."""
    import struct

    from pyvmm.host import sandbox

    placeholder = 0x7E5A0001 + missing
    insns = []
    for code, jt, jf, k in struct.iter_unpack("<HBBI", sandbox.program(kill=False)):
        insns.append((code, jt, jf, 12345 if code == 0x15 and k == placeholder else k))
    lacking = b"".join(struct.pack("<HBBI", *insn) for insn in insns)
    buf = ffi.new("char[]", lacking)
    assert lib.pyvmm_sandbox_bind(buf, len(lacking), os.getpid(), 5, 6) == -errno.EINVAL
    assert ffi.buffer(buf, len(lacking))[:] == lacking


def test_the_filter_allows_the_fd_flag_queries_and_plain_mappings() -> None:
    """fcntl's F_GETFD, F_SETFD, F_GETFL and F_SETFL (without O_ASYNC), and
    mmap without PROT_EXEC, pass the loaded filter; mmap with it does not."""
    import fcntl
    import mmap

    read, write = os.pipe()
    flags = fcntl.fcntl(write, fcntl.F_GETFL)
    try:
        said = _filtered(
            [
                lambda: fcntl.fcntl(write, fcntl.F_GETFD),
                lambda: fcntl.fcntl(write, fcntl.F_SETFD, fcntl.FD_CLOEXEC),
                lambda: fcntl.fcntl(write, fcntl.F_GETFL),
                lambda: fcntl.fcntl(write, fcntl.F_SETFL, flags | os.O_NONBLOCK),
                lambda: mmap.mmap(-1, mmap.PAGESIZE).close(),
                lambda: mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_EXEC),
            ]
        )
    finally:
        os.close(read)
        os.close(write)
    assert said == ["ok", "ok", "ok", "ok", "ok", "EPERM"]


def test_a_program_of_a_length_no_instruction_multiple_is_not_loaded() -> None:
    """pyvmm_sandbox_load refuses a length that is not whole instructions
    (it would load the program cut short). In a child, in case it loads."""
    from pyvmm.host import sandbox

    prog = bytearray(sandbox.bound(vm_fd=0, vcpu_fd=0)) + b"\0" * 3
    pid = os.fork()
    if pid == 0:
        try:
            got = lib.pyvmm_sandbox_load(ffi.from_buffer(prog), len(prog))
        finally:
            os._exit(0 if got == -errno.EINVAL else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_forgetting_a_few_bytes_zeroes_them_and_no_more() -> None:
    """pyvmm_sandbox_forget within one or two pages zeroes the bytes (a
    launcher child forgets other VMs' small objects that way)."""
    import mmap

    area = mmap.mmap(-1, 2 * mmap.PAGESIZE)
    area[:] = b"\xaa" * len(area)
    start = ffi.cast("uintptr_t", ffi.from_buffer(area))
    at = mmap.PAGESIZE - 50
    assert lib.pyvmm_sandbox_forget(int(start) + at, 100, 0) == 0
    assert area[at : at + 100] == bytes(100)
    assert area[at - 1] == area[at + 100] == 0xAA


def test_forgetting_whole_pages_succeeds_whatever_errno_held() -> None:
    """Pages given back (madvise) and the bytes around them zeroed: 0,
    not a stale errno from an earlier call read as this one's failure."""
    import mmap

    # Private, as the heap it is used on: a shared mapping keeps its pages.
    area = mmap.mmap(-1, 4 * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area[:] = b"\xaa" * len(area)
    start = int(ffi.cast("uintptr_t", ffi.from_buffer(area)))
    at, length = 100, 3 * mmap.PAGESIZE
    ffi.errno = errno.EIO
    assert lib.pyvmm_sandbox_forget(start + at, length, 0) == 0
    assert area[at : at + length] == bytes(length)
    assert area[at - 1] == area[at + length] == 0xAA


@pytest.mark.parametrize(
    "text, ids", [("4294967294:0", (4294967294, 0)), ("0:4294967294", (0, 4294967294))]
)
def test_the_largest_id_is_a_user_or_a_group(text, ids) -> None:
    """MAX_ID (2**32 - 2) is an id like any other, for the user and the
    group alike; from 2**32 - 1 up it is refused (that one is (uid_t) -1,
    which setresuid and setresgid read as "leave unchanged")."""
    from pyvmm.common.errors import HostError
    from pyvmm.common.values import MAX_ID
    from pyvmm.host.sandbox import resolve_user

    assert MAX_ID == 2**32 - 2
    assert resolve_user(text) == (*ids, None)
    past = text.replace("4294967294", "4294967295")
    with pytest.raises(HostError, match=f"^--user={past}: an id is at most {MAX_ID}$"):
        resolve_user(past)
