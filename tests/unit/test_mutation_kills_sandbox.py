"""Edges of the seccomp filter's builder (csrc/sandbox.c) that the mutation
run found untested: a program larger than the caller's buffer is -ENOSPC,
not a silent empty filter, building leaves no descriptor behind, and the
self-test calls the syscalls by their numbers in the kernel headers."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from pyvmm._native import ffi, lib
from pyvmm.host.sandbox import _SYSCALLS, ALLOW


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
