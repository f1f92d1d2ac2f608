"""Which image pages are mapped from the file, which files may be, and that
place() gives the same guest memory whether it maps or copies
(pyvmm/loader/sharing.py; tests/test_image_sharing.py boots guests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from elfbuild import good_elf

from pyvmm.common.record import replace
from pyvmm.kvm.memory import GuestMemory
from pyvmm.loader import Kernel, Segment, load_kernel, place
from pyvmm.loader.elf import PF_R, PF_W, PF_X
from pyvmm.loader.lease import HELD
from pyvmm.loader.sharing import ENV_SWITCH, FileIdentity, FileRun, file_runs, refusal

MIB = 1 << 20
PAGE = 0x1000
BASE = 0x100000


def seg(
    paddr: int, offset: int, filesz: int, memsz: int | None = None, flags: int = PF_R
) -> Segment:
    return Segment(paddr, offset, filesz, filesz if memsz is None else memsz, flags)


# -- file_runs: the bounds and alignment rule ---------------------------------


def test_whole_pages_of_a_congruent_segment_are_mapped() -> None:
    assert file_runs([seg(BASE, 0x1000, 0x2800)]) == (FileRun(BASE, 0x1000, 0x2000),)
    # A head that starts mid-page: the first whole page onwards.
    assert file_runs([seg(BASE + 0x800, 0x1800, 0x2000)]) == (
        FileRun(BASE + 0x1000, 0x2000, 0x1000),
    )


def test_a_segment_not_congruent_mod_the_page_is_copied() -> None:
    assert file_runs([seg(BASE, 0x1010, 0x4000)]) == ()


def test_a_segment_inside_one_page_is_copied() -> None:
    assert file_runs([seg(BASE + 0x10, 0x1010, 0x100)]) == ()


def test_a_page_two_segments_share_is_mapped_for_neither() -> None:
    text = seg(BASE, 0x1000, 0x1800, flags=PF_R | PF_X)
    rodata = seg(BASE + 0x1800, 0x2800, 0x1800)
    assert file_runs([text, rodata]) == (
        FileRun(BASE, 0x1000, 0x1000),
        FileRun(BASE + 0x2000, 0x3000, 0x1000),
    )


def test_bss_is_never_mapped() -> None:
    assert file_runs([seg(BASE, 0x1000, 0x1000, memsz=0x5000)]) == (FileRun(BASE, 0x1000, 0x1000),)


def test_a_writable_segment_is_never_mapped() -> None:
    # A truncation of the file would take even the pages the guest wrote.
    assert file_runs([seg(BASE, 0x1000, 0x3000, flags=PF_R | PF_W)]) == ()


# -- refusal: which files ------------------------------------------------------


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "app.hvt"
    path.write_bytes(b"x" * PAGE)
    path.chmod(0o755)
    return path


def verdict(path: Path, *, euid: int | None = None, noexec: bool = False) -> str | None:
    fd = os.open(path, os.O_RDONLY)
    try:
        euid = os.geteuid() if euid is None else euid
        return refusal(os.fstat(fd), fd, euid=euid, noexec=noexec)
    finally:
        os.close(fd)


def test_a_file_only_its_owner_can_write_is_mapped(image: Path) -> None:
    assert verdict(image) is None
    image.chmod(0o644)
    assert verdict(image) is None


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o666, 0o620])
def test_a_file_group_or_others_can_write_is_copied(image: Path, mode: int) -> None:
    image.chmod(mode)
    assert "writable by group or others" in verdict(image)


def test_a_file_of_another_user_is_copied(image: Path) -> None:
    # pyvmm running as someone else than the owner: the owner could rewrite
    # it (root excepted: root can rewrite pyvmm's memory anyway).
    owner = os.stat(image).st_uid
    if owner != 0:
        assert verdict(image, euid=owner + 1).startswith(f"owned by uid {owner}")
    else:
        assert verdict(image, euid=1000) is None
    if os.geteuid() == 0:
        os.chown(image, 65534, -1)
        assert verdict(image).startswith("owned by uid 65534")


def test_a_file_system_the_lease_cannot_watch_is_copied() -> None:
    # procfs: a regular file root owns and only root can write, on a file
    # system that is not a local disk's (as a network or FUSE one is not).
    assert "on a file system (type 0x9fa0)" in verdict(Path("/proc/self/status"))


def test_a_noexec_mount_and_the_switch_copy(image: Path, monkeypatch) -> None:
    assert verdict(image, noexec=True) == "on a noexec mount"
    monkeypatch.setenv(ENV_SWITCH, "0")
    assert verdict(image) == f"{ENV_SWITCH}=0"


# -- place(): mapped or copied, the same guest memory ---------------------------


def page_aligned_kernel(tmp_path: Path) -> tuple[Kernel, bytes]:
    """good_elf's notes with segments laid out as a linker lays them out
    (p_offset = p_vaddr mod the page), some pages shared by two segments."""
    base = load_kernel(str(_write(tmp_path / "base.hvt", good_elf().build())), "x86_64")
    blob = bytearray(os.urandom(0x8000))
    path = _write(tmp_path / "app.hvt", bytes(blob))
    segments = (
        # text: two whole pages and half of a third, shared with rodata
        Segment(BASE, 0x1000, 0x2800, 0x2800, PF_R | PF_X, 0),
        # rodata: from mid-page, whole page, then a tail
        Segment(BASE + 0x2800, 0x3800, 0x1900, 0x1900, PF_R, 1),
        # data: a whole page and a bit, then .bss over three more pages
        Segment(BASE + 0x5000, 0x6000, 0x1100, 0x4000, PF_R | PF_W, 2),
        # not congruent: copied
        Segment(BASE + 0xA000, 0x10, 0x1200, 0x1200, PF_R, 3),
    )
    segments = tuple(
        replace(s, data=memoryview(blob)[s.offset : s.offset + s.filesz]) for s in segments
    )
    kernel = replace(
        base,
        path=str(path),
        image=replace(base.image, segments=segments),
        kernel_end=max(s.end for s in segments),
        file=FileIdentity.of(os.stat(path)),
    )
    expected = bytearray(0xC000)  # guest memory from BASE, as copying gives it
    for s in segments:
        at = s.paddr - BASE
        expected[at : at + s.filesz] = blob[s.offset : s.offset + s.filesz]
    return kernel, bytes(expected)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o755)
    return path


def mapped_ranges(path: str) -> list[tuple[int, int, int]]:
    """(start, end, file offset) of this process's mappings of ``path``."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == os.path.realpath(path):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                found.append((lo, hi, int(fields[2], 16)))
    return found


