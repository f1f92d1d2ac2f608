"""aarch64 boot state of the hvt ABI: translation tables, MMU registers and
pyvmm's fallback exception vectors (../shared/spec "aarch64 differences").

Layout (solo5-hvt compatible): 4 KiB granule, 40-bit VA/PA, level-0 table
(PGD) at 0x1000, level-1 (PUD) at 0x2000, four level-2 tables (PMD) at
0x3000-0x6fff mapping RAM below 4 GiB in 2 MiB blocks, a level-3 table
(PTE) at 0x7000 for the first 2 MiB, whose pages below 0x10000 are absent
and 0x10000-0xfffff read-only; the 1 GiB MMIO window at 0x100000000 is one
device-memory block. MAIR_EL1 index 0..5 = device-nGnRnE, device-nGnRE,
device-GRE, normal-NC, normal, normal-WT.

Beyond solo5-hvt, as on x86_64: every 2 MiB region holding a loaded segment
gets a level-3 table (from 0x20000 up, in the read-only low area) with the
segment's permissions (read-only text and rodata, no-execute data), and
memory outside the segments is no-execute. And pyvmm's exception vectors
(VBAR_EL1 at 0x1a000, read-only, executable) catch what a guest takes
before installing its own: each entry stores to a fault address in the
MMIO window, so the host reads ESR_EL1 and FAR_EL1 and says what happened
(x0 is kept in TPIDR_EL1), as an x86 triple fault is read from CR2.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from pyvmm._native import lib
from pyvmm.arch.tables import place_page_tables
from pyvmm.kvm.memory import GuestMemory, Protection

PAGE = 0x1000
BLOCK_2M = 0x200000
BLOCK_1G = 0x40000000

PGD_BASE = 0x1000
PUD_BASE = 0x2000
PMD_BASE = 0x3000
PMD_COUNT = 4
PTE_BASE = 0x7000
EXTRA_PT_BASE = 0x20000
EXTRA_PT_END = 0x100000
LOW_ABSENT_END = 0x10000
LOW_READONLY_END = lib.PYVMM_LOW_AREA_END
VECTORS = 0x1A000

MMIO_BASE = lib.HVT_HYPERCALL_MMIO_BASE
MMIO_SIZE = BLOCK_1G
#: Where pyvmm's vector entry ``i`` stores (a 32-bit store of zero).
FAULT_MMIO = MMIO_BASE + 0x800
VECTOR_ENTRIES = 16

# Descriptor bits (ARM ARM D8.3, stage 1, 4 KiB granule).
DESC_VALID = 1 << 0
DESC_TABLE = 1 << 1  # at levels 0-2: a table; at level 3: a page
DESC_PAGE = 1 << 1
ATTR_INDX_SHIFT = 2
AP_RO = 1 << 7  # AP[2]: read-only (at EL1 and EL0)
SH_INNER = 3 << 8
AF = 1 << 10
PXN = 1 << 53
UXN = 1 << 54

MAIR_DEVICE_NGNRNE = 0
MAIR_NORMAL = 4
MAIR_EL1 = 0x00 | 0x04 << 8 | 0x0C << 16 | 0x44 << 24 | 0xFF << 32 | 0xBB << 40

# TCR_EL1: T0SZ = T1SZ = 24 (40-bit VA), inner/outer write-back
# write-allocate, inner shareable, 4 KiB granules, 16-bit ASID, TBI0, IPS
# 1 TB (40-bit PA).
TCR_EL1 = (
    24
    | 1 << 8  # IRGN0 WBWA
    | 1 << 10  # ORGN0 WBWA
    | 3 << 12  # SH0 inner
    | 0 << 14  # TG0 4K
    | 24 << 16
    | 1 << 24  # IRGN1 WBWA
    | 1 << 26  # ORGN1 WBWA
    | 3 << 28  # SH1 inner
    | 2 << 30  # TG1 4K
    | 2 << 32  # IPS 40 bits
    | 1 << 36  # AS: 16-bit ASID
    | 1 << 37  # TBI0
)
TTBR0_EL1 = PGD_BASE
SCTLR_M = 1 << 0
SCTLR_C = 1 << 2
SCTLR_I = 1 << 12
CPACR_FPEN = 3 << 20
# PSTATE at entry: D, A, I, F masked, EL1 with SP_EL1 (EL1h).
PSTATE_DAIF = 0xF << 6
PSTATE_EL1H = 0x5
PSTATE = PSTATE_DAIF | PSTATE_EL1H

NORMAL_RW = Protection(read=True, write=True, execute=False)


def _normal(addr: int, prot: Protection) -> int:
    entry = addr | DESC_VALID | MAIR_NORMAL << ATTR_INDX_SHIFT | SH_INNER | AF
    if not prot.write:
        entry |= AP_RO
    if not prot.execute:
        entry |= PXN | UXN
    return entry


def device_block(addr: int) -> int:
    return addr | DESC_VALID | MAIR_DEVICE_NGNRNE << ATTR_INDX_SHIFT | AF | PXN | UXN


def low_protection(addr: int) -> Protection | None:
    """How the first 2 MiB are mapped (None: absent)."""
    if addr == VECTORS:
        return Protection(read=True, write=False, execute=True)
    if addr < LOW_ABSENT_END:
        return None
    if addr < LOW_READONLY_END:
        return Protection(read=True, write=False, execute=False)
    return NORMAL_RW


def translation_tables(regions: list[tuple[int, int, Protection]]) -> dict[int, bytes]:
    """Identity map of 4 GiB of RAM and the MMIO window: {gpa: table bytes}.

    ``regions`` are page-aligned [start, end) ranges with their protection
    (the loaded ELF segments); RAM outside them is read/write, no-execute.
    """
    pgd = [0] * 512
    pgd[0] = PUD_BASE | DESC_VALID | DESC_TABLE
    pud = [0] * 512
    for i in range(PMD_COUNT):
        pud[i] = (PMD_BASE + i * PAGE) | DESC_VALID | DESC_TABLE
    pud[MMIO_BASE // BLOCK_1G] = device_block(MMIO_BASE)
    pmds = [_normal(addr, NORMAL_RW) for addr in range(0, PMD_COUNT * BLOCK_1G, BLOCK_2M)]

    small: dict[int, list[int]] = {}
    low = []
    for addr in range(0, BLOCK_2M, PAGE):
        prot = low_protection(addr)
        low.append(0 if prot is None else _normal(addr, prot) | DESC_PAGE)
    small[0] = low
    for start, end, prot in regions:
        for addr in range(start, end, PAGE):
            base = addr - addr % BLOCK_2M
            table = small.setdefault(
                base,
                [_normal(a, NORMAL_RW) | DESC_PAGE for a in range(base, base + BLOCK_2M, PAGE)],
            )
            table[(addr - base) // PAGE] = _normal(addr, prot) | DESC_PAGE

    tables = {}
    for base, gpa, table in place_page_tables(small, PTE_BASE, EXTRA_PT_BASE, EXTRA_PT_END):
        pmds[base // BLOCK_2M] = gpa | DESC_VALID | DESC_TABLE
        tables[gpa] = table
    tables[PGD_BASE] = struct.pack("<512Q", *pgd)
    tables[PUD_BASE] = struct.pack("<512Q", *pud)
    tables[PMD_BASE] = struct.pack(f"<{len(pmds)}Q", *pmds)
    return tables


def vector_entry(index: int) -> bytes:
    """One 0x80-byte vector entry: keep x0 in TPIDR_EL1, store zero to
    FAULT_MMIO + 8 * index, and stay there."""
    words = (
        0xD518D080,  # msr tpidr_el1, x0
        0xD2800000 | ((FAULT_MMIO - MMIO_BASE + 8 * index) << 5),  # movz x0, #off
        0xF2C00000 | ((MMIO_BASE >> 32) << 5),  # movk x0, #(base >> 32), lsl #32
        0xB900001F,  # str wzr, [x0]
        0x14000000,  # b .
    )
    code = struct.pack(f"<{len(words)}I", *words)
    return code + bytes(0x80 - len(code))


def vectors() -> bytes:
    return b"".join(vector_entry(i) for i in range(VECTOR_ENTRIES))


def setup_memory(
    memory: GuestMemory,
    regions: list[tuple[int, int, Protection]],
    tables: Mapping[int, bytes] | None = None,
) -> None:
    """Write the translation tables (``tables``: already computed by
    ``translation_tables``) and the vectors into guest memory."""
    if tables is None:
        tables = translation_tables(regions)
    for gpa, table in tables.items():
        memory.write(gpa, table)
    memory.write(VECTORS, vectors())
