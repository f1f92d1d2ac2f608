"""Guest memory: one anonymous mapping, every access by guest address checked.

``GuestMemory`` owns the mapping and the one view of it that C uses too
(``view``, a ``struct pyvmm_guestmem``: csrc/guestmem.h): the hypercall fast
path and the IO thread's Solo5-ring service get that view, and every check
here goes through the same C accessor (``pyvmm_guestmem_at``), so the rule
is written once; this module only turns a refusal into a message.

Three kinds of access: reads (anywhere in guest memory), writes on the
guest's behalf (``struct()``, ``buffer(write=True)``, ``check(write=True)``,
``pointer()``: refused in the low area [0, PYVMM_LOW_AREA_END), where the
boot info and the page tables live, and in the ranges the loader made
read-only) and the host's own set-up writes (``write()``,
``struct(setup=True)``: refused only where the host mapping is read-only,
since a write there would kill pyvmm). A guest-supplied address never goes
to a set-up write.

Guest memory may be mapped from a file (an image's read-only pages, a
restored snapshot's whole memory), and such a page can be gone, its file
truncated (csrc/guestmem.h). Every copy here that touches guest memory
(``read()``, ``store()``, a ``GuestStruct``'s fields, and ``write()``,
whose source may be the loader's view of the image) is guarded
(``pyvmm_copy_guarded``) and becomes a one-line error, never a SIGBUS;
``buffer()`` is for system calls, which answer EFAULT (a copy made
through it in Python is not guarded); ``pointer()`` is for the IO
thread's rings, in anonymous memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pyvmm._native import ffi, lib
from pyvmm.common.errors import GuestFault, HostError
from pyvmm.common.record import Record
from pyvmm.common.sizes import MIB, PAGE_SIZE

__all__ = ["MIB", "PAGE_SIZE", "GuestMemory", "Protection"]

_U64_LIMIT = 1 << 64


class PagesGone(HostError):
    """A set-up copy's source pages are gone (their file was truncated)."""


