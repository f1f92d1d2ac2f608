"""Edges of the guest-memory accessor's Python side that a whole-file
mutation run of pyvmm/kvm/memory.py found untested: which access a raw
pointer asks for, a string at address 0, which page of a file mapping is
gone (and none when the file is whole), the address a struct field on a
gone page is named by, a protection without read, a zero-fill's end, an
empty file mapping, and the message of an mprotect the host refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyvmm._native import ffi, lib
from pyvmm.common.errors import GuestFault, HostError
from pyvmm.kvm.memory import PAGE_SIZE, GuestMemory, Protection
from testkit import helpers

MIB = 1 << 20
BASE = 0x200000


@pytest.fixture
def memory():
    with GuestMemory(4 * MIB) as mem:
        yield mem


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """Four pages of a file, byte i = i & 0xff."""
    path = tmp_path / "image.bin"
    path.write_bytes(bytes(i & 0xFF for i in range(4 * PAGE_SIZE)))
    return path


def test_a_pointer_for_writing_needs_writable_memory_and_one_for_reading_does_not(memory):
    memory.protect(BASE, PAGE_SIZE, Protection(read=True, write=False, execute=False))
    with pytest.raises(GuestFault, match="read-only memory"):
        memory.pointer(BASE, 16, write=True)
    assert memory.pointer(BASE, 16, write=False) != ffi.NULL
    assert memory.pointer(BASE + PAGE_SIZE, 16, write=True) != ffi.NULL


def test_a_string_at_address_0_is_read(memory):
    memory.write(0, b"abc\0")
    assert memory.read_cstring(0, 10) == b"abc"


def test_a_whole_file_mapping_has_no_page_gone(memory, image):
    fd = os.open(image, os.O_RDONLY)
    try:
        assert memory.map_file(BASE, 4 * PAGE_SIZE, fd, 0) == 0
    finally:
        os.close(fd)
    assert memory.gone_page() is None


@pytest.mark.parametrize(
    "size, gone", [(PAGE_SIZE, BASE + PAGE_SIZE), (PAGE_SIZE + 1, BASE + 2 * PAGE_SIZE)]
)
def test_the_first_page_gone_is_the_first_the_file_no_longer_reaches(memory, image, size, gone):
    """A file cut to one page and a byte still backs its second page."""
    fd = os.open(image, os.O_RDONLY)
    try:
        assert memory.map_file(BASE, 4 * PAGE_SIZE, fd, 0) == 0
    finally:
        os.close(fd)  # the memory keeps its own descriptor to ask the size
    os.truncate(image, size)  # nothing here touches the pages
    assert memory.gone_page() == gone


def test_an_empty_file_mapping_is_refused(memory, image):
    fd = os.open(image, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="whole pages"):
            memory.map_file(BASE, 0, fd, 0)
    finally:
        os.close(fd)


def test_a_struct_field_on_a_page_gone_is_named_by_its_own_address(image):
    """hvt_hc_poll's ready_set (offset 8) on the page past the one kept:
    reading or writing it is a guest fault at that field's address."""
    code = f"""
        import os
        from pyvmm.common.errors import GuestFault
        from pyvmm.kvm.memory import GuestMemory
        memory = GuestMemory(4 << 20)
        fd = os.open({str(image)!r}, os.O_RDONLY)
        assert memory.map_file({BASE}, {4 * PAGE_SIZE}, fd, 0) == 0
        arg = memory.struct("struct hvt_hc_poll", {BASE + PAGE_SIZE - 8}, what="poll hypercall")
        os.truncate({str(image)!r}, {PAGE_SIZE})
        assert arg.timeout_nsecs == int.from_bytes(bytes(range(248, 256)), "little")
        for action in ("read", "write"):
            try:
                if action == "read":
                    arg.ready_set
                else:
                    arg.ready_set = 1
            except GuestFault as e:
                print(e)
    """
    done = helpers.run_python(code)
    assert done.returncode == 0, done.stderr
    where = f"{BASE + PAGE_SIZE:#x}+0x8"
    assert (
        done.stdout.splitlines()
        == [
            f"guest fault: poll hypercall at {where}: its pages are gone "
            "(the file they were mapped from was truncated)"
        ]
        * 2
    )