@pytest.mark.parametrize("share", [True, False], ids=["mapped", "copied"])
def test_place_gives_the_same_memory_mapped_or_copied(tmp_path: Path, monkeypatch, share) -> None:
    if not share:
        monkeypatch.setenv(ENV_SWITCH, "0")
    kernel, expected = page_aligned_kernel(tmp_path)
    with GuestMemory(4 * MIB) as memory:
        memory.write(BASE + 0x6100, b"\xee" * 0x2F00)  # dirty: .bss must still be zero
        place(kernel, memory)
        assert memory.read(BASE, len(expected)) == expected
        maps = mapped_ranges(kernel.path)
        if not share:
            assert maps == []
            return
        host = memory.host_addr
        runs = file_runs(kernel.segments)
        assert [(lo - host, hi - lo, off) for lo, hi, off in maps] == [
            (r.gpa, r.length, r.offset) for r in runs
        ]
        assert memory.is_read_only(BASE, BASE + 0x4000)  # text and rodata
        assert not memory.is_read_only(BASE + 0x5000, BASE + 0x9000)


def test_the_data_segment_is_copied_and_its_writes_stay_in_memory(tmp_path: Path) -> None:
    kernel, expected = page_aligned_kernel(tmp_path)
    before = Path(kernel.path).read_bytes()
    with GuestMemory(4 * MIB) as memory:
        place(kernel, memory)
        host = memory.host_addr
        assert all(
            not lo - host <= BASE + 0x5000 < hi - host for lo, hi, _ in mapped_ranges(kernel.path)
        )
        memory.buffer(BASE + 0x5000, PAGE, write=True)[:] = b"\x11" * PAGE
        assert memory.read(BASE + 0x5000, PAGE) == b"\x11" * PAGE
    assert Path(kernel.path).read_bytes() == before


def test_a_kernel_is_read_under_a_lease_unless_asked_not_to(tmp_path: Path) -> None:
    path = _write(tmp_path / "app.hvt", good_elf().build())
    leased = load_kernel(str(path), "x86_64")
    assert leased.lease is not None and leased.lease.state == HELD
    assert isinstance(leased.segments[0].data, memoryview)
    assert os.path.realpath(path) in "".join(r for r in open("/proc/self/maps"))
    read = load_kernel(str(path), "x86_64", mapped=False)
    assert read.lease is None and read.file == leased.file


