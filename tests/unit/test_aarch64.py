"""The aarch64 boot state, checked on any host (no KVM): the translation
tables against an independent walk of the spec's layout (4 KiB granule,
40-bit VA, tables at 0x1000..0x7fff, MMIO window as device memory), the
fallback vectors against the cross assembler, fault readings from ESR/FAR,
and the MMIO hypercall transport. The register ids are checked against a
C program on arm64 itself (tests/aarch64/, run by scripts/test-aarch64)."""

from __future__ import annotations

import struct
import subprocess

import pytest

from conftest import need_tool
from pyvmm._native import lib
from pyvmm.arch.aarch64 import ARCH, DOORBELLS, faults, mmu
from pyvmm.kvm import IoOut, Mmio
from pyvmm.kvm.memory import Protection

RX = Protection(read=True, write=False, execute=True)
RO = Protection(read=True, write=False, execute=False)
RW = Protection(read=True, write=True, execute=False)
GIB = 1 << 30
MIB = 1 << 20

# The spec's fixed addresses, written out here rather than imported.
SPEC_PGD, SPEC_PUD, SPEC_PMDS, SPEC_PTE = 0x1000, 0x2000, (0x3000, 0x4000, 0x5000, 0x6000), 0x7000
MMIO = 0x100000000


def walk(tables: dict[int, bytes], va: int) -> tuple[int, int, int] | None:
    """(PA, descriptor, level) for a stage-1 walk from TTBR0 = 0x1000 with
    T0SZ = 24 (level 0 start, 4 KiB granule), or None if it faults."""

    def read(table: int, index: int) -> int:
        for start, data in tables.items():
            if start <= table < start + len(data):
                return struct.unpack_from("<Q", data, table - start + index * 8)[0]
        raise AssertionError(f"walk reaches {table:#x}, which pyvmm did not write")

    assert va < 1 << 40
    table = SPEC_PGD
    for level in range(4):
        index = (va >> (39 - 9 * level)) & 511
        desc = read(table, index)
        if not desc & 1:
            return None
        if level == 3:
            assert desc & 2, "a level-3 descriptor must be a page"
            return (desc & 0xFFFFFFFFF000) | (va & 0xFFF), desc, 3
        if not desc & 2:  # a block
            assert level in (1, 2), "blocks exist at levels 1 and 2 only"
            size = 1 << (39 - 9 * level)
            return (desc & 0xFFFFFFFFF000 & ~(size - 1)) | (va & (size - 1)), desc, level
        table = desc & 0xFFFFFFFFF000
    raise AssertionError("unreachable")


def attrs(desc: int) -> dict[str, int]:
    return {
        "attr": (desc >> 2) & 7,
        "ro": (desc >> 7) & 1,
        "sh": (desc >> 8) & 3,
        "af": (desc >> 10) & 1,
        "pxn": (desc >> 53) & 1,
        "uxn": (desc >> 54) & 1,
    }


def mair(index: int) -> int:
    return (mmu.MAIR_EL1 >> (8 * index)) & 0xFF


@pytest.fixture(scope="module")
def tables():
    regions = [(0x100000, 0x104000, RX), (0x104000, 0x105000, RO), (0x105000, 0x108000, RW)]
    return mmu.translation_tables(regions)


def test_tables_live_where_the_spec_puts_them(tables):
    assert {SPEC_PGD, SPEC_PUD, SPEC_PTE} <= set(tables)
    assert len(tables[mmu.PMD_BASE]) == 4 * 4096  # the four PMDs, one write
    assert mmu.PMD_BASE == SPEC_PMDS[0] and mmu.TTBR0_EL1 == SPEC_PGD


@pytest.mark.parametrize("va", [0x10000, 0x200000, 0x1234567, 1 * GIB + 0x5000, 4 * GIB - 4096])
def test_ram_is_identity_mapped_normal_memory(tables, va):
    pa, desc, _ = walk(tables, va)
    assert pa == va
    a = attrs(desc)
    assert mair(a["attr"]) == 0xFF  # normal, write-back
    assert a["af"] and a["sh"] == 3


def test_page_zero_area_is_absent_and_low_area_read_only(tables):
    for va in (0, 0x1000, 0x7000, 0xFFFF):
        assert walk(tables, va) is None
    for va in (0x10000, 0x14000, 0xFF000):
        _, desc, level = walk(tables, va)
        assert level == 3 and attrs(desc)["ro"] and attrs(desc)["pxn"]
    _, desc, _ = walk(tables, 0x100000 + 0x10000)
    assert not attrs(desc)["ro"]


def test_mmio_window_is_one_device_block(tables):
    for va in (MMIO, MMIO + 8 * lib.HVT_HYPERCALL_MAX, lib.SHM_KICK_MMIO, MMIO + GIB - 8):
        pa, desc, level = walk(tables, va)
        assert pa == va and level == 1
        a = attrs(desc)
        assert mair(a["attr"]) == 0x00  # device-nGnRnE
        assert a["pxn"] and a["uxn"]
    assert walk(tables, MMIO + GIB) is None


