"""One table of guest-memory accesses, checked against the C accessor
(pyvmm_guestmem_at, csrc/guestmem.c: what the fast path and the IO thread
use) and against GuestMemory (which checks through it and words the
fault), so both languages answer every case the same way."""

from __future__ import annotations

import errno

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyvmm._native import ffi, lib
from pyvmm.common.errors import GuestFault
from pyvmm.kvm.memory import GuestMemory, Protection

MIB = 1 << 20
SIZE = 4 * MIB
LOW = lib.PYVMM_LOW_AREA_END
RO = (0x200000, 0x203000)  # protected read-only, like an ELF's text
READ, WRITE, SETUP = "read", "write", "setup"
ACCESS = {READ: lib.PYVMM_GM_READ, WRITE: lib.PYVMM_GM_WRITE, SETUP: lib.PYVMM_GM_SETUP}
OK, OUTSIDE, READ_ONLY = "ok", "is outside guest memory", "is read-only memory"

CASES = [
    # gpa, length, access, expected
    (0x0, 8, READ, OK),
    (0x10000, 64, READ, OK),  # the boot info: the host may read it
    (0x10000, 8, WRITE, READ_ONLY),  # but never write it for the guest
    (0x8000, 0x800, WRITE, READ_ONLY),  # a page table
    (LOW - 1, 1, WRITE, READ_ONLY),
    (LOW - 1, 2, WRITE, READ_ONLY),  # straddles the end of the low area
    (LOW, 0x1000, WRITE, OK),
    (0x10000, 8, SETUP, OK),  # the host's own set-up writes the low area
    (0x8000, 0x1000, SETUP, OK),
    (0x10000, 0, WRITE, OK),  # nothing written
    (RO[0], 1, READ, OK),
    (RO[0], 1, WRITE, READ_ONLY),
    (RO[0], 1, SETUP, READ_ONLY),  # mapped read-only: not even set-up
    (RO[0] - 1, 2, WRITE, READ_ONLY),
    (RO[1] - 1, 1, SETUP, READ_ONLY),
    (RO[1], 0x1000, WRITE, OK),
    (RO[0] - 0x1000, 0x1000, WRITE, OK),
    (RO[0], 0, WRITE, OK),
    (SIZE - 8, 8, WRITE, OK),
    (SIZE - 8, 9, READ, OUTSIDE),
    (SIZE, 0, READ, OK),
    (SIZE, 1, READ, OUTSIDE),
    (SIZE + 0x1000, 8, SETUP, OUTSIDE),
    (0x1000, 2**64 - 0x800, READ, OUTSIDE),  # gpa + len wraps around
    (2**64 - 1, 2, WRITE, OUTSIDE),
    (0x10000, SIZE, WRITE, OUTSIDE),  # outside wins over read-only
]


@pytest.fixture(scope="module")
def memory():
    with GuestMemory(SIZE) as mem:
        mem.protect(RO[0], RO[1] - RO[0], Protection(read=True, write=False, execute=True))
        yield mem


@pytest.mark.parametrize("gpa,length,access,expected", CASES)
def test_c_accessor(memory, gpa, length, access, expected):
    ptr = lib.pyvmm_guestmem_at(memory.view, gpa, length, ACCESS[access])
    if expected == OK:
        assert int(ffi.cast("uintptr_t", ptr)) == memory.host_addr + gpa
    else:
        assert ptr == ffi.NULL


@pytest.mark.parametrize("gpa,length,access,expected", CASES)
def test_python_check(memory, gpa, length, access, expected):
    def attempt():
        if access == SETUP:
            memory.write(gpa, bytes(length), what="test")
        else:
            memory.check(gpa, length, write=access == WRITE, what="test")

    if expected == OK:
        attempt()
    else:
        with pytest.raises(GuestFault, match=f"bad pointer in test: {gpa:#x}\\+{length:#x} "):
            attempt()
        with pytest.raises(GuestFault, match=expected):
            attempt()


def model(gpa: int, length: int, access: str) -> str:
    """The rule of csrc/guestmem.h, written out independently."""
    if gpa + length > SIZE:
        return OUTSIDE
    if access == READ or length == 0:
        return OK
    if access == WRITE and gpa < LOW:
        return READ_ONLY
    return READ_ONLY if gpa < RO[1] and RO[0] < gpa + length else OK


@given(
    st.integers(0, SIZE + 0x2000) | st.sampled_from([LOW - 8, RO[0] - 8, RO[1] - 8]),
    st.integers(0, 0x4000),
    st.sampled_from([READ, WRITE, SETUP]),
)
def test_accessor_agrees_with_the_written_rule(gpa, length, access):
    with GuestMemory(SIZE) as mem:
        mem.protect(RO[0], RO[1] - RO[0], Protection(read=True, write=False))
        ptr = lib.pyvmm_guestmem_at(mem.view, gpa, length, ACCESS[access])
        assert (ptr != ffi.NULL) == (model(gpa, length, access) == OK)


@pytest.mark.parametrize("ranges", [1, 2, 3])
def test_every_read_only_range_is_checked_not_only_the_first(ranges):
    """An image has several (text, rodata, the guest's own protections):
    a write into the last of them is refused as into the first."""
    with GuestMemory(SIZE) as mem:
        starts = [0x200000 + i * 0x10000 for i in range(ranges)]
        for start in starts:
            mem.protect(start, 0x1000, Protection(read=True, write=False))
        for start in starts:
            for gpa, length in ((start, 1), (start + 0xFFF, 1), (start - 8, 9)):
                assert lib.pyvmm_guestmem_at(mem.view, gpa, length, ACCESS[WRITE]) == ffi.NULL
            assert lib.pyvmm_guestmem_at(mem.view, start + 0x1000, 8, ACCESS[WRITE]) != ffi.NULL


def test_a_closed_memory_refuses_everything():
    mem = GuestMemory(2 * MIB)
    mem.close()
    assert lib.pyvmm_guestmem_at(mem.view, LOW, 8, lib.PYVMM_GM_READ) == ffi.NULL


def test_is_read_only_reports_protected_pages_only(memory):
    assert memory.is_read_only(RO[0], RO[0] + 1)
    assert not memory.is_read_only(0x10000, 0x10001)  # low area: writable to the host
    assert not memory.is_read_only(RO[1], RO[1] + 1)
    assert memory.read_only_ranges() == [RO]


@pytest.mark.parametrize("gpa,length,access,expected", [c for c in CASES if c[2] == READ])
def test_the_guarded_read_checks_as_the_accessor(memory, gpa, length, access, expected):
    """pyvmm_guestmem_read (what GuestMemory.read copies with, surviving a
    page its file lost: tests/unit/test_image_lease.py) refuses what the
    accessor refuses, and copies the bytes otherwise."""
    out = bytearray(length if expected == OK else 1)  # a refusal touches nothing
    err = lib.pyvmm_guestmem_read(memory.view, ffi.from_buffer(out), gpa, length)
    if expected != OK:
        assert err == -errno.EINVAL
        return
    assert err == 0
    host = ffi.cast("uint8_t *", memory.host_addr + gpa)
    assert bytes(out) == bytes(ffi.buffer(host, length))