def test_a_protection_without_read_asks_for_nothing_it_does_not_name():
    assert Protection(read=False, write=False, execute=False).native == 0
    assert Protection(read=False, write=True, execute=False).native == lib.PYVMM_PROT_WRITE
    assert Protection(read=True, write=False, execute=True).native == (
        lib.PYVMM_PROT_READ | lib.PYVMM_PROT_EXEC
    )


def test_a_zero_fill_ends_where_it_was_asked_to(memory):
    pattern = b"\xa5" * (2 * PAGE_SIZE)
    memory.write(BASE, pattern * 3)
    memory.zero(BASE + 2 * PAGE_SIZE, 2 * PAGE_SIZE)
    assert memory.read(BASE, 2 * PAGE_SIZE) == pattern
    assert memory.read(BASE + 2 * PAGE_SIZE, 2 * PAGE_SIZE) == bytes(2 * PAGE_SIZE)
    assert memory.read(BASE + 4 * PAGE_SIZE, 2 * PAGE_SIZE) == pattern


def test_an_mprotect_the_host_refuses_is_named_by_its_errno():
    """Under the sandbox, which refuses executable memory, a protection
    with execute is a HostError naming EPERM's text."""
    from pyvmm.host import sandbox

    prog = sandbox.bound(vm_fd=0, vcpu_fd=0)

    def action() -> str:
        memory = GuestMemory(4 * MIB)
        if lib.pyvmm_sandbox_load(ffi.from_buffer(prog), len(prog)) != 0:
            return "load-failed"
        try:
            memory.protect(BASE, PAGE_SIZE, Protection(read=True, execute=True))
        except HostError as err:
            return str(err)
        return "no error"

    said = helpers.answer_in_fork(action)
    assert said == "mprotect of guest memory failed: Operation not permitted"


def test_closed_memory_has_no_host_address_and_a_second_close_does_nothing():
    """Callers read ``host_addr`` (the snapshot writer, the gdb stub): once
    unmapped it is 0, so a second close unmaps nothing."""
    memory = GuestMemory(4 * MIB)
    closed: list[int] = []
    memory.on_close(lambda: closed.append(1))
    memory.close()
    assert memory.host_addr == 0
    memory.close()
    assert memory.host_addr == 0 and closed == [1]


def test_a_string_starting_with_its_nul_is_empty_and_one_past_the_end_a_fault(memory):
    memory.write(BASE, b"\0abc")
    assert memory.read_cstring(BASE, 10) == b""
    with pytest.raises(GuestFault, match="outside guest memory"):
        memory.read_cstring(memory.size, 10)


def _resident(memory: GuestMemory, gpa: int, pages: int) -> list[bool]:
    """Which of the pages at ``gpa`` are in RAM (mincore)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    vec = ctypes.create_string_buffer(pages)
    assert libc.mincore(memory.host_addr + gpa, pages * PAGE_SIZE, vec) == 0
    return [bool(b & 1) for b in vec.raw]


def test_a_zero_fill_of_whole_pages_drops_them_and_writes_the_edges(memory):
    """The whole pages of the range leave RAM (they read as zero), the
    partial pages at its edges are written."""
    memory.write(BASE, b"\xa5" * (8 * PAGE_SIZE))
    memory.zero(BASE + PAGE_SIZE + 8, 6 * PAGE_SIZE - 16)
    assert _resident(memory, BASE, 8) == [True, True] + [False] * 4 + [True, True]
    assert memory.read(BASE + PAGE_SIZE, 8) == b"\xa5" * 8
    assert memory.read(BASE + PAGE_SIZE + 8, 6 * PAGE_SIZE - 16) == bytes(6 * PAGE_SIZE - 16)
    assert memory.read(BASE + 7 * PAGE_SIZE - 8, 8) == b"\xa5" * 8


def test_a_zero_fill_the_host_refuses_is_named_by_its_errno(memory):
    """madvise(MADV_DONTNEED) refuses locked pages (EINVAL)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.munlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    addr = memory.host_addr + BASE
    assert libc.mlock(addr, 4 * PAGE_SIZE) == 0, os.strerror(ctypes.get_errno())
    try:
        with pytest.raises(HostError, match=r"^madvise of guest memory failed: Invalid argument$"):
            memory.zero(BASE, 4 * PAGE_SIZE)
    finally:
        libc.munlock(addr, 4 * PAGE_SIZE)