class Protection(Record):
    """Host-side access rights of a guest page range (mirrors ELF p_flags)."""

    __slots__ = ("read", "write", "execute")

    def __init__(self, read: bool = True, write: bool = True, execute: bool = False) -> None:
        self.read = read
        self.write = write
        self.execute = execute

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
        # The view C code checks against (csrc/guestmem.h); it lives as long
        # as this object, and so does every range array it ever pointed at.
        self.view = ffi.new("struct pyvmm_guestmem *")
        self.view.host = addr
        self.view.size = size
        self.view.low_end = lib.PYVMM_LOW_AREA_END
        # Sorted, non-overlapping [start, end) ranges mapped read-only.
        self._ro: list[tuple[int, int]] = []
        self._ro_arrays: list[object] = []
        self._on_close: list[Callable[[], None]] = []
        # map_file's (gpa, length, file offset, a descriptor of the file).
        self._file_ranges: list[tuple[int, int, int, int]] = []

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        if self.host_addr:
            self.view.host = 0  # every access refused from now on
            # No image lease may copy into these addresses once unmapped.
            lib.pyvmm_lease_forget(self.host_addr, self.size)
            lib.pyvmm_unmap(self.host_addr, self.size)
            self.host_addr = 0
            for *_, fd in self._file_ranges:
                os.close(fd)
            self._file_ranges = []
            callbacks, self._on_close = self._on_close, []
            for callback in callbacks:
                callback()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once this memory is unmapped (what was mapped
        into it reports, and lets go of what it held)."""
        self._on_close.append(callback)

    def __enter__(self) -> GuestMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checks -----------------------------------------------------------
    def _at(self, gpa: int, length: int, access: int):
        """pyvmm_guestmem_at, for any Python integers."""
        if not (0 <= gpa < _U64_LIMIT and 0 <= length < _U64_LIMIT):
            return ffi.NULL
        return lib.pyvmm_guestmem_at(self.view, gpa, length, access)

    def _checked(self, gpa: int, length: int, access: int, what: str):
        """The host address of [gpa, gpa+length), or GuestFault."""
        ptr = self._at(gpa, length, access)
        if ptr != ffi.NULL:
            return ffi.cast("uint8_t *", ptr)
        if self._at(gpa, length, lib.PYVMM_GM_READ) == ffi.NULL:
            raise GuestFault(
                f"guest fault: bad pointer in {what}: {gpa:#x}+{length:#x} is outside "
                f"guest memory (size {self.size:#x})"
            )
        raise GuestFault(
            f"guest fault: bad pointer in {what}: {gpa:#x}+{length:#x} is read-only memory"
        )

    def check(self, gpa: int, length: int, *, write: bool = False, what: str = "access") -> None:
        """Raise GuestFault unless [gpa, gpa+length) is guest memory (and,
        for ``write``, memory the host may write on the guest's behalf)."""
        self._checked(gpa, length, lib.PYVMM_GM_WRITE if write else lib.PYVMM_GM_READ, what)

    def is_read_only(self, start: int, end: int) -> bool:
        """Whether any byte of [start, end), inside guest memory, is mapped read-only."""
        length = end - start
        return (
            self._at(start, length, lib.PYVMM_GM_READ) != ffi.NULL
            and self._at(start, length, lib.PYVMM_GM_SETUP) == ffi.NULL
        )

    def read_only_ranges(self) -> list[tuple[int, int]]:
        """The sorted [start, end) ranges mapped read-only."""
        return list(self._ro)

    # -- access on the guest's behalf ---------------------------------------
    def struct(self, ctype: str, gpa: int, *, what: str = "access", setup: bool = False):
        """The ``ctype`` struct at ``gpa``, which the host may write: on the
        guest's behalf (a ``GuestStruct``, every field copied guarded), or
        with ``setup`` as the host's own set-up (boot info) at an address
        pyvmm chose (a cffi pointer: set-up memory is never a file's)."""
        if setup:
            ptr = self._checked(gpa, ffi.sizeof(ctype), lib.PYVMM_GM_SETUP, what)
            return ffi.cast(ctype + " *", ptr)
        return GuestStruct(self, ctype, gpa, what)

    def request(self, ctype: str, gpa: int, *, what: str = "access"):
        """A hypercall's argument struct, read once: ``(copy, guest)``.

        ``copy`` is a private copy that the handler reads every request field
        from (the guest, or the IO thread when the struct lies in a ring area,
        may change guest memory while the handler runs; csrc/hcfast.c copies
        the same way); ``guest`` is the ``GuestStruct`` that only result
        fields are written through."""
        guest = GuestStruct(self, ctype, gpa, what)
        copy = ffi.new(ctype + " *")
        guest.copy_to(copy)
        return copy, guest

    def store(self, gpa: int, data, *, what: str = "access") -> None:
        """Write ``data`` at ``gpa`` on the guest's behalf (a trap frame),
        guarded as ``read()`` is."""
        ptr = self._checked(gpa, len(data), lib.PYVMM_GM_WRITE, what)
        if lib.pyvmm_copy_guarded(ptr, ffi.from_buffer(data), len(data)):
            raise _gone(what, gpa, len(data))

    def pointer(self, gpa: int, length: int, *, write: bool = True, what: str = "access"):
        """A raw ``void *`` to [gpa, gpa+length), for C code (the IO thread)."""
        access = lib.PYVMM_GM_WRITE if write else lib.PYVMM_GM_READ
        return ffi.cast("void *", self._checked(gpa, length, access, what))

    def buffer(self, gpa: int, length: int, *, write: bool = False, what: str = "access"):
        """A zero-copy buffer over guest memory (for os.write, readv, preadv)."""
        access = lib.PYVMM_GM_WRITE if write else lib.PYVMM_GM_READ
        return ffi.buffer(self._checked(gpa, length, access, what), length)

    def read(self, gpa: int, length: int, *, what: str = "read") -> bytes:
        """A copy of [gpa, gpa+length); a page of it that is gone (an image
        file truncated under the guest) is a GuestFault, not a SIGBUS."""
        self._checked(gpa, length, lib.PYVMM_GM_READ, what)
        out = bytearray(length)
        if lib.pyvmm_guestmem_read(self.view, ffi.from_buffer(out), gpa, length):
            raise _gone(what, gpa, length)
        return bytes(out)

    def read_cstring(self, gpa: int, limit: int, *, what: str = "string") -> bytes:
        """The NUL-terminated bytes at gpa, reading at most ``limit`` bytes."""
        limit = max(0, min(limit, self.size - gpa)) if 0 <= gpa < self.size else 0
        self.check(gpa, max(limit, 1), what=what)
        raw = self.read(gpa, limit)
        nul = raw.find(b"\0")
        return raw if nul < 0 else raw[:nul]

    # -- the host's own set-up ----------------------------------------------
    def write(self, gpa: int, data: bytes, *, what: str = "write") -> None:
        """The host's own set-up write (page tables, boot info, segments) at
        an address pyvmm chose; never for an address the guest supplied."""
        ptr = self._checked(gpa, len(data), lib.PYVMM_GM_SETUP, what)
        # ``data`` may be the loader's view of the image file.
        if lib.pyvmm_copy_guarded(ptr, ffi.from_buffer(data), len(data)):
            raise PagesGone(f"{what}: the bytes to copy are gone (their file was truncated)")

    def zero(self, gpa: int, length: int, *, what: str = "zero-fill") -> None:
        """A set-up write of ``length`` zero bytes at ``gpa`` that leaves whole
        pages non-resident (dropped, so they read as zero): a large .bss
        costs nothing until the guest touches it. Only for anonymous
        pages: a dropped page of a file mapping reads as the file again."""
        self._checked(gpa, length, lib.PYVMM_GM_SETUP, what)
        first = -(-gpa // PAGE_SIZE) * PAGE_SIZE
        last = (gpa + length) // PAGE_SIZE * PAGE_SIZE
        if last <= first:
            self.write(gpa, bytes(length), what=what)
            return
        self.write(gpa, bytes(first - gpa), what=what)
        err = lib.pyvmm_discard(self.host_addr + first, last - first)
        if err:
            raise HostError(f"madvise of guest memory failed: {_strerror(-err)}")
        self.write(last, bytes(gpa + length - last), what=what)

    def map_file(self, gpa: int, length: int, fd: int, offset: int, *, lease: int = -1) -> int:
        """Map ``length`` bytes of ``fd`` at ``offset`` privately (copy-on-write)
        over the whole pages at ``gpa``: set-up only, as ``write()``; with
        ``lease`` (a slot of csrc/imagelease.h), under that image lease.

        Returns 0, or the errno of a mapping the kernel refused, the range
        then being zero-filled anonymous memory again (the caller copies
        instead), or PYVMM_LEASE_BROKEN when the lease broke first (nothing
        mapped). Guest writes, host set-up writes and protections work
        on the result as on anonymous memory; only unwritten pages stay
        shared with the page cache (docs/architecture.md).
        """
        if gpa % PAGE_SIZE or length % PAGE_SIZE or offset % PAGE_SIZE or length == 0:
            raise ValueError("map_file() takes whole pages")
        self._checked(gpa, length, lib.PYVMM_GM_SETUP, "image mapping")
        addr = self.host_addr + gpa
        if lease >= 0:
            err = lib.pyvmm_lease_map_fixed(lease, addr, length, fd, offset)
        else:
            err = lib.pyvmm_map_file(addr, length, fd, offset)
        if err == lib.PYVMM_MAP_LOST:
            raise HostError(f"guest memory at {gpa:#x}+{length:#x} lost while mapping the image")
        if err == 0:
            # The file's own descriptor: gone_page asks its size.
            self._file_ranges.append((gpa, length, offset, os.dup(fd)))
        return -err

    def gone_page(self) -> int | None:
        """The first page mapped from a file (``map_file``) that the file
        no longer has (truncated under the guest), or None: why KVM could
        not map guest memory, when that is why."""
        for gpa, length, offset, fd in self._file_ranges:
            # lseek, not fstat: the sandbox lets no stat call through.
            size = os.lseek(fd, 0, os.SEEK_END)
            kept = -(-size // PAGE_SIZE) * PAGE_SIZE - offset
            if kept < length:
                return gpa + max(kept, 0)
        return None

    def protect(self, gpa: int, length: int, prot: Protection) -> None:
        """Set host (and so guest) access rights of whole pages."""
        self.protect_all([(gpa, length, prot)])

    def protect_all(self, ranges) -> None:
        """``protect`` for many (gpa, length, prot) ranges, the read-only set
        updated once (linear in the number of ranges, plus one sort)."""
        added: list[tuple[int, int]] = []
        for gpa, length, prot in ranges:
            if gpa % PAGE_SIZE or length % PAGE_SIZE:
                raise ValueError("protect() takes whole pages")
            self.check(gpa, length, what="protect")
            err = lib.pyvmm_protect(self.host_addr + gpa, length, prot.native)
            if err:
                raise HostError(f"mprotect of guest memory failed: {_strerror(-err)}")
            if not prot.write:
                added.append((gpa, gpa + length))
        if added:
            self._add_read_only(added)

    def _add_read_only(self, ranges: list[tuple[int, int]]) -> None:
        merged: list[tuple[int, int]] = []
        for s, e in sorted(self._ro + ranges):
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        self._ro = merged
        flat = ffi.new("uint64_t[]", [x for r in merged for x in r])
        self._ro_arrays.append(flat)
        self.view.ro = flat
        self.view.n_ro = len(merged)


class GuestStruct:
    """A struct in guest memory that the host writes on the guest's behalf
    (a hypercall's), each field read or written by a guarded copy: guest
    memory mapped from a file can lose a page, which is then a GuestFault
    rather than a SIGBUS. Fields by name, as a cffi pointer's."""

    __slots__ = ("_memory", "_host", "_fields", "_gpa", "_what")

    def __init__(self, memory: GuestMemory, ctype: str, gpa: int, what: str) -> None:
        set_ = object.__setattr__
        set_(self, "_memory", memory)
        set_(self, "_host", memory._checked(gpa, ffi.sizeof(ctype), lib.PYVMM_GM_WRITE, what))
        set_(self, "_fields", _fields_of(ctype))
        set_(self, "_gpa", gpa)
        set_(self, "_what", what)

    def copy_to(self, dst) -> None:
        """The whole struct into ``dst`` (a cffi pointer to the same type)."""
        if lib.pyvmm_copy_guarded(dst, self._host, ffi.sizeof(dst[0])):
            raise _gone(self._what, self._gpa, ffi.sizeof(dst[0]))

    def _field(self, name: str):
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getattr__(self, name: str):
        offset, ctype, size = self._field(name)
        cell = ffi.new(ctype)
        if lib.pyvmm_copy_guarded(cell, self._host + offset, size):
            raise _gone(self._what, self._gpa + offset, size)
        return cell[0]

    def __setattr__(self, name: str, value) -> None:
        offset, ctype, size = self._field(name)
        cell = ffi.new(ctype, value)
        if lib.pyvmm_copy_guarded(self._host + offset, cell, size):
            raise _gone(self._what, self._gpa + offset, size)


_FIELDS: dict[str, dict[str, tuple[int, object, int]]] = {}


def _fields_of(ctype: str) -> dict[str, tuple[int, object, int]]:
    """A struct's fields: name -> (offset, pointer type, size)."""
    fields = _FIELDS.get(ctype)
    if fields is None:
        fields = _FIELDS[ctype] = {
            name: (f.offset, ffi.getctype(f.type, "*"), ffi.sizeof(f.type))
            for name, f in ffi.typeof(ctype).fields
        }
    return fields


def _gone(what: str, gpa: int, length: int) -> GuestFault:
    return GuestFault(
        f"guest fault: {what} at {gpa:#x}+{length:#x}: its pages are gone "
        f"(the file they were mapped from was truncated)"
    )


def _strerror(err: int) -> str:
    return os.strerror(err)
