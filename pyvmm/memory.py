"""Guest memory: one anonymous mapping, every access by guest address checked.

Nothing else in pyvmm touches the raw mapping. Every hypercall handler reads
its arguments through ``GuestMemory``, so "is every guest pointer checked?"
has one answer: here. Pages the loader made read-only (the guest's text and
rodata) are refused for host writes too, because the host mapping itself is
read-only there and a write through it would kill the host process.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from pyvmm._native import ffi, lib
from pyvmm.errors import GuestFault, HostError

PAGE_SIZE = 4096
MIB = 1 << 20


@dataclass(frozen=True)
class Protection:
    """Host-side access rights of a guest page range (mirrors ELF p_flags)."""

    read: bool = True
    write: bool = True
    execute: bool = False

    @property
    def native(self) -> int:
        return (
            (lib.PYVMM_PROT_READ if self.read else 0)
            | (lib.PYVMM_PROT_WRITE if self.write else 0)
            | (lib.PYVMM_PROT_EXEC if self.execute else 0)
        )


class GuestMemory:
    """``size`` bytes of guest-physical memory starting at GPA 0."""

    def __init__(self, size: int) -> None:
        if size <= 0 or size % PAGE_SIZE:
            raise ValueError(f"guest memory size {size:#x} is not a positive page multiple")
        addr = lib.pyvmm_map_anonymous(size)
        if addr < 0:
            raise HostError(f"cannot map {size // MIB} MiB of guest memory: {_strerror(-addr)}")
        self.size = size
        self.host_addr: int = addr
        self._base = ffi.cast("uint8_t *", addr)
        # Sorted, non-overlapping [start, end) ranges the host must not write.
        self._ro_starts: list[int] = []
        self._ro_ends: list[int] = []

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        if self.host_addr:
            lib.pyvmm_unmap(self.host_addr, self.size)
            self.host_addr = 0
            self._base = ffi.NULL

    def __enter__(self) -> GuestMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checks -----------------------------------------------------------
    def check(self, gpa: int, length: int, *, write: bool = False, what: str = "access") -> None:
        """Raise GuestFault unless [gpa, gpa+length) is guest memory (and writable)."""
        if gpa < 0 or length < 0 or gpa + length > self.size or gpa + length < gpa:
            raise GuestFault(
                f"guest fault: bad pointer in {what}: {gpa:#x}+{length:#x} is outside "
                f"guest memory (size {self.size:#x})"
            )
        if write and length and self.is_read_only(gpa, gpa + length):
            raise GuestFault(
                f"guest fault: bad pointer in {what}: {gpa:#x}+{length:#x} is read-only memory"
            )

    def is_read_only(self, start: int, end: int) -> bool:
        """Whether any byte of [start, end) was protected read-only."""
        i = bisect.bisect_right(self._ro_starts, start) - 1
        if i >= 0 and self._ro_ends[i] > start:
            return True
        j = i + 1
        return j < len(self._ro_starts) and self._ro_starts[j] < end

    def read_only_ranges(self) -> list[tuple[int, int]]:
        """The sorted [start, end) ranges the host must not write."""
        return list(zip(self._ro_starts, self._ro_ends, strict=True))

    # -- access -----------------------------------------------------------
    def struct(self, ctype: str, gpa: int, *, what: str = "access"):
        """A cffi pointer to a ``ctype`` struct at ``gpa``, checked and writable."""
        self.check(gpa, ffi.sizeof(ctype), write=True, what=what)
        return ffi.cast(ctype + " *", self._base + gpa)

    def pointer(self, gpa: int, length: int, *, write: bool = True, what: str = "access"):
        """A raw ``void *`` to [gpa, gpa+length), for C code (the IO thread).

        ``write=False`` is for C code that only makes the kernel write there
        (read(2) into a read-only page fails with EFAULT, harmlessly).
        """
        self.check(gpa, length, write=write, what=what)
        return ffi.cast("void *", self._base + gpa)

    def buffer(self, gpa: int, length: int, *, write: bool = False, what: str = "access"):
        """A zero-copy buffer over guest memory (for os.write, readv, preadv)."""
        self.check(gpa, length, write=write, what=what)
        return ffi.buffer(self._base + gpa, length)

    def read(self, gpa: int, length: int, *, what: str = "read") -> bytes:
        return bytes(self.buffer(gpa, length, what=what))

    def write(self, gpa: int, data: bytes, *, what: str = "write") -> None:
        self.buffer(gpa, len(data), write=True, what=what)[:] = data

    def read_cstring(self, gpa: int, limit: int, *, what: str = "string") -> bytes:
        """The NUL-terminated bytes at gpa, reading at most ``limit`` bytes."""
        limit = max(0, min(limit, self.size - gpa)) if 0 <= gpa < self.size else 0
        self.check(gpa, max(limit, 1), what=what)
        raw = self.read(gpa, limit)
        nul = raw.find(b"\0")
        return raw if nul < 0 else raw[:nul]

    # -- protection -------------------------------------------------------
    def protect(self, gpa: int, length: int, prot: Protection) -> None:
        """Set host (and so guest) access rights of whole pages."""
        if gpa % PAGE_SIZE or length % PAGE_SIZE:
            raise ValueError("protect() takes whole pages")
        self.check(gpa, length, what="protect")
        err = lib.pyvmm_protect(self.host_addr + gpa, length, prot.native)
        if err:
            raise HostError(f"mprotect of guest memory failed: {_strerror(-err)}")
        if not prot.write:
            self._add_read_only(gpa, gpa + length)

    def _add_read_only(self, start: int, end: int) -> None:
        ranges = list(zip(self._ro_starts, self._ro_ends, strict=True)) + [(start, end)]
        ranges.sort()
        merged: list[tuple[int, int]] = []
        for s, e in ranges:
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        self._ro_starts = [s for s, _ in merged]
        self._ro_ends = [e for _, e in merged]


def _strerror(err: int) -> str:
    import os

    return os.strerror(err)