def test_a_string_limit_of_zero_or_less_reads_nothing(memory):
    memory.write(BASE, b"abc\0")
    assert memory.read_cstring(BASE, 0) == b""
    assert memory.read_cstring(BASE, -5) == b""


def test_a_negative_length_is_outside_guest_memory(memory):
    with pytest.raises(GuestFault, match="outside guest memory"):
        memory.check(BASE, -1)


def test_a_file_mapping_of_part_of_a_page_is_refused(memory, image):
    fd = os.open(image, os.O_RDONLY)
    try:
        for gpa, length, offset in ((BASE, 100, 0), (BASE + 8, PAGE_SIZE, 0), (BASE, PAGE_SIZE, 8)):
            with pytest.raises(ValueError, match="whole pages"):
                memory.map_file(gpa, length, fd, offset)
    finally:
        os.close(fd)


def test_read_only_ranges_merge_and_stay_apart_as_given(memory):
    ro = Protection(read=True, write=False, execute=False)
    for gpa in (BASE, BASE + 4 * PAGE_SIZE, BASE + PAGE_SIZE):
        memory.protect(gpa, PAGE_SIZE, ro)
    assert memory.read_only_ranges() == [
        (BASE, BASE + 2 * PAGE_SIZE),
        (BASE + 4 * PAGE_SIZE, BASE + 5 * PAGE_SIZE),
    ]
    assert memory.is_read_only(BASE + PAGE_SIZE, BASE + 2 * PAGE_SIZE)
    assert not memory.is_read_only(BASE + 2 * PAGE_SIZE, BASE + 4 * PAGE_SIZE)


def test_a_protection_reads_and_writes_unless_told_otherwise():
    assert (Protection().read, Protection().write, Protection().execute) == (True, True, False)
    assert Protection(write=False).native == lib.PYVMM_PROT_READ


@pytest.mark.parametrize("size", [0, -PAGE_SIZE, PAGE_SIZE + 1])
def test_guest_memory_of_no_pages_or_part_of_one_is_refused(size):
    with pytest.raises(ValueError):
        GuestMemory(size)


def test_a_one_byte_string_at_the_last_byte_of_memory_is_read(memory):
    memory.write(memory.size - 1, b"z")
    assert memory.read_cstring(memory.size - 1, 1) == b"z"


def test_a_string_without_its_nul_is_cut_at_the_limit(memory):
    memory.write(BASE, b"abcdef")
    assert memory.read_cstring(BASE, 3) == b"abc"


def test_a_store_on_the_guests_behalf_lands_and_a_read_only_page_refuses_it(memory):
    memory.store(BASE, b"frame")
    assert memory.read(BASE, 5) == b"frame"
    memory.protect(BASE, PAGE_SIZE, Protection(read=True, write=False, execute=False))
    with pytest.raises(GuestFault, match="read-only memory"):
        memory.store(BASE, b"x")


def test_a_mapping_past_the_files_end_is_gone_from_its_first_page(memory, image):
    """An offset past what the file keeps: every page of the range is gone."""
    fd = os.open(image, os.O_RDONLY)
    try:
        assert memory.map_file(BASE, 2 * PAGE_SIZE, fd, 2 * PAGE_SIZE) == 0
    finally:
        os.close(fd)
    os.truncate(image, PAGE_SIZE)
    assert memory.gone_page() == BASE


def test_memory_the_host_cannot_map_is_named_by_its_size_and_errno():
    with pytest.raises(HostError) as err:
        GuestMemory(1 << 48)  # 256 TiB: past a 47-bit user address space
    assert str(err.value) == (
        f"cannot map {(1 << 48) // MIB} MiB of guest memory: Cannot allocate memory"
    )


