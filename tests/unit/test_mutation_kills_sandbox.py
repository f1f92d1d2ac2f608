"""Edges of the seccomp filter's builder (csrc/sandbox.c) that the mutation
run found untested: a program larger than the caller's buffer is -ENOSPC,
not a silent empty filter, and building leaves no descriptor behind."""

from __future__ import annotations

import errno
import os

from pyvmm._native import ffi, lib
from pyvmm.sandbox import ALLOW


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
