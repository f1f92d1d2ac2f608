"""Network namespaces for the calling thread.

setns(2) moves only the calling thread, so entering a namespace is a
``with`` block that always moves the thread back: the tap lookup
(devices/net/tap.py), pyvmm-oci's CNI plumbing (oci/network.py) and the
test kit (testkit/netns.py) all go through this one module.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from pyvmm._native import lib

CLONE_NEWNET = 0x40000000  # <sched.h>
# This thread's own namespace, as a path to open.
THREAD_NETNS = "/proc/thread-self/ns/net"


def _check(err: int, call: str) -> None:
    if err:
        raise OSError(-err, f"{call}: {os.strerror(-err)}")


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace open at ``fd``."""
    _check(lib.pyvmm_setns(fd, CLONE_NEWNET), "setns")


def unshare() -> None:
    """Move this process into a new, empty network namespace."""
    _check(lib.pyvmm_unshare(CLONE_NEWNET), "unshare")


@contextlib.contextmanager
def inside(fd: int) -> Iterator[None]:
    """The ``with`` body runs with this thread in the namespace open at
    ``fd``; the thread moves back even if the body raises. Sockets and tap
    fds opened in the body stay bound to the namespace afterwards."""
    home = os.open(THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(fd)
        try:
            yield
        finally:
            setns(home)
    finally:
        os.close(home)


@contextlib.contextmanager
def inside_path(path: str) -> Iterator[None]:
    """As ``inside``, for the namespace named by a path (/run/netns/NAME,
    /proc/PID/ns/net)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with inside(fd):
            yield
    finally:
        os.close(fd)
