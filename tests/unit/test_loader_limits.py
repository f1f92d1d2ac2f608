"""What a hostile executable can make the loader do is bounded and linear.

The review's file: N one-byte PT_LOAD segments took 1.1 s at N=4,000,
13.6 s at 16,000 and over 120 s at 65,000 (a quadratic protection pass, run
twice, and a read-only set re-sorted per range). Now the program headers
are capped (one LoaderError line) and the pass is one sweep.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from elfbuild import (
    BASE,
    PF_R,
    PF_W,
    PF_X,
    Elf,
    Seg,
    abi_note,
    devices,
    manifest_desc,
    manifest_note,
)
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pyvmm.common.errors import LoaderError
from pyvmm.kvm.memory import PAGE_SIZE, GuestMemory, Protection
from pyvmm.loader import load_kernel, page_protections, place
from pyvmm.loader.elf import MAX_PROGRAM_HEADERS, Segment

FLAGS = [PF_R, PF_R | PF_W, PF_R | PF_X, PF_R | PF_W | PF_X]


def one_byte_segments(n: int, step: int = 1) -> bytes:
    notes = [abi_note(), manifest_note(manifest_desc(devices()))]
    segs = [Seg(BASE + i * step, b"\x90", FLAGS[i % 4]) for i in range(n)]
    return Elf(segments=segs, notes=notes, entry=BASE).build()


def test_65000_one_byte_segments_are_refused_in_one_line_at_once(tmp_path: Path) -> None:
    path = tmp_path / "many.hvt"
    path.write_bytes(one_byte_segments(65000))
    started = time.monotonic()
    with pytest.raises(LoaderError) as err:
        load_kernel(str(path), "x86_64")
    assert time.monotonic() - started < 2
    assert str(err.value) == (
        f"{path}: too many program headers (65002, at most {MAX_PROGRAM_HEADERS})"
    )


@pytest.mark.parametrize("step", [1, PAGE_SIZE, 3000], ids=["same-page", "page-each", "mixed"])
def test_as_many_segments_as_allowed_load_fast(tmp_path: Path, step: int) -> None:
    path = tmp_path / "max.hvt"
    path.write_bytes(one_byte_segments(MAX_PROGRAM_HEADERS - 2, step))
    started = time.monotonic()
    kernel = load_kernel(str(path), "x86_64")
    with GuestMemory(16 << 20) as memory:
        place(kernel, memory)
    assert time.monotonic() - started < 2


def _segments(specs):
    return tuple(
        Segment(paddr=p, offset=0, filesz=size, memsz=size, flags=f, index=i)
        for i, (p, size, f) in enumerate(specs)
    )


def test_the_protection_pass_is_linear_in_the_segments() -> None:
    """65,000 segments straight to the pass (the cap aside): seconds at most
    on a loaded machine, about 0.3 s idle (the quadratic pass took minutes)."""
    for step in (1, PAGE_SIZE):
        kernel = SimpleNamespace(
            segments=_segments((BASE + i * step, 1, FLAGS[i % 4]) for i in range(65000))
        )
        started = time.monotonic()
        runs = page_protections(kernel)
        assert time.monotonic() - started < 10
        assert runs[0].start == BASE


def test_many_read_only_ranges_are_protected_in_one_update() -> None:
    ro, rw = Protection(read=True, write=False), Protection(read=True, write=True)
    ranges = [(BASE + i * PAGE_SIZE, PAGE_SIZE, ro if i % 2 else rw) for i in range(4000)]
    with GuestMemory(32 << 20) as memory:
        started = time.monotonic()
        memory.protect_all(ranges)
        assert time.monotonic() - started < 2
        assert len(memory.read_only_ranges()) == 2000


def reference(segments) -> list[tuple[int, int, bool, bool]]:
    """Page by page: the union of the flags of every segment on a page."""
    pages: dict[int, tuple[bool, bool]] = {}
    for seg in segments:
        lo = seg.paddr // PAGE_SIZE * PAGE_SIZE
        hi = -(-seg.end // PAGE_SIZE) * PAGE_SIZE
        for page in range(lo, hi, PAGE_SIZE):
            w, x = pages.get(page, (False, False))
            pages[page] = (w or seg.writable, x or seg.executable)
    return sorted((p, p + PAGE_SIZE, w, x) for p, (w, x) in pages.items())


@st.composite
def layouts(draw):
    """Sorted, non-overlapping segments, often sharing pages."""
    at, specs = BASE, []
    for _ in range(draw(st.integers(1, 12))):
        at += draw(st.sampled_from([0, 1, 7, PAGE_SIZE - 1, PAGE_SIZE, 3 * PAGE_SIZE]))
        size = draw(st.sampled_from([1, 2, 100, PAGE_SIZE - 1, PAGE_SIZE, 2 * PAGE_SIZE + 5]))
        specs.append((at, size, draw(st.sampled_from(FLAGS))))
        at += size
    return _segments(specs)


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_the_sweep_gives_the_page_by_page_union(segments) -> None:
    runs = page_protections(SimpleNamespace(segments=segments))
    pages = []
    for run in runs:
        for page in range(run.start, run.start + run.length, PAGE_SIZE):
            pages.append((page, page + PAGE_SIZE, run.protection.write, run.protection.execute))
    shared = len({s.paddr // PAGE_SIZE for s in segments}) < len(segments)
    event("segments share a page" if shared else "no page shared")
    assert pages == reference(segments)
    assert all(a.start + a.length <= b.start for a, b in zip(runs, runs[1:], strict=False))
