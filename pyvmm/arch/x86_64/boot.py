"""x86_64 boot state of the hvt ABI: GDT, identity page tables, long mode.

Layout (solo5-hvt compatible, see docs/abi.md): GDT at 0x1000, PML4 at
0x2000, PDPT at 0x3000, four page directories of 2 MiB pages at
0x4000-0x7fff identity-mapping 4 GiB, and a page table at 0x8000 for the
first 2 MiB whose pages below 0x10000 are absent (NULL dereferences fault)
and 0x10000-0xfffff read-only (boot info, manifest and command line).

Beyond solo5-hvt, the guest's own page tables carry the ELF segment
permissions: every 2 MiB region holding part of a loaded segment gets a
4 KiB page table (placed from 0x20000 up, in the read-only low area) with
read-only text/rodata and no-execute data, and EFER.NXE is on. Measured
under kvm_pvm, the host mapping's PROT_EXEC is not enforced for guest
fetches, so this is what stops a guest executing its data; a write to text
or a fetch from data then ends in a triple fault whose CR2 and RIP say what
happened.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from pyvmm._native import lib
from pyvmm.arch.tables import place_page_tables
from pyvmm.arch.x86_64.layout import (  # the TSS's and the trap pages' (re-exported)
    TRAP_CODE_SELECTOR,
    TRAP_STACK,
    TRAP_STACK_TOP,
    TRAP_TABLES,
    TSS_BASE,
    TSS_LIMIT,
    TSS_SIZE,
    write_tables,
)
from pyvmm.common.record import Record
from pyvmm.kvm.memory import GuestMemory, Protection

PAGE = 0x1000
LARGE_PAGE = 0x200000

GDT_BASE = 0x1000
PML4_BASE = 0x2000
PDPT_BASE = 0x3000
PD_BASE = 0x4000
PD_COUNT = 4
PT_BASE = 0x8000
EXTRA_PT_BASE = 0x20000
EXTRA_PT_END = 0x100000
LOW_ABSENT_END = 0x10000
LOW_READONLY_END = lib.PYVMM_LOW_AREA_END

# Page-table entry bits.
PTE_P = 1 << 0
PTE_RW = 1 << 1
PTE_US = 1 << 2
PTE_PS = 1 << 7
PTE_NX = 1 << 63

SEG_TYPE_CODE_XA = 9  # execute-only, accessed
SEG_TYPE_CODE_XRA = 11  # execute/read, accessed
SEG_TYPE_DATA_RWA = 3  # read/write, accessed
SEG_TYPE_TSS64_BUSY = 11


class Segment(Record):
    """One flat segment, as both a GDT descriptor and a kvm_segment."""

    __slots__ = ("selector", "type", "dpl", "long", "db", "s", "granularity", "limit")

    def __init__(
        self,
        selector: int,
        type: int,
        dpl: int = 0,
        long: bool = False,
        db: bool = False,
        s: bool = True,
        granularity: bool = True,
        limit: int = 0xFFFFF,
    ) -> None:
        self.selector = selector
        self.type = type
        self.dpl = dpl
        self.long = long
        self.db = db
        self.s = s
        self.granularity = granularity
        self.limit = limit

    def descriptor(self) -> int:
        return (
            (self.limit & 0xFFFF)
            | (self.type << 40)
            | (int(self.s) << 44)
            | (self.dpl << 45)
            | (1 << 47)
            | (((self.limit >> 16) & 0xF) << 48)
            | (int(self.long) << 53)
            | (int(self.db) << 54)
            | (int(self.granularity) << 55)
        )

    def load(self, kvm_seg) -> None:
        kvm_seg.base = 0
        kvm_seg.limit = (self.limit << 12) | 0xFFF if self.granularity else self.limit
        kvm_seg.selector = self.selector | self.dpl  # RPL = DPL
        kvm_seg.type = self.type
        kvm_seg.present = 1
        kvm_seg.dpl = self.dpl
        kvm_seg.db = int(self.db)
        kvm_seg.s = int(self.s)
        kvm_seg.l = int(self.long)
        kvm_seg.g = int(self.granularity)
        kvm_seg.avl = 0
        kvm_seg.unusable = 0


KERNEL_CODE = Segment(selector=0x08, type=SEG_TYPE_CODE_XA, long=True)
KERNEL_DATA = Segment(selector=0x10, type=SEG_TYPE_DATA_RWA, db=True)
USER_DATA = Segment(selector=lib.PYVMM_USER_DS & ~3, type=SEG_TYPE_DATA_RWA, dpl=3, db=True)
USER_CODE = Segment(selector=lib.PYVMM_USER_CS & ~3, type=SEG_TYPE_CODE_XRA, dpl=3, long=True)


def tss_bytes(rsp0: int = 0) -> bytes:
    """The TSS; ``rsp0`` is the stack a trap from CPL 3 switches to."""
    tss = bytearray(TSS_LIMIT + 1)
    struct.pack_into("<Q", tss, 4, rsp0)
    struct.pack_into("<H", tss, 102, TSS_SIZE)  # I/O map base
    tss[-1] = 0xFF
    return bytes(tss)


def gdt_bytes(segments: tuple[Segment, ...]) -> bytes:
    """The GDT: a null descriptor then one descriptor per selector slot."""
    table = [0] * (max(s.selector for s in segments) // 8 + 1)
    for seg in segments:
        table[seg.selector // 8] = seg.descriptor()
    return struct.pack(f"<{len(table)}Q", *table)


def _bits(prot: Protection, us: int) -> int:
    """A page table entry's flags for ``prot`` (the address is or'ed in)."""
    return PTE_P | us | (PTE_RW if prot.write else 0) | (0 if prot.execute else PTE_NX)


def _pte(addr: int, prot: Protection, us: int) -> int:
    return addr | _bits(prot, us)


def page_tables(
    regions: list[tuple[int, int, Protection]],
    user: bool = False,
    private: dict[int, Protection] | None = None,
) -> dict[int, bytes]:
    """Identity map of 4 GiB: {guest address: table bytes}.

    ``regions`` are page-aligned [start, end) ranges with their protection
    (the loaded ELF segments); memory outside them is read/write, no-exec.
    ``private`` low-area pages are pyvmm's own: supervisor-only, with the
    protection given.
    """
    us = PTE_US if user else 0
    default = Protection(read=True, write=True, execute=False)
    pml4 = [0] * 512
    pml4[0] = PDPT_BASE | PTE_P | PTE_RW | us
    pdpt = [0] * 512
    for i in range(PD_COUNT):
        pdpt[i] = (PD_BASE + i * 0x1000) | PTE_P | PTE_RW | us
    # Thousands of entries per start: their flags are computed once per
    # protection, not per entry (docs/startup.md).
    plain = _bits(default, us)
    readonly = _bits(Protection(read=True, write=False), us)
    pds = [addr | plain | PTE_PS for addr in range(0, PD_COUNT * 512 * LARGE_PAGE, LARGE_PAGE)]

    # 4 KiB page tables for the first 2 MiB and every region with segments.
    small: dict[int, list[int]] = {}
    low = []
    for addr in range(0, LARGE_PAGE, PAGE):
        if private and addr in private:
            low.append(_pte(addr, private[addr], 0))
        elif addr < LOW_ABSENT_END:
            low.append(0)
        elif addr < LOW_READONLY_END:
            low.append(addr | readonly)
        else:
            low.append(addr | plain)
    small[0] = low
    for start, end, prot in regions:
        bits = _bits(prot, us)
        for addr in range(start, end, PAGE):
            base = addr - addr % LARGE_PAGE
            table = small.get(base)
            if table is None:
                table = small[base] = [a | plain for a in range(base, base + LARGE_PAGE, PAGE)]
            table[(addr - base) // PAGE] = addr | bits

    tables = {}
    for base, gpa, table in place_page_tables(small, PT_BASE, EXTRA_PT_BASE, EXTRA_PT_END):
        pds[base // LARGE_PAGE] = gpa | PTE_P | PTE_RW | us
        tables[gpa] = table
    tables[PML4_BASE] = struct.pack("<512Q", *pml4)
    tables[PDPT_BASE] = struct.pack("<512Q", *pdpt)
    tables[PD_BASE] = struct.pack(f"<{len(pds)}Q", *pds)
    return tables


# Deprivileged mode: the guest's own selector values (0x08 code, 0x10 data,
# as Solo5's GDT has them) must work when it loads them at CPL 3, so those
# slots hold DPL 3 descriptors; pyvmm's trap stubs run on a DPL 0 code
# segment in a slot the guest never names (its own GDT has 5 entries).
GUEST_CODE = Segment(selector=0x08, type=SEG_TYPE_CODE_XRA, dpl=3, long=True)
GUEST_DATA = Segment(selector=0x10, type=SEG_TYPE_DATA_RWA, dpl=3, db=True)
TRAP_CODE = Segment(selector=TRAP_CODE_SELECTOR, type=SEG_TYPE_CODE_XA, long=True)


class Profile(Record):
    """How the guest is entered: segments, tables and flags of one mode.

    ``tss``: a TSS with an I/O bitmap allowing every port (hypercalls at
    CPL 3); ``iopl3``: RFLAGS.IOPL set to 3 (the user-mode profile;
    deprivileged keeps 0 so that cli/sti trap on every host, not only on
    kvm_pvm); ``fsgsbase``: CR4.FSGSBASE offered where the CPU has it
    (wrfsbase for TLS); ``private``: pyvmm-private low-area pages
    (supervisor-only), by address."""

    __slots__ = (
        "name", "cpl", "segments", "code", "data", "gdt_base", "tss", "iopl3", "fsgsbase",
        "private",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        cpl: int,
        segments: tuple[Segment, ...],
        code: Segment,
        data: Segment,
        gdt_base: int = GDT_BASE,
        tss: bool = False,
        iopl3: bool = False,
        fsgsbase: bool = False,
        private: tuple[tuple[int, Protection], ...] = (),
    ) -> None:
        self.name = name
        self.cpl = cpl
        self.segments = segments
        self.code = code
        self.data = data
        self.gdt_base = gdt_base
        self.tss = tss
        self.iopl3 = iopl3
        self.fsgsbase = fsgsbase
        self.private = private


KERNEL = Profile("kernel", 0, (KERNEL_CODE, KERNEL_DATA), KERNEL_CODE, KERNEL_DATA)
USER = Profile(
    "user",
    3,
    (KERNEL_CODE, KERNEL_DATA, USER_DATA, USER_CODE),
    USER_CODE,
    USER_DATA,
    tss=True,
    iopl3=True,
    fsgsbase=True,
)
DEPRIVILEGED = Profile(
    "deprivileged",
    3,
    (GUEST_CODE, GUEST_DATA, TRAP_CODE),
    GUEST_CODE,
    GUEST_DATA,
    gdt_base=TRAP_TABLES,
    tss=True,
    private=(
        (TRAP_TABLES, Protection(read=True, write=False, execute=True)),
        (TRAP_STACK, Protection(read=True, write=True, execute=False)),
    ),
)
PROFILES = {p.name: p for p in (KERNEL, USER, DEPRIVILEGED)}


def profile_for(mode: int | str) -> Profile:
    """A profile by name, or by CPL for the two direct modes (0, 3)."""
    if isinstance(mode, int):
        return USER if mode == 3 else KERNEL
    return PROFILES[mode]


def mode_page_tables(
    regions: list[tuple[int, int, Protection]], cpl: int | str = 0
) -> dict[int, bytes]:
    """The page tables of a mode (a profile's name or CPL) over ``regions``."""
    profile = profile_for(cpl)
    return page_tables(regions, user=profile.cpl == 3, private=dict(profile.private))


def setup_memory(
    memory: GuestMemory,
    regions: list[tuple[int, int, Protection]],
    cpl: int | str = 0,
    tables: Mapping[int, bytes] | None = None,
) -> None:
    """Write the GDT, page tables (``tables``: already computed by
    ``mode_page_tables``) and the TSS, trap tables where the mode has them,
    into guest memory."""
    profile = profile_for(cpl)
    memory.write(profile.gdt_base, gdt_bytes(profile.segments))
    if tables is None:
        tables = mode_page_tables(regions, cpl)
    for gpa, table in tables.items():
        memory.write(gpa, table)
    if profile.tss:
        memory.write(TSS_BASE, tss_bytes(rsp0=TRAP_STACK_TOP if profile.private else 0))
    if profile is DEPRIVILEGED:
        write_tables(memory)
