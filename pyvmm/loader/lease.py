"""A read lease on an image file: what keeps the pages pyvmm maps from it
the file's only while nobody can write it (csrc/imagelease.h).

The lease cannot be taken while anyone has the file open for writing, and
once taken, anyone who opens the file for writing or truncates it waits
until this process has copied every range it mapped under the lease into
anonymous memory; only then is the writer let through. So a mapped image
is one nobody could write since it was checked, and whoever writes it
later changes nothing the guest sees. Where no lease can be had (someone
writes the file, pyvmm is neither its owner nor has CAP_LEASE, the file
system has no leases), the image is copied instead (sharing.py).
"""

import errno
import os

from pyvmm._native import ffi, lib

HELD = lib.PYVMM_LEASE_HELD
COPIED = lib.PYVMM_LEASE_COPIED
LOST = lib.PYVMM_LEASE_LOST
CLOSED = lib.PYVMM_LEASE_CLOSED
BROKEN = -lib.PYVMM_LEASE_BROKEN  # a mapping refused: a writer came first

_WHY = {
    errno.EAGAIN: "open for writing by another process",
    errno.EACCES: "pyvmm can take no lease on it (not its owner, no CAP_LEASE)",
    errno.EPERM: "pyvmm can take no lease on it (not its owner, no CAP_LEASE)",
    errno.EINVAL: "its file system takes no leases",
    errno.ENOLCK: "its file system takes no leases",
    errno.ENOSPC: "too many image leases in this process",
}


class ImageLease:
    """One read lease on one file, taken by this process, and released when
    nothing refers to it any more (the loader's view of the file and the
    guest memory mapped under it each hold it)."""

    def __init__(self, slot: int, path: str) -> None:
        self.slot = slot
        self.path = path
        self.pid = os.getpid()  # a forked child's copy is not a lease of its own

    @classmethod
    def take(cls, path: str, fd: int) -> "ImageLease | str":
        """A lease on the file open as ``fd``, or why there is none. The
        lease gets a descriptor of its own (closing it ends the lease),
        opened by ``path`` and checked to be the same file."""
        try:
            own = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as e:
            return f"cannot open it again for its lease ({e.strerror})"
        mine, theirs = os.fstat(own), os.fstat(fd)
        if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
            os.close(own)
            return "it was replaced while pyvmm read it"
        slot = lib.pyvmm_lease_take(own)
        if slot < 0:
            os.close(own)
            return _WHY.get(-slot, f"no lease on it ({os.strerror(-slot)})")
        return cls(slot, path)

    @property
    def ours(self) -> bool:
        return self.pid == os.getpid()

    @property
    def state(self) -> int:
        """HELD, COPIED (a writer came and was let through after the copy),
        LOST (a range could not be copied) or CLOSED."""
        return lib.pyvmm_lease_state(self.slot) if self.ours else CLOSED

    def view(self, fd: int, size: int) -> memoryview | None:
        """The whole file, ``size`` bytes of ``fd``, as a read-only view
        mapped under this lease (None once a writer came): no private copy
        of the image beside the shared pages. Unmapped once nothing refers
        to the view any more."""
        addr = lib.pyvmm_lease_map_view(self.slot, size, fd) if self.ours else BROKEN
        if addr < 0:
            return None

        def unmap(_: object, lease: ImageLease = self) -> None:
            # ``lease``: the view keeps the lease as long as it lives.
            lib.pyvmm_lease_forget(addr, size)
            lib.pyvmm_unmap(addr, size)

        ptr = ffi.gc(ffi.cast("uint8_t *", addr), unmap, size)
        return memoryview(ffi.buffer(ptr, size)).toreadonly()

    def release(self) -> None:
        if self.ours:
            lib.pyvmm_lease_release(self.slot)
        self.pid = -1

    def __del__(self) -> None:
        self.release()
