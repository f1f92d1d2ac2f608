"""ELF64 parsing: every malformed file is one clear LoaderError, never a traceback."""

from __future__ import annotations

import struct

import pytest
from elfbuild import (
    BASE,
    EHDR,
    EM_AARCH64,
    ET_DYN,
    PF_R,
    PF_W,
    PF_X,
    PHDR,
    PT_GNU_STACK,
    PT_LOAD,
    Elf,
    NoteSpec,
    Seg,
    abi_note,
    good_elf,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyvmm.common.errors import LoaderError
from pyvmm.loader import Manifest, parse_elf, read_abi
from pyvmm.loader.notes import SOLO5_ABI, SOLO5_MANIFEST, find_note

GOOD = good_elf().build()


def rejects(data: bytes, match: str) -> None:
    with pytest.raises(LoaderError, match=match) as info:
        parse_elf(data, "app.hvt")
    assert str(info.value).startswith("app.hvt: ")
    assert "\n" not in str(info.value)


def test_parses_a_good_image() -> None:
    image = parse_elf(GOOD, "app.hvt")
    assert image.source == "app.hvt"
    assert image.machine == "x86_64"
    assert image.entry == BASE + 0x10
    text, rodata, data = image.segments
    assert (text.paddr, text.filesz, text.memsz) == (BASE, 5120, 5120)
    assert (text.readable, text.writable, text.executable) == (True, False, True)
    assert (rodata.readable, rodata.writable, rodata.executable) == (True, False, False)
    assert (data.readable, data.writable, data.executable) == (True, True, False)
    assert data.memsz == 0x1800 and data.end == BASE + 0x3000 + 0x1800
    assert data.data == b"\xa5" * 100
    assert [n.name for n in image.notes] == [b"Solo5", b"Solo5"]


def test_names_aarch64_and_unknown_machines() -> None:
    assert parse_elf(good_elf(machine=EM_AARCH64).build(), "a").machine == "aarch64"
    assert parse_elf(good_elf(machine=40).build(), "a").machine == "unknown(40)"


def test_reads_the_manifest_descriptor_from_the_8_aligned_offset() -> None:
    image = parse_elf(GOOD, "app.hvt")
    mft = find_note(image, SOLO5_MANIFEST.owner, SOLO5_MANIFEST.type)
    assert mft is not None
    assert mft.desc_offset == 20  # 12-byte header + "Solo5\0" padded to 8
    assert mft.desc[:4] == b"\0\0\0\0"  # the padding n_descsz counts
    assert mft.aligned_desc(8)[:8] == struct.pack("<II", 1, 2)  # version 1, 2 entries
    abi = find_note(image, SOLO5_ABI.owner, SOLO5_ABI.type)
    assert abi is not None and abi.aligned_desc(4) == abi.desc
    assert len(abi.desc) == 16


def test_reads_every_note_of_a_shared_note_segment() -> None:
    image = parse_elf(good_elf(notes_in_one_segment=True).build(), "app.hvt")
    assert [n.type for n in image.notes] == [SOLO5_ABI.type, SOLO5_MANIFEST.type]
    assert image.notes[1].aligned_desc(8)[:4] == struct.pack("<I", 1)


def test_ignores_other_program_header_types() -> None:
    elf = good_elf(extra_phdrs=[(PT_GNU_STACK, PF_R | PF_W, 0, 0, 0, 0, 0, 16)])
    assert len(parse_elf(elf.build(), "a").segments) == 3


def test_skips_load_segments_without_file_bytes() -> None:
    elf = good_elf()
    elf.segments.append(Seg(BASE + 0x5000, b"", PF_R | PF_W, memsz=0x4000))
    image = parse_elf(elf.build(), "app.hvt")
    assert [s.paddr for s in image.segments] == [BASE, BASE + 0x2000, BASE + 0x3000]


def test_skipped_segment_is_not_checked_at_all() -> None:
    # solo5-hvt ignores a p_filesz == 0 PT_LOAD entirely, wherever it points.
    elf = good_elf()
    elf.segments.append(Seg(0, b"", PF_R | PF_W, memsz=1 << 63, offset=1 << 40))
    assert len(parse_elf(elf.build(), "a").segments) == 3


def test_sorts_segments_by_address() -> None:
    elf = good_elf()
    elf.segments.reverse()
    image = parse_elf(elf.build(), "a")
    assert [s.paddr for s in image.segments] == [BASE, BASE + 0x2000, BASE + 0x3000]
    assert [s.index for s in image.segments] == [4, 3, 2]


def test_rejects_a_file_that_is_not_elf() -> None:
    rejects(b"#!/bin/sh\necho hello\n" * 10, r"^app\.hvt: not an ELF file$")


def test_rejects_an_empty_file() -> None:
    rejects(b"", r"^app\.hvt: not an ELF file$")


def test_rejects_a_truncated_file_header() -> None:
    rejects(GOOD[:10], r"truncated ELF \(file header is 10 bytes, need 64\)")
    rejects(GOOD[:40], r"truncated ELF \(file header is 40 bytes, need 64\)")


def test_rejects_a_truncated_program_header_table() -> None:
    cut = EHDR.size + 2 * PHDR.size + 10
    rejects(GOOD[:cut], r"^app\.hvt: truncated ELF \(program header 2 past end of file\)$")


def test_rejects_program_headers_claimed_past_the_end() -> None:
    rejects(good_elf(phnum=200).build(), r"truncated ELF \(program header \d+ past end of file\)")


def test_rejects_a_truncated_segment() -> None:
    rejects(GOOD[:-50], r"^app\.hvt: truncated ELF \(segment 4 past end of file\)$")


def test_rejects_a_segment_whose_offset_is_past_the_end() -> None:
    elf = good_elf()
    elf.segments[0].offset = 1 << 62
    rejects(elf.build(), r"truncated ELF \(segment 2 past end of file\)")


def test_rejects_a_truncated_note_segment() -> None:
    data = good_elf(segments=[]).build()  # without segments the notes come last
    rejects(data[:-8], r"truncated ELF \(note segment 1 past end of file\)")


def test_rejects_a_note_running_past_its_segment() -> None:
    bad = NoteSpec(b"Solo5", SOLO5_ABI.type, bytes(16), descsz=4096)
    rejects(good_elf(notes=[bad]).build(), r"malformed note in program header 0")


def test_rejects_a_32_bit_elf() -> None:
    rejects(good_elf(ei_class=1).build(), r"^app\.hvt: 32-bit ELF file, need ELF64$")


def test_rejects_an_unknown_elf_class() -> None:
    rejects(good_elf(ei_class=7).build(), r"unknown ELF class 7")


def test_rejects_a_big_endian_elf() -> None:
    rejects(good_elf(ei_data=2).build(), r"^app\.hvt: big-endian ELF file, need little-endian$")


def test_rejects_a_bad_elf_version() -> None:
    data = bytearray(GOOD)
    data[6] = 2
    rejects(bytes(data), r"unsupported ELF version 2")


def test_rejects_a_shared_object_or_pie() -> None:
    rejects(good_elf(e_type=ET_DYN).build(), r"ELF type is ET_DYN .*need ET_EXEC")


def test_rejects_an_object_file() -> None:
    rejects(good_elf(e_type=1).build(), r"ELF type is ET_REL")


def test_rejects_a_bad_header_size() -> None:
    rejects(good_elf(ehsize=52).build(), r"bad ELF header size 52, need 64")


def test_rejects_a_bad_program_header_size() -> None:
    rejects(good_elf(phentsize=32).build(), r"bad program header size 32, need 56")


def test_rejects_a_file_without_program_headers() -> None:
    rejects(good_elf(phnum=0).build(), r"no program headers")


def test_rejects_a_file_without_loadable_segments() -> None:
    rejects(good_elf(segments=[]).build(), r"no loadable segments")


def test_rejects_a_segment_with_filesz_larger_than_memsz() -> None:
    elf = good_elf()
    elf.segments[2].memsz = 10
    rejects(elf.build(), r"segment 4 has p_filesz 0x64 larger than p_memsz 0xa")


def test_rejects_a_segment_wrapping_the_address_space() -> None:
    elf = good_elf()
    elf.segments[2].paddr = (1 << 64) - 0x1000
    rejects(elf.build(), r"segment 4 wraps around the end of the address space")


def test_rejects_a_segment_whose_paddr_differs_from_vaddr() -> None:
    elf = good_elf()
    elf.segments[0].vaddr = 0xFFFFFFFF80100000
    rejects(elf.build(), r"segment 2 has p_paddr 0x100000 different from p_vaddr")


def test_rejects_overlapping_segments() -> None:
    elf = good_elf()
    elf.segments[1].paddr = BASE + 0x1000  # inside text, which ends at BASE + 0x1400
    rejects(elf.build(), r"segments 2 and 3 overlap")


def test_allows_segments_sharing_a_page() -> None:
    elf = good_elf()
    elf.segments[1].paddr = BASE + 0x1400  # right after text, same page
    assert len(parse_elf(elf.build(), "a").segments) == 3


def test_note_name_keeps_no_terminator() -> None:
    note = NoteSpec(b"GNU", 3, b"\x01\x02\x03\x04")
    image = parse_elf(good_elf(notes=[note, abi_note()]).build(), "a")
    assert image.notes[0].name == b"GNU" and image.notes[0].desc == b"\x01\x02\x03\x04"
    assert image.notes[0].desc_offset == 16


def test_rejects_a_file_with_too_many_notes() -> None:
    notes = [NoteSpec(b"X", 1, b"")] * 300
    rejects(good_elf(notes=notes, notes_in_one_segment=True).build(), r"too many ELF notes")


def test_rejects_oversized_notes() -> None:
    rejects(good_elf(notes=[NoteSpec(b"X", 1, bytes(2 << 20))]).build(), r"ELF notes too large")


def test_many_headers_naming_the_same_bytes_cost_no_copies() -> None:
    # 500 x 1 MiB segments from a 1 MiB file (the program-header cap allows
    # 512): copying them would need 500 MiB.
    elf = good_elf()
    elf.segments = [Seg(BASE, bytes(1 << 20), PF_R)]
    elf.extra_phdrs = [
        (PT_LOAD, PF_R, 0, a, a, 1 << 20, 1 << 20, 0x1000)
        for a in range(BASE + (1 << 20), BASE + (501 << 20), 1 << 20)
    ]
    segments = parse_elf(elf.build(), "a").segments
    assert len(segments) == 501
    assert all(isinstance(seg.data, memoryview) for seg in segments)


def test_more_program_headers_than_the_cap_are_refused_in_one_line() -> None:
    elf = good_elf()
    elf.extra_phdrs = [(PT_LOAD, PF_R, 0, BASE, BASE, 0, 0, 0x1000)] * 20000
    with pytest.raises(LoaderError, match=r"^a: too many program headers \(20005, at most 512\)$"):
        parse_elf(elf.build(), "a")


# -- property: no input makes the parser fail any other way ----------------

_SEEDS = [
    GOOD,
    good_elf(notes_in_one_segment=True).build(),
    Elf(segments=[Seg(BASE, b"\x90" * 64, PF_R | PF_X)], notes=[abi_note()]).build(),
]


def _parse_or_loader_error(data: bytes) -> None:
    try:
        image = parse_elf(data, "fuzz.hvt")
    except LoaderError as e:
        assert str(e).startswith("fuzz.hvt: ") and "\n" not in str(e)
        return
    for seg in image.segments:
        assert len(seg.data) == seg.filesz <= seg.memsz
    for note in image.notes:
        note.aligned_desc(8)
    # The note readers above the parser must hold up to the same inputs.
    for read in (read_abi, Manifest.from_image):
        try:
            read(image)
        except LoaderError as e:
            assert str(e).startswith("fuzz.hvt: ") and "\n" not in str(e)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    seed=st.sampled_from(_SEEDS),
    edits=st.lists(
        st.tuples(st.integers(min_value=0, max_value=1 << 16), st.binary(min_size=1, max_size=8)),
        max_size=6,
    ),
    cut=st.none() | st.integers(min_value=0, max_value=1 << 16),
)
def test_parse_elf_never_raises_anything_but_loader_error(seed, edits, cut) -> None:
    data = bytearray(seed)
    for pos, blob in edits:
        pos %= len(data)
        data[pos : pos + len(blob)] = blob
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    _parse_or_loader_error(bytes(data))


@settings(max_examples=200, deadline=None)
@given(
    field_at=st.sampled_from(
        # e_phoff, e_phnum and every phdr field of the first three headers: the
        # numbers most likely to send a careless parser out of bounds.
        [32, 56]
        + [EHDR.size + i * PHDR.size + off for i in range(3) for off in (8, 16, 24, 32, 40, 48)]
    ),
    value=st.sampled_from([0, 1, 0xFFFF, 0xFFFFFFFF, (1 << 63), (1 << 64) - 1, (1 << 64) - 56]),
)
def test_parse_elf_survives_extreme_header_fields(field_at, value) -> None:
    data = bytearray(GOOD)
    if field_at == 56:
        struct.pack_into("<H", data, field_at, value & 0xFFFF)
    else:
        struct.pack_into("<Q", data, field_at, value)
    _parse_or_loader_error(bytes(data))
