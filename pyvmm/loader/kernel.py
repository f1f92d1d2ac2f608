"""Loading a unikernel file and placing it in guest memory.

``load_kernel`` does everything that needs only the file (parse, architecture,
ABI, manifest); ``Kernel.check_fits`` and ``place`` do what needs the guest's
memory size. The split lets the VMM report a bad file before it opens
/dev/kvm or maps any memory.
"""

from __future__ import annotations

import os
import stat

from pyvmm._native import lib
from pyvmm.common.errors import LoaderError
from pyvmm.common.record import Record
from pyvmm.common.sizes import GUEST_MEMORY_LIMIT, MEM_GRANULE, MIB, PAGE_SIZE
from pyvmm.kvm.memory import GuestMemory, PagesGone, Protection
from pyvmm.loader.elf import ElfImage, Segment, parse_elf
from pyvmm.loader.lease import ImageLease
from pyvmm.loader.manifest import Manifest
from pyvmm.loader.notes import AbiInfo, Capabilities, read_abi, read_capabilities
from pyvmm.loader.sharing import FileIdentity, map_image, refusal

# Nothing loads below this: the page tables, boot info and command line live there.
MIN_LOAD_ADDRESS = lib.HVT_GUEST_MIN_BASE
# A file this large cannot fit in guest memory; refuse before reading it all.
MAX_FILE_SIZE = GUEST_MEMORY_LIMIT


