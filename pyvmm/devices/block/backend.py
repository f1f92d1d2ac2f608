"""File-backed block device for the hvt block_read / block_write hypercalls.

The guest sees a disk of ``capacity`` bytes that it reads and writes in whole
blocks; the host side is one regular file or block device (a loop or LVM
volume, as solo5-hvt allows).  Positional I/O (``preadv`` /
``pwritev``) keeps no shared file offset, so requests may come from any
thread, and it moves data straight between the file and guest memory.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable
from typing import Any

from pyvmm.common.errors import DeviceError
from pyvmm.common.fd import OwnedFd
from pyvmm.loader import BlockAttachment

#: The manifest carries ``block_size`` in a u16, so 32 KiB is the largest
#: power of two a guest can be told about.
MAX_BLOCK_SIZE = 1 << 15
MIN_BLOCK_SIZE = 512
#: What a guest gets without --block-sector-size (solo5-hvt's default).
DEFAULT_BLOCK_SIZE = 512


class BlockDevice(OwnedFd):
    """One disk image opened read-write; ``capacity`` is fixed at open time."""

    def __init__(
        self, name: str, path: str, fd: int, capacity: int, block_size: int, handle: int = -1
    ) -> None:
        self.name = name
        self.handle = handle
        self.path = path
        self.capacity = capacity
        self.block_size = block_size
        self.fd = fd

    @classmethod
    def open(
        cls,
        name: str,
        path: str,
        block_size: int = DEFAULT_BLOCK_SIZE,
        handle: int = -1,
        *,
        lock: bool = True,
    ) -> BlockDevice:
        """Open ``path`` as the backing file of manifest device ``name``.

        Every check happens here, before the guest starts, so a bad image is
        a one-line start-up error rather than a failed hypercall later. With
        ``lock`` the image gets an exclusive advisory lock (flock) for the
        run, so two pyvmm processes never write one image at once.

        ``"@N"`` adopts descriptor N, already open read-write (a caller
        that opened the file itself, as pyvmm-oci does, leaves no window
        between its checks and pyvmm's open); if this raises, N stays open.
        """

        def fail(cause: str) -> DeviceError:
            return DeviceError(f"block device '{name}': {cause}")

        if (
            isinstance(block_size, bool)
            or not isinstance(block_size, int)
            or block_size < MIN_BLOCK_SIZE
            or block_size > MAX_BLOCK_SIZE
            or block_size & (block_size - 1)
        ):
            raise fail(block_size_problem(block_size))
        adopted = path.startswith("@")
        if adopted:
            fd = _adopt(path, fail)
        else:
            try:
                # Refuse anything else before open(): opening a FIFO or a
                # character device can block or have side effects.
                if not _is_disk(os.stat(path).st_mode):
                    raise fail(f"{path} is not a regular file or block device")
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as err:
                raise fail(f"Could not open block device: {path}: {_reason(err)}") from None
        try:
            st = os.fstat(fd)
            # The path may have been replaced between stat() and open().
            if not _is_disk(st.st_mode):
                raise fail(f"{path} is not a regular file or block device")
            # A block device's st_size is 0: its end is where its size is.
            size = st.st_size if stat.S_ISREG(st.st_mode) else os.lseek(fd, 0, os.SEEK_END)
            if size == 0:
                raise fail(
                    f"Backing storage must be at least 1 block ({block_size} bytes) "
                    f"in size: {path} is empty"
                )
            if size % block_size:
                raise fail(
                    f"Backing storage size must be block aligned ({block_size} bytes): "
                    f"{path} is {size} bytes, not a multiple of the block size"
                )
            if lock:
                _lock(fd, path, fail)
        except BaseException:
            if not adopted:
                os.close(fd)
            raise
        if adopted:
            os.set_inheritable(fd, False)
        return cls(name, path, fd, size, block_size, handle)

    def attachment(self) -> BlockAttachment:
        return BlockAttachment(capacity=self.capacity, block_size=self.block_size)

    def poll_fd(self) -> None:
        return None  # disks are always ready

    def counters(self) -> dict[str, int]:
        return {}

    def valid(self, offset: int, length: int) -> bool:
        """Whether a guest request covers whole blocks inside the disk.

        The hvt ABI answers anything else with EINVAL, so the handler asks
        this before touching the file.
        """
        bs = self.block_size
        return (
            offset >= 0
            and length > 0
            and offset % bs == 0
            and length % bs == 0
            and offset + length <= self.capacity
        )

    def read_into(self, offset: int, buf: Any) -> None:
        """Fill all of ``buf`` (any writable buffer) from the disk at ``offset``.

        Raises OSError on an I/O error or if the file shrank under us.
        """
        self._transfer(os.preadv, offset, buf, "unexpected end of file in")

    def write_from(self, offset: int, buf: Any) -> None:
        """Write all of ``buf`` (any readable buffer) to the disk at ``offset``.

        Raises OSError on an I/O error (ENOSPC on a sparse image, EIO, ...).
        """
        self._transfer(os.pwritev, offset, buf, "no progress writing")

    def _transfer(self, io: Callable[..., int], offset: int, buf: Any, stalled: str) -> None:
        """All of ``buf`` through ``io`` (os.preadv or os.pwritev), resuming
        after short transfers; EIO ("<stalled> <path>") if one moves nothing."""
        view = _bytes_view(buf)
        self._check(offset, len(view))
        done = 0
        while done < len(view):
            n = io(self.fd, [view[done:]], offset + done)
            if n == 0:
                raise OSError(errno.EIO, f"{stalled} {self.path}")
            done += n

    def __repr__(self) -> str:
        return (
            f"BlockDevice(name={self.name!r}, path={self.path!r}, "
            f"capacity={self.capacity}, block_size={self.block_size})"
        )

    def _check(self, offset: int, length: int) -> None:
        # A request past the end would silently grow the image file; the
        # handler must have called valid(), this only catches host bugs.
        if not self.valid(offset, length):
            raise ValueError(
                f"block device '{self.name}': request offset={offset} length={length} "
                f"is not whole blocks inside {self.capacity} bytes"
            )


def _bytes_view(buf: Any) -> memoryview:
    """A flat byte view of ``buf`` so slicing counts bytes, not items."""
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def block_size_problem(block_size: object) -> str:
    """solo5-hvt's words for a bad --block-sector-size, and pyvmm's rule."""
    return (
        "Block size must be a multiple of 2 greater than or equal 512 "
        f"({block_size!r} is not a power of two between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE})"
    )


def _lock(fd: int, path: str, fail) -> None:
    """An exclusive flock on the image, or one line naming who holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(os.fstat(fd))
        raise fail(
            f"{path} is locked by another process{holder} "
            "(pyvmm locks a disk image while a guest uses it; --no-lock attaches it anyway)"
        ) from None
    except OSError as err:  # a file system without flock (some network ones)
        raise fail(f"cannot lock {path}: {_reason(err)} (--no-lock attaches it anyway)") from None


def _lock_holder(st: os.stat_result) -> str:
    """ " (NAME, pid N)" for the flock holder of the file, from /proc/locks."""
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
                    pid = fields[4]
                    try:
                        with open(f"/proc/{pid}/comm") as comm:
                            return f" ({comm.read().strip()}, pid {pid})"
                    except OSError:
                        return f" (pid {pid})"
    except OSError:
        pass
    return ""


def _adopt(text: str, fail) -> int:
    """The descriptor ``@N`` names, if it is a disk open read-write."""
    digits = text[1:]
    if not digits.isascii() or not digits.isdecimal() or len(digits) > 10 or int(digits) >= 1 << 31:
        raise fail(f"'{digits}' is not a file descriptor number")
    fd = int(digits)
    try:
        mode = os.fstat(fd).st_mode
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError as err:
        raise fail(f"fd {fd} is not open ({_reason(err)})") from None
    if not _is_disk(mode):
        raise fail(f"fd {fd} is not a regular file or block device")
    if flags & os.O_ACCMODE != os.O_RDWR:
        raise fail(f"fd {fd} is not open for reading and writing")
    return fd


def _reason(err: OSError) -> str:
    return err.strerror or os.strerror(err.errno or errno.EIO)


def _is_disk(mode: int) -> bool:
    return stat.S_ISREG(mode) or stat.S_ISBLK(mode)
