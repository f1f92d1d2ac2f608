"""ELF64 parsing of a unikernel image, treating every byte as untrusted.

This is the only module that knows the ELF header layouts (a public standard,
parsed with ``struct``; the core writer, vm/debug/core.py, packs with the
same ones); everything above it works with the validated ``ElfImage``.
Any malformed input ends in a one-line ``LoaderError`` that names the
file, never in an ``IndexError`` or ``struct.error`` traceback.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pyvmm.common.errors import LoaderError
from pyvmm.common.record import Record

# Elf64_Ehdr, Elf64_Phdr and Elf64_Nhdr, little-endian; Elf64_Shdr and
# Elf64_Sym for the fault report's symbols (vm/debug/symbols.py).
EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
PHDR = struct.Struct("<IIQQQQQQ")
NHDR = struct.Struct("<III")
SHDR = struct.Struct("<IIQQQQIIQQ")
SYM = struct.Struct("<IBBHQQ")

ELF_MAGIC = b"\x7fELF"
ELFCLASS32 = 1
ELFCLASS64 = 2
ELFDATA2LSB = 1
ELFDATA2MSB = 2
EV_CURRENT = 1
ET_EXEC = 2
ET_CORE = 4
EM_X86_64 = 62
EM_AARCH64 = 183
PT_LOAD = 1
PT_NOTE = 4
PN_XNUM = 0xFFFF

PF_X = 0x1
PF_W = 0x2
PF_R = 0x4

ADDRESS_LIMIT = 1 << 64

# Real unikernels carry a handful of small notes (Solo5's largest, the
# manifest, is under 7 KiB); these bounds keep a hostile file from making
# the parser allocate without limit.
MAX_NOTES = 256
MAX_NOTE_BYTES = 1 << 20
# Solo5's and MirageOS's linker scripts make 3 to 6 program headers; this
# many is far beyond any real image and keeps loading (the protection pass,
# the page tables) small whatever the file says.
MAX_PROGRAM_HEADERS = 512

MACHINES = {EM_X86_64: "x86_64", EM_AARCH64: "aarch64"}

_ET_NAMES = {
    0: "ET_NONE (no file type)",
    1: "ET_REL (an object file)",
    3: "ET_DYN (a shared object or PIE)",
    4: "ET_CORE (a core dump)",
}


class Segment(Record):
    """A PT_LOAD segment that is loaded: ``data`` (``filesz`` bytes) at ``paddr``.

    ``index`` is the program header number, so errors can point at it.
    ``data`` is a zero-copy view of the file: a hostile file with thousands
    of program headers naming the same bytes must not multiply its size.
    """

    __slots__ = ("paddr", "offset", "filesz", "memsz", "flags", "index", "data")
    _uncompared = ("data",)

    def __init__(
        self,
        paddr: int,
        offset: int,
        filesz: int,
        memsz: int,
        flags: int,
        index: int = 0,
        data: bytes | memoryview = b"",
    ) -> None:
        self.paddr = paddr
        self.offset = offset
        self.filesz = filesz
        self.memsz = memsz
        self.flags = flags
        self.index = index
        self.data = data

    @property
    def end(self) -> int:
        """One past the last guest byte the segment occupies (zero-fill included)."""
        return self.paddr + self.memsz

    @property
    def readable(self) -> bool:
        return bool(self.flags & PF_R)

    @property
    def writable(self) -> bool:
        return bool(self.flags & PF_W)

    @property
    def executable(self) -> bool:
        return bool(self.flags & PF_X)


class Note(Record):
    """One ELF note.

    ``name`` is the owner without its NUL terminator (``b"Solo5"``); ``desc``
    is the raw ``n_descsz`` bytes; ``desc_offset`` is where ``desc`` starts,
    counted from the start of the note header (20 for a Solo5 note), which is
    what a descriptor's internal alignment is relative to.
    """

    __slots__ = ("name", "type", "desc", "desc_offset", "phdr_index")

    def __init__(
        self, name: bytes, type: int, desc: bytes, desc_offset: int, phdr_index: int = 0
    ) -> None:
        self.name = name
        self.type = type
        self.desc = desc
        self.desc_offset = desc_offset
        self.phdr_index = phdr_index

    def aligned_desc(self, align: int) -> bytes:
        """The descriptor without the padding that aligns it to ``align`` bytes.

        Solo5's manifest is an 8-byte aligned C struct placed right after a
        20-byte header, so its descriptor begins with 4 bytes of padding that
        ``n_descsz`` counts; the reference tender skips them the same way.
        """
        pad = -self.desc_offset % align
        return self.desc[pad:] if pad <= len(self.desc) else b""


class ElfImage(Record):
    """A validated ELF64 executable: what the loader needs, nothing more.

    ``segments`` holds only PT_LOAD segments with ``p_filesz != 0`` (the
    reference tender skips the others entirely), sorted by ``paddr``.
    """

    __slots__ = ("source", "machine", "entry", "segments", "notes")

    def __init__(
        self,
        source: str,
        machine: str,
        entry: int,
        segments: tuple[Segment, ...],
        notes: tuple[Note, ...],
    ) -> None:
        self.source = source
        self.machine = machine
        self.entry = entry
        self.segments = segments
        self.notes = notes


def machine_name(e_machine: int) -> str:
    return MACHINES.get(e_machine, f"unknown({e_machine})")


def parse_elf(data: bytes, name: str) -> ElfImage:
    """Parse and validate ``data``, the contents of file ``name``."""

    def fail(problem: str) -> LoaderError:
        return LoaderError(f"{name}: {problem}")

    if len(data) < len(ELF_MAGIC) or data[:4] != ELF_MAGIC:
        raise fail("not an ELF file")
    if len(data) < 16:
        raise fail(f"truncated ELF (file header is {len(data)} bytes, need {EHDR.size})")
    ei_class, ei_data, ei_version = data[4], data[5], data[6]
    if ei_class == ELFCLASS32:
        raise fail("32-bit ELF file, need ELF64")
    if ei_class != ELFCLASS64:
        raise fail(f"unknown ELF class {ei_class}, need ELF64")
    if ei_data == ELFDATA2MSB:
        raise fail("big-endian ELF file, need little-endian")
    if ei_data != ELFDATA2LSB:
        raise fail(f"unknown ELF data encoding {ei_data}, need little-endian")
    if len(data) < EHDR.size:
        raise fail(f"truncated ELF (file header is {len(data)} bytes, need {EHDR.size})")
    (
        _ident,
        e_type,
        e_machine,
        e_version,
        e_entry,
        e_phoff,
        _e_shoff,
        _e_flags,
        e_ehsize,
        e_phentsize,
        e_phnum,
        _e_shentsize,
        _e_shnum,
        _e_shstrndx,
    ) = EHDR.unpack_from(data, 0)
    if ei_version != EV_CURRENT:
        raise fail(f"unsupported ELF version {ei_version}")
    if e_version != EV_CURRENT:
        raise fail(f"unsupported ELF version {e_version}")
    if e_type != ET_EXEC:
        kind = _ET_NAMES.get(e_type, f"{e_type:#x}")
        raise fail(f"ELF type is {kind}, need ET_EXEC (a static executable)")
    if e_ehsize != EHDR.size:
        raise fail(f"bad ELF header size {e_ehsize}, need {EHDR.size}")
    if e_phnum == 0:
        raise fail("no program headers")
    if e_phnum == PN_XNUM:
        raise fail("too many program headers (PN_XNUM is not supported)")
    if e_phnum > MAX_PROGRAM_HEADERS:
        raise fail(f"too many program headers ({e_phnum}, at most {MAX_PROGRAM_HEADERS})")
    if e_phentsize != PHDR.size:
        raise fail(f"bad program header size {e_phentsize}, need {PHDR.size}")

    # The whole table first, so a cut-off file is reported as exactly that.
    if e_phoff + e_phnum * PHDR.size > len(data):
        missing = max(0, (len(data) - e_phoff) // PHDR.size)
        raise fail(f"truncated ELF (program header {missing} past end of file)")

    view = memoryview(data).toreadonly()
    segments: list[Segment] = []
    notes: list[Note] = []
    note_bytes = 0
    for index in range(e_phnum):
        p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, _align = PHDR.unpack_from(
            data, e_phoff + index * PHDR.size
        )
        if p_type == PT_LOAD and p_filesz != 0:
            if p_filesz > p_memsz:
                raise fail(
                    f"segment {index} has p_filesz {p_filesz:#x} larger than p_memsz {p_memsz:#x}"
                )
            if p_offset + p_filesz > len(data):
                raise fail(f"truncated ELF (segment {index} past end of file)")
            if p_paddr + p_memsz > ADDRESS_LIMIT:
                raise fail(f"segment {index} wraps around the end of the address space")
            if p_paddr != p_vaddr:
                raise fail(
                    f"segment {index} has p_paddr {p_paddr:#x} different from p_vaddr {p_vaddr:#x}"
                )
            segments.append(
                Segment(
                    paddr=p_paddr,
                    offset=p_offset,
                    filesz=p_filesz,
                    memsz=p_memsz,
                    flags=p_flags,
                    index=index,
                    data=view[p_offset : p_offset + p_filesz],
                )
            )
        elif p_type == PT_NOTE:
            if p_offset + p_filesz > len(data):
                raise fail(f"truncated ELF (note segment {index} past end of file)")
            note_bytes = _parse_notes(data, p_offset, p_filesz, index, fail, notes, note_bytes)

    if not segments:
        raise fail("no loadable segments")
    segments.sort(key=lambda s: s.paddr)
    for prev, seg in zip(segments, segments[1:], strict=False):
        if seg.paddr < prev.end:
            raise fail(f"segments {prev.index} and {seg.index} overlap")

    return ElfImage(
        source=name,
        machine=machine_name(e_machine),
        entry=e_entry,
        segments=tuple(segments),
        notes=tuple(notes),
    )


def _align4(n: int) -> int:
    return (n + 3) & ~3


def _parse_notes(
    data: bytes,
    offset: int,
    size: int,
    index: int,
    fail: Callable[[str], LoaderError],
    notes: list[Note],
    used: int,
) -> int:
    """Append every note of one PT_NOTE segment (4-byte aligned, as ELF64 notes are).

    ``used`` is the name and descriptor bytes read so far; returns the new total.
    """
    pos, end = offset, offset + size
    # Fewer bytes than a note header left over is segment padding, not a note.
    while end - pos >= NHDR.size:
        namesz, descsz, n_type = NHDR.unpack_from(data, pos)
        name_at = pos + NHDR.size
        desc_at = name_at + _align4(namesz)
        desc_end = desc_at + descsz
        if desc_end > end:
            raise fail(f"malformed note in program header {index} (runs past its segment)")
        if len(notes) == MAX_NOTES:
            raise fail(f"too many ELF notes (more than {MAX_NOTES})")
        used += namesz + descsz
        if used > MAX_NOTE_BYTES:
            raise fail(f"ELF notes too large (more than {MAX_NOTE_BYTES // 1024} KiB)")
        name = bytes(data[name_at : name_at + namesz])
        if name.endswith(b"\0"):
            name = name[:-1]
        notes.append(
            Note(
                name=name,
                type=n_type,
                desc=bytes(data[desc_at:desc_end]),
                desc_offset=desc_at - pos,
                phdr_index=index,
            )
        )
        pos = _align4(desc_end)
    return used
