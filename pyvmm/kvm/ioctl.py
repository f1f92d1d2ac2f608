"""The one place pyvmm issues ioctls: result or a ``KvmError`` naming the call."""

from __future__ import annotations

import os

from pyvmm._native import ffi, lib
from pyvmm.common.errors import HostError


class KvmError(HostError):
    """A KVM ioctl failed; ``errno`` is kept for callers that expect some."""

    def __init__(self, call: str, errno: int) -> None:
        super().__init__(f"{call} failed: {os.strerror(errno)}")
        self.errno = errno


def ioctl(fd: int, request: int, arg: object = 0, *, call: str = "ioctl") -> int:
    """Issue ioctl(fd, request, arg); ``arg`` is an int or a cffi pointer."""
    if isinstance(arg, int):
        ret = lib.pyvmm_ioctl_val(fd, request, arg)
    else:
        ret = lib.pyvmm_ioctl_ptr(fd, request, ffi.cast("void *", arg))
    if ret < 0:
        raise KvmError(call, -ret)
    return ret