def test_closing_memory_closes_the_file_mappings_descriptors(image):
    memory = GuestMemory(4 * MIB)
    fd = os.open(image, os.O_RDONLY)
    try:
        before = set(os.listdir("/proc/self/fd"))
        assert memory.map_file(BASE, PAGE_SIZE, fd, 0) == 0
        assert len(set(os.listdir("/proc/self/fd")) - before) == 1  # its own dup
        memory.close()
        assert set(os.listdir("/proc/self/fd")) <= before
    finally:
        os.close(fd)
        memory.close()


def test_a_negative_address_is_outside_guest_memory(memory):
    with pytest.raises(GuestFault, match="outside guest memory"):
        memory.check(-1, 1)


def test_a_pointer_is_for_writing_unless_told_otherwise(memory):
    memory.protect(BASE, PAGE_SIZE, Protection(read=True, write=False, execute=False))
    with pytest.raises(GuestFault, match="read-only memory"):
        memory.pointer(BASE, 16)


def test_a_file_the_kernel_will_not_map_gives_its_errno_and_zero_pages(memory):
    """A pipe cannot be mapped (ENODEV): the errno, positive, and the range
    is anonymous memory again."""
    import errno

    memory.write(BASE, b"\xa5" * PAGE_SIZE)
    read, write = os.pipe()
    try:
        assert memory.map_file(BASE, PAGE_SIZE, read, 0) == errno.ENODEV
    finally:
        os.close(read)
        os.close(write)
    assert memory.read(BASE, PAGE_SIZE) in (bytes(PAGE_SIZE), b"\xa5" * PAGE_SIZE)
    memory.write(BASE, b"ok")
    assert memory.read(BASE, 2) == b"ok"


def test_protect_takes_whole_pages_only(memory):
    ro = Protection(read=True, write=False, execute=False)
    for gpa, length in ((BASE + 8, PAGE_SIZE), (BASE, PAGE_SIZE + 8)):
        with pytest.raises(ValueError, match="whole pages"):
            memory.protect(gpa, length, ro)


def test_a_read_only_range_inside_another_keeps_the_outer_ones_end(memory):
    ro = Protection(read=True, write=False, execute=False)
    memory.protect(BASE + PAGE_SIZE, PAGE_SIZE, ro)
    memory.protect(BASE + 4 * PAGE_SIZE, 4 * PAGE_SIZE, ro)
    memory.protect(BASE + 5 * PAGE_SIZE, PAGE_SIZE, ro)
    assert memory.read_only_ranges() == [
        (BASE + PAGE_SIZE, BASE + 2 * PAGE_SIZE),
        (BASE + 4 * PAGE_SIZE, BASE + 8 * PAGE_SIZE),
    ]


def test_a_struct_has_only_its_fields(memory):
    arg = memory.struct("struct hvt_hc_poll", BASE, what="test")
    assert not hasattr(arg, "no_such_field")
    with pytest.raises(AttributeError):
        arg.no_such_field = 1


def test_a_string_near_the_end_of_memory_stops_at_the_end(memory):
    memory.write(memory.size - 4, b"abc\0")
    assert memory.read_cstring(memory.size - 4, 100) == b"abc"
    memory.write(memory.size - 3, b"xyz")  # no NUL before the end
    assert memory.read_cstring(memory.size - 3, 100) == b"xyz"


def test_a_string_at_a_negative_address_is_a_one_byte_fault(memory):
    with pytest.raises(GuestFault, match=r"-0x1\+0x1 is outside guest memory"):
        memory.read_cstring(-1, 10)


def test_adjacent_read_only_ranges_after_another_merge_into_the_last(memory):
    ro = Protection(read=True, write=False, execute=False)
    for gpa in (BASE + PAGE_SIZE, BASE + 4 * PAGE_SIZE, BASE + 5 * PAGE_SIZE):
        memory.protect(gpa, PAGE_SIZE, ro)
    assert memory.read_only_ranges() == [
        (BASE + PAGE_SIZE, BASE + 2 * PAGE_SIZE),
        (BASE + 4 * PAGE_SIZE, BASE + 6 * PAGE_SIZE),
    ]