def test_a_kernel_opened_for_writing_is_read_into_memory(tmp_path: Path) -> None:
    path = _write(tmp_path / "app.hvt", good_elf().build())
    with open(path, "r+b"):
        kernel = load_kernel(str(path), "x86_64")
    assert kernel.lease is None
    assert isinstance(kernel.segments[0].data.obj, bytes)  # read, not mapped


def test_a_file_changed_since_it_was_read_is_copied(tmp_path: Path) -> None:
    kernel, expected = page_aligned_kernel(tmp_path)
    os.utime(kernel.path, ns=(1, 1))  # same bytes, but no longer provably so
    with GuestMemory(4 * MIB) as memory:
        place(kernel, memory)
        assert mapped_ranges(kernel.path) == []
        assert memory.read(BASE, len(expected)) == expected


def test_placing_writes_nothing_onto_the_mapped_pages(tmp_path: Path) -> None:
    """The segments' bytes are copied around the mapped runs, not over
    them: the runs stay the page cache's (no anonymous copy-on-write page)."""
    from testkit import smaps

    kernel, expected = page_aligned_kernel(tmp_path)
    with GuestMemory(4 * MIB) as memory:
        place(kernel, memory)
        assert memory.read(BASE, len(expected)) == expected  # every page resident
        mine = [m for m in smaps.read(os.getpid()) if m.path == os.path.realpath(kernel.path)]
        assert mine, "no run of the image was mapped"
        assert all(m["Rss"] > 0 and m["Anonymous"] == 0 for m in mine), [m.kb for m in mine]


def test_a_file_truncated_while_its_bytes_are_copied_is_a_loader_error(tmp_path: Path) -> None:
    """The segments' bytes a mapping of the file, the file cut to 64 bytes
    before place() copies them: one line, in a fresh interpreter (the copy
    meets the SIGBUS under its guard)."""
    from testkit import helpers

    path = _write(tmp_path / "app.hvt", good_elf().build())
    code = f"""
        import mmap
        import os
        from pyvmm.common.errors import LoaderError
        from pyvmm.common.record import replace
        from pyvmm.kvm.memory import GuestMemory
        from pyvmm.loader import load_kernel, place
        kernel = load_kernel({str(path)!r}, "x86_64", mapped=False)
        with open({str(path)!r}, "rb") as f:
            view = memoryview(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
        segments = tuple(
            replace(s, data=view[s.offset : s.offset + s.filesz]) for s in kernel.segments
        )
        # No file identity: nothing is mapped, every byte is copied.
        kernel = replace(kernel, image=replace(kernel.image, segments=segments), file=None)
        os.truncate({str(path)!r}, 64)
        with GuestMemory(4 << 20) as memory:
            try:
                place(kernel, memory)
            except LoaderError as err:
                print(err)
    """
    done = helpers.run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{path}: truncated while pyvmm loaded it"


def test_a_segment_of_whole_pages_is_mapped_to_its_last_byte(tmp_path: Path) -> None:
    """A run that ends exactly where the segment's file bytes end is the
    segment's own, mapped whole and left the page cache's."""
    from testkit import smaps

    base = load_kernel(str(_write(tmp_path / "base.hvt", good_elf().build())), "x86_64")
    blob = bytearray(os.urandom(0x4000))
    path = _write(tmp_path / "app.hvt", bytes(blob))
    seg = Segment(BASE, 0x1000, 0x2000, 0x2000, PF_R | PF_X, 0)
    seg = replace(seg, data=memoryview(blob)[0x1000:0x3000])
    kernel = replace(
        base,
        path=str(path),
        image=replace(base.image, segments=(seg,), entry=BASE),
        kernel_end=BASE + 0x2000,
        file=FileIdentity.of(os.stat(path)),
    )
    with GuestMemory(4 * MIB) as memory:
        place(kernel, memory)
        assert memory.read(BASE, 0x2000) == bytes(blob[0x1000:0x3000])
        host = memory.host_addr
        assert [(lo - host, hi - lo) for lo, hi, _ in mapped_ranges(kernel.path)] == [
            (BASE, 0x2000)
        ]
        mine = [m for m in smaps.read(os.getpid()) if m.path == os.path.realpath(kernel.path)]
        assert all(m["Anonymous"] == 0 for m in mine), [m.kb for m in mine]