def test_mair_indices_as_the_spec_lists_them():
    assert [mair(i) for i in range(6)] == [0x00, 0x04, 0x0C, 0x44, 0xFF, 0xBB]


def test_tcr_fields():
    tcr = mmu.TCR_EL1
    assert tcr & 0x3F == 24 and (tcr >> 16) & 0x3F == 24  # 40-bit VA both halves
    assert (tcr >> 14) & 3 == 0 and (tcr >> 30) & 3 == 2  # 4 KiB granules
    assert (tcr >> 32) & 7 == 2  # IPS: 40 bits, 1 TB
    assert (tcr >> 36) & 1 and (tcr >> 37) & 1  # 16-bit ASID, TBI0
    assert (tcr >> 12) & 3 == 3 and (tcr >> 8) & 3 == 1 and (tcr >> 10) & 3 == 1


def test_segments_carry_their_permissions(tables):
    text = attrs(walk(tables, 0x101000)[1])
    rodata = attrs(walk(tables, 0x104000)[1])
    data = attrs(walk(tables, 0x106000)[1])
    assert text["ro"] and not text["pxn"]
    assert rodata["ro"] and rodata["pxn"] and rodata["uxn"]
    assert not data["ro"] and data["pxn"]
    # Memory outside the segments: writable, not executable.
    other = attrs(walk(tables, 64 * MIB)[1])
    assert not other["ro"] and other["pxn"] and other["uxn"]


def test_vectors_are_mapped_executable_read_only(tables):
    _, desc, _ = walk(tables, mmu.VECTORS + 0x200)
    a = attrs(desc)
    assert a["ro"] and not a["pxn"]
    assert mmu.VECTORS % 2048 == 0  # VBAR_EL1 alignment
    assert mmu.VECTORS + mmu.PAGE <= lib.PYVMM_LOW_AREA_END


def test_vector_code_matches_the_assembler(tmp_path):
    assembler = need_tool("aarch64-linux-gnu-as")
    objcopy = need_tool("aarch64-linux-gnu-objcopy")
    index = 5  # synchronous, from EL1 with SP_EL1
    source = tmp_path / "v.S"
    source.write_text(
        "msr tpidr_el1, x0\n"
        f"movz x0, #{0x800 + 8 * index:#x}\n"
        "movk x0, #0x1, lsl #32\n"
        "str wzr, [x0]\n"
        "b .\n"
    )
    subprocess.run([assembler, "-o", tmp_path / "v.o", source], check=True)
    subprocess.run(
        [objcopy, "-O", "binary", "-j", ".text", tmp_path / "v.o", tmp_path / "v"], check=True
    )
    code = (tmp_path / "v").read_bytes()
    entry = mmu.vector_entry(index)
    assert entry[: len(code)] == code and len(entry) == 0x80
    assert mmu.FAULT_MMIO + 8 * index == MMIO + 0x800 + 8 * index


def test_mmio_hypercalls():
    assert ARCH.hypercall(Mmio(MMIO + 8 * 2, 4, True, 0x12340)) == (2, 0x12340)
    assert ARCH.hypercall(Mmio(MMIO + 8 * lib.HVT_HYPERCALL_MAX, 4, True, 1)) == (8, 1)
    assert ARCH.hypercall(Mmio(MMIO, 4, True, 1)) is None  # number 0
    assert ARCH.hypercall(Mmio(MMIO + 8 * 9, 4, True, 1)) is None
    assert ARCH.hypercall(Mmio(MMIO + 8 * 2 + 4, 4, True, 1)) is None
    assert ARCH.hypercall(Mmio(MMIO + 8 * 2, 8, True, 1)) is None  # str x, not str w
    assert ARCH.hypercall(Mmio(MMIO + 8 * 2, 4, False, 0)) is None  # a load
    assert ARCH.hypercall(IoOut(0x502, 4, 1)) is None


def test_doorbells_are_in_the_mmio_window_apart_from_hypercalls():
    addrs = set(DOORBELLS.values())
    assert lib.HVT_RING_KICK_MMIO == MMIO + 0x100  # the spec's ring kick
    assert len(addrs) == 3
    for addr in addrs:
        assert MMIO + 8 * (lib.HVT_HYPERCALL_MAX + 1) <= addr < mmu.FAULT_MMIO


@pytest.mark.parametrize(
    ("esr", "far", "words"),
    [
        (0x25 << 26 | 1 << 6 | 0x0F, 0x101000, "write to read-only memory at 0x101000"),
        (0x21 << 26 | 0x0F, 0x106000, "instruction fetch from non-executable memory"),
        (0x25 << 26 | 0x07, 0x8, "unmapped page zero at 0x8"),
        (0x25 << 26 | 0x07, 0x80000000, "outside guest memory"),
        (0x00 << 26, 0, "undefined instruction at 0x100abc"),
    ],
)
def test_faults_read_from_esr_and_far(esr, far, words):
    assert words in faults.explain_exception(64 * MIB, esr, far, 0x100ABC)
