"""The x86_64 boot state: GDT descriptors and identity page tables exactly as
the hvt ABI lays them out, plus pyvmm's segment permissions."""

from __future__ import annotations

import struct

from pyvmm.arch import x86_64 as x
from pyvmm.kvm.memory import GuestMemory, Protection

RX = Protection(read=True, write=False, execute=True)
RO = Protection(read=True, write=False, execute=False)
RW = Protection(read=True, write=True, execute=False)


def entries(table: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(table) // 8}Q", table))


def walk(tables: dict[int, bytes], addr: int) -> tuple[int, int]:
    """(physical address, effective flags) for a 4-level walk, as the CPU does."""

    def read(base: int, index: int) -> int:
        for start, table in tables.items():
            if start <= base + index * 8 < start + len(table):
                return entries(table)[(base - start) // 8 + index]
        raise AssertionError(f"no table at {base:#x}")

    pml4e = read(x.PML4_BASE, (addr >> 39) & 511)
    pdpte = read(pml4e & 0xFFFFF000, (addr >> 30) & 511)
    pde = read(pdpte & 0xFFFFF000, (addr >> 21) & 511)
    if pde & x.PTE_PS:
        return (pde & 0xFFE00000) | (addr & 0x1FFFFF), pde
    pte = read(pde & 0xFFFFF000, (addr >> 12) & 511)
    return (pte & 0xFFFFF000) | (addr & 0xFFF), pte


def test_gdt_has_null_code_and_data_as_the_abi_says():
    gdt = entries(x.gdt_bytes((x.KERNEL_CODE, x.KERNEL_DATA)))
    assert gdt[0] == 0
    code, data = gdt[1], gdt[2]
    assert (code >> 40) & 0xF == 9 and (code >> 53) & 1 == 1  # type 9, L
    assert (code >> 47) & 1 and (code >> 44) & 1 and (code >> 55) & 1  # P, S, G
    assert (data >> 40) & 0xF == 3 and (data >> 54) & 1 == 1  # type 3, DB
    assert code & 0xFFFF == 0xFFFF and (code >> 48) & 0xF == 0xF  # limit 0xfffff


def test_user_profile_adds_dpl3_segments():
    gdt = entries(x.gdt_bytes(x.profile_for(3).segments))
    assert (gdt[0x18 // 8] >> 45) & 3 == 3
    assert (gdt[0x20 // 8] >> 45) & 3 == 3 and (gdt[0x20 // 8] >> 53) & 1


def test_identity_map_of_4_gib_with_absent_and_read_only_low_pages():
    tables = x.page_tables([])
    for addr in (0x100000, 0x123456, 0x200000, 0x40000000, 0xFFFFF000):
        phys, flags = walk(tables, addr)
        assert phys == addr and flags & x.PTE_P
    assert walk(tables, 0x0)[1] & x.PTE_P == 0
    assert walk(tables, 0xF000)[1] & x.PTE_P == 0
    low = walk(tables, 0x10000)[1]
    assert low & x.PTE_P and not low & x.PTE_RW
    assert walk(tables, 0xFFFFF)[1] & x.PTE_RW == 0
    assert walk(tables, 0x100000)[1] & x.PTE_RW
    assert x.PT_BASE in tables and x.PML4_BASE in tables


def test_segment_permissions_reach_the_page_tables():
    tables = x.page_tables(
        [(0x100000, 0x102000, RX), (0x102000, 0x103000, RO), (0x400000, 0x401000, RW)]
    )
    text = walk(tables, 0x101000)[1]
    assert not text & x.PTE_RW and not text & x.PTE_NX
    rodata = walk(tables, 0x102000)[1]
    assert not rodata & x.PTE_RW and rodata & x.PTE_NX
    data = walk(tables, 0x400000)[1]
    assert data & x.PTE_RW and data & x.PTE_NX
    heap = walk(tables, 0x800000)[1]  # no segment: read/write, no-exec
    assert heap & x.PTE_RW and heap & x.PTE_NX
    # The region holding a segment beyond the first 2 MiB got its own table.
    assert x.EXTRA_PT_BASE in tables


def test_user_profile_sets_the_user_bit_everywhere():
    tables = x.page_tables([(0x100000, 0x101000, RX)], user=True)
    for addr in (0x10000, 0x100000, 0x40000000):
        assert walk(tables, addr)[1] & x.PTE_US


def test_tss_io_bitmap_allows_every_port():
    tss = x.tss_bytes()
    assert struct.unpack_from("<H", tss, 102)[0] == x.TSS_SIZE
    assert tss[x.TSS_SIZE : x.TSS_SIZE + 8192] == bytes(8192)
    assert tss[-1] == 0xFF and len(tss) == x.TSS_LIMIT + 1
    # It fits between the boot info area and the extra page tables.
    assert x.TSS_BASE + len(tss) <= x.EXTRA_PT_BASE


def test_setup_memory_writes_tables_into_guest_memory():
    with GuestMemory(4 << 20) as mem:
        x.setup_memory(mem, [(0x100000, 0x101000, RX)], cpl=3)
        assert mem.read(x.GDT_BASE, 8) == bytes(8)
        assert mem.read(x.PML4_BASE, 8) != bytes(8)
        assert mem.read(x.TSS_BASE + x.TSS_LIMIT, 1) == b"\xff"