class Kernel(Record):
    """A unikernel that is known to be runnable here, given enough memory."""

    __slots__ = ("path", "image", "abi", "manifest", "kernel_end", "capabilities", "file", "lease")
    _uncompared = ("lease",)

    def __init__(
        self,
        path: str,
        image: ElfImage,
        abi: AbiInfo,
        manifest: Manifest,
        kernel_end: int,
        capabilities: Capabilities = Capabilities(),  # noqa: B008 (read-only)
        file: FileIdentity | None = None,
        lease: ImageLease | None = None,
    ) -> None:
        self.path = path
        self.image = image
        self.abi = abi
        self.manifest = manifest
        self.kernel_end = kernel_end
        self.capabilities = capabilities
        # The file as it was read: place() maps its pages only if it still is.
        self.file = file
        # The read lease the file was read under (sharing.py), if any.
        self.lease = lease

    @property
    def entry(self) -> int:
        return self.image.entry

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self.image.segments

    @property
    def min_mem_size(self) -> int:
        """The smallest guest memory (a 2 MiB multiple) that holds the kernel."""
        needed = max(self.kernel_end, self.entry + 1)
        return -(-needed // MEM_GRANULE) * MEM_GRANULE

    def check_fits(self, mem_size: int) -> None:
        """Raise LoaderError unless every segment and the entry fit in ``mem_size``.

        An address that no memory size could satisfy (below 1 MiB, past
        4 GiB) is a broken file; one that more memory would satisfy is a
        --mem that is too small, and the message says how much is needed.
        """
        for seg in self.segments:
            if seg.paddr < MIN_LOAD_ADDRESS:
                raise LoaderError(
                    f"{self.path}: segment {seg.index} loads at {seg.paddr:#x}, below "
                    f"the guest load base {MIN_LOAD_ADDRESS:#x}"
                )
            if seg.end > GUEST_MEMORY_LIMIT:
                raise LoaderError(
                    f"{self.path}: segment {seg.index} ({seg.paddr:#x}-{seg.end:#x}) "
                    f"ends beyond the 4 GiB guest memory limit"
                )
        if not MIN_LOAD_ADDRESS <= self.entry < GUEST_MEMORY_LIMIT:
            raise LoaderError(
                f"{self.path}: entry point {self.entry:#x} is outside "
                f"[{MIN_LOAD_ADDRESS:#x}, 4 GiB)"
            )
        if self.kernel_end > mem_size or self.entry >= mem_size:
            raise LoaderError(
                f"{self.path} needs at least {self.min_mem_size // MIB} MiB of guest "
                f"memory, --mem gives {mem_size // MIB} MiB"
            )


def load_kernel(
    path: str, host_machine: str, *, legacy_abi: bool = False, mapped: bool = True
) -> Kernel:
    """Read and validate the unikernel at ``path`` for a ``host_machine`` host.

    ``host_machine`` is ``platform.machine()`` spelling: "x86_64" or "aarch64".
    ``legacy_abi`` also accepts hvt ABI version 1 (see notes.read_abi).
    ``mapped=False`` reads the file into memory even where it could be
    mapped: for a process that keeps kernels for the guests of the
    processes it forks (the launcher), so that it holds no lease and no
    file page itself; each guest's process takes its own lease (place()).
    """
    data, identity, lease = _read_image(path, mapped=mapped)
    image = parse_elf(data, path)
    if image.machine != host_machine:
        raise LoaderError(f"{path}: built for {image.machine}, this host runs {host_machine}")
    abi = read_abi(image, legacy=legacy_abi)
    manifest = Manifest.from_image(image)
    kernel_end = max(seg.end for seg in image.segments)
    return Kernel(
        path=path,
        image=image,
        abi=abi,
        manifest=manifest,
        kernel_end=kernel_end,
        capabilities=read_capabilities(image),
        file=identity,
        lease=lease,
    )


def _read_file(path: str) -> bytes | memoryview:
    return _read_image(path, mapped=False)[0]


def _read_image(
    path: str, *, mapped: bool = True
) -> tuple[bytes | memoryview, FileIdentity | None, ImageLease | None]:
    """The file's bytes, its identity if it did not change while read, and
    the lease they were mapped under.

    A file that may be shared (sharing.refusal) and on which a read lease
    can be taken is mapped, not read: its bytes are then the page cache's,
    so the parsed image costs no private copy per guest beside the shared
    pages, and the lease keeps them still (a writer who comes meanwhile
    waits until they are copied). Any other file is read into memory, so
    a writer pyvmm does not trust cannot change the bytes between the
    checks and their use.
    """
    try:
        # A FIFO would block the open itself, a device node could act on
        # being opened: only regular files are opened (and checked again).
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            what = "Is a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise LoaderError(f"{path}: Could not open: {what}")
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise LoaderError(f"{path}: Could not open: not a regular file")
            if st.st_size > MAX_FILE_SIZE:
                raise LoaderError(
                    f"{path}: file is {st.st_size // MIB} MiB, too large for guest memory"
                )
            before = FileIdentity.of(st)
            if (
                mapped
                and st.st_size
                and refusal(st, f.fileno(), euid=os.geteuid(), noexec=False) is None
            ):
                lease = ImageLease.take(path, f.fileno())
                view = None if isinstance(lease, str) else lease.view(f.fileno(), st.st_size)
                if view is not None:
                    return view, before, lease  # type: ignore[return-value]
            data = f.read()
            # Unchanged size and times after the read: what was read is
            # what a later mapping of this file gives (sharing.map_image).
            identity = FileIdentity.of(os.fstat(f.fileno()))
            return data, identity if identity == before else None, None
    except OSError as e:
        raise LoaderError(f"{path}: Could not open: {e.strerror or e}") from None


class ProtectedRange(Record):
    """A run of whole guest pages that get the same access rights."""

    __slots__ = ("start", "length", "protection")

    def __init__(self, start: int, length: int, protection: Protection) -> None:
        self.start = start
        self.length = length
        self.protection = protection


_PROTECTIONS = {
    (w, x): Protection(read=True, write=w, execute=x) for w in (False, True) for x in (False, True)
}


def page_regions(kernel: Kernel) -> list[tuple[int, int, Protection]]:
    """``page_protections`` as [start, end) ranges, as the architecture's
    page tables take them (``Arch.prepare_memory``)."""
    return [(r.start, r.start + r.length, r.protection) for r in page_protections(kernel)]


def page_protections(kernel: Kernel) -> tuple[ProtectedRange, ...]:
    """Access rights per page, from the segments' p_flags.

    A page shared by two segments gets the union of their flags, so neither
    segment loses an access it asked for. Read is always granted: the host
    must be able to read any page a hypercall argument points into, and x86
    cannot express write- or execute-only pages anyway.

    One pass over the segments (sorted by address and not overlapping, as
    parse_elf guarantees): two neighbours can share only the page where one
    ends and the next starts, so only the last run can need a split.
    """
    runs: list[tuple[int, int, bool, bool]] = []  # [start, end), write, execute
    for seg in kernel.segments:
        start = seg.paddr // PAGE_SIZE * PAGE_SIZE
        end = -(-seg.end // PAGE_SIZE) * PAGE_SIZE
        if end <= start:
            continue
        write, execute = seg.writable, seg.executable
        if runs and start < runs[-1][1]:  # shares the page [start, start + PAGE_SIZE)
            lo, hi, w, x = runs.pop()
            if lo < start:
                runs.append((lo, start, w, x))
            runs.append((start, hi, w or write, x or execute))
            if hi < end:
                runs.append((hi, end, write, execute))
        else:
            runs.append((start, end, write, execute))
    merged: list[ProtectedRange] = []
    for lo, hi, w, x in runs:
        prot = _PROTECTIONS[w, x]
        last = merged[-1] if merged else None
        if last and last.protection == prot and last.start + last.length == lo:
            merged[-1] = ProtectedRange(last.start, hi - last.start, prot)
        else:
            merged.append(ProtectedRange(lo, hi - lo, prot))
    return tuple(merged)


def place(kernel: Kernel, memory: GuestMemory) -> None:
    """Put the segments in guest memory, then apply protections.

    Whole file pages are mapped from the file, shared copy-on-write with
    every other guest of the image (sharing.py); the rest of each
    segment's file bytes is copied. The zero-fill up to p_memsz leaves
    whole pages non-resident (``GuestMemory.zero``; they are anonymous:
    a mapped run never reaches past p_filesz). Protections come last
    because the host writes through the same mapping that becomes
    read-only.
    """
    kernel.check_fits(memory.size)
    runs = map_image(kernel.path, kernel.file, kernel.segments, memory, kernel.lease)
    mapped = {run.gpa: run for run in runs}
    for seg in kernel.segments:
        file_end = seg.paddr + seg.filesz
        # A segment's run starts at its first whole page (sharing.file_runs).
        run = mapped.get(-(-seg.paddr // PAGE_SIZE) * PAGE_SIZE)
        if run and run.gpa + run.length > file_end:
            run = None  # a later segment's run: this one has none
        pieces = (
            [(seg.paddr, run.gpa), (run.gpa + run.length, file_end)]
            if run
            else [(seg.paddr, file_end)]
        )
        for lo, hi in pieces:
            if hi > lo:
                try:
                    memory.write(lo, seg.data[lo - seg.paddr : hi - seg.paddr], what="kernel load")
                except PagesGone:
                    raise LoaderError(f"{kernel.path}: truncated while pyvmm loaded it") from None
        if seg.end > file_end:
            memory.zero(file_end, seg.end - file_end, what="kernel load")
    memory.protect_all((run.start, run.length, run.protection) for run in page_protections(kernel))
    # File pages only where the host never writes (csrc/guestmem.h).
    assert all(memory.is_read_only(r.gpa, r.gpa + r.length) for r in runs)
