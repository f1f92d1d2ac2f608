"""Files an image names, opened inside its rootfs and nowhere else.

An image is its author's: every file, link and device node in its layers
is. So each path pyvmm-oci takes from an image (the unikernel, the
metadata files, a block device's file) is resolved with the rootfs as
``/``, the way chroot would: an absolute link starts again at the rootfs,
``..`` stops there, and a link into /proc is not followed. Only a regular
file is accepted: a device node, a FIFO or a socket that an image carries
is refused before anything opens it for reading or writing. The caller
gets an open descriptor, and pyvmm is handed that descriptor, not a path,
so nothing can be swapped in between the check and the use.

The walk is openat2(2) with RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
(Linux 5.6). Where the kernel lacks it, the same walk is done here one
component at a time on O_PATH | O_NOFOLLOW descriptors, each link read
and its text resolved again from the rootfs, never by the kernel.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
from collections import deque

SYS_OPENAT2 = 437  # the same number on every architecture (the unified table)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
MAX_LINKS = 40  # the kernel's own limit on links in one walk
RETRIES = 8  # openat2 answers EAGAIN when a rename raced the walk
FIRST_FD = 3  # never 0-2: the container's process puts its stdio there


class NotInRootfs(Exception):
    """The path names no regular file inside the rootfs (one line)."""


class Missing(NotInRootfs):
    """Nothing there, as far as the rootfs goes (also a link out of it)."""

    def __init__(self) -> None:
        super().__init__("is not a file in the rootfs")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
#: Whether the kernel has openat2; cleared at the first ENOSYS (and by
#: tests, to run the descriptor walk on a kernel that has it).
use_openat2 = True


def _openat2(root_fd: int, path: str) -> int:
    """An O_PATH descriptor of ``path`` resolved in ``root_fd``, by the kernel."""
    how = _OpenHow(flags=os.O_PATH | os.O_CLOEXEC, resolve=RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    raw = os.fsencode(path)
    for _ in range(RETRIES):
        fd = _libc.syscall(
            ctypes.c_long(SYS_OPENAT2),
            ctypes.c_int(root_fd),
            ctypes.c_char_p(raw),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err))
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


def _walk(root_fd: int, path: str) -> int:
    """The same resolution as ``_openat2``, one O_PATH | O_NOFOLLOW step at
    a time: ``..`` pops a descriptor this walk holds (never above the
    root), a link's text is put back in front of what is left (from the
    root if it is absolute)."""
    todo = deque(_parts(path))
    dirs: list[int] = []  # the descriptors below the root, innermost last
    links = 0
    try:
        while todo:
            name = todo.popleft()
            if name == "..":
                if dirs:
                    os.close(dirs.pop())
                continue
            here = dirs[-1] if dirs else root_fd
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here)
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                try:
                    target = os.readlink("", dir_fd=fd)
                finally:
                    os.close(fd)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                if target.startswith("/"):
                    while dirs:
                        os.close(dirs.pop())
                todo.extendleft(reversed(_parts(target)))
            elif todo:
                if not stat.S_ISDIR(mode):
                    os.close(fd)
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
                dirs.append(fd)
            else:
                return fd
        return os.dup(dirs[-1] if dirs else root_fd)  # the path names a directory
    finally:
        for fd in dirs:
            os.close(fd)


def _resolve(root_fd: int, path: str) -> int:
    global use_openat2
    if use_openat2:
        try:
            return _openat2(root_fd, path)
        except OSError as err:
            if err.errno != errno.ENOSYS:
                raise
            use_openat2 = False
    return _walk(root_fd, path)


def _above_stdio(fd: int) -> int:
    if fd >= FIRST_FD:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, FIRST_FD)
    finally:
        os.close(fd)


def _kind(mode: int) -> str | None:
    """Why a file of this mode is refused, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
        return "is a device node (an image may name regular files only)"
    return "is not a regular file"


def reopen(path_fd: int, flags: int) -> int:
    """The file an O_PATH descriptor holds, opened for ``flags``: the same
    inode, whatever happened to its name since."""
    fd = os.open(f"/proc/self/fd/{path_fd}", flags | os.O_CLOEXEC | os.O_NOCTTY)
    return _above_stdio(fd)


def open_root(rootfs: str) -> int:
    """The rootfs directory itself (a path the runtime's caller chose)."""
    return os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def open_file(root_fd: int, path: str, *, write: bool = False) -> int:
    """``path`` (as the image names it) opened read-only, or read-write,
    inside the rootfs ``root_fd``; NotInRootfs when it is no regular file
    there. The message is about the rootfs only: a name that is missing,
    a link loop and a link that pointed out of the rootfs read alike."""
    if "\0" in path:  # no file has such a name (and C would read up to the NUL)
        raise Missing()
    try:
        path_fd = _resolve(root_fd, path)
    except OSError:
        raise Missing() from None
    try:
        why = _kind(os.fstat(path_fd).st_mode)
        if why is not None:
            raise NotInRootfs(why)
        try:
            return reopen(path_fd, os.O_RDWR if write else os.O_RDONLY)
        except OSError as err:
            mode = "read-write" if write else "for reading"
            raise NotInRootfs(f"cannot be opened {mode}: {err.strerror}") from None
    finally:
        os.close(path_fd)


def read_file(root_fd: int, path: str, limit: int) -> bytes | None:
    """The bytes of ``path`` in the rootfs, None if it is not there at all;
    NotInRootfs if it is something else than a regular file or larger
    than ``limit``."""
    try:
        fd = open_file(root_fd, path)
    except Missing:
        return None
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotInRootfs(f"is larger than {limit} bytes")
    return data
