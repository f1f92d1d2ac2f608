"""Build synthetic Solo5 hvt ELF files for the loader tests.

Written from the ELF64 standard and the ABI fact sheet, so the tests do not
depend on a cross toolchain. Every knob the loader validates can be turned to
a wrong value here. Manifest bytes are laid out through the cffi module, like
the loader itself, never with hand-written offsets.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyvmm._native import ffi, lib

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
PHDR = struct.Struct("<IIQQQQQQ")
NHDR = struct.Struct("<III")

EM_X86_64 = 62
EM_AARCH64 = 183
ET_EXEC = 2
ET_DYN = 3
PT_LOAD = 1
PT_NOTE = 4
PT_GNU_STACK = 0x6474E551
PF_X, PF_W, PF_R = 1, 2, 4

BASE = 0x100000
NET = lib.MFT_DEV_NET_BASIC
BLOCK = lib.MFT_DEV_BLOCK_BASIC
RESERVED = lib.MFT_RESERVED_FIRST


@dataclass
class Seg:
    """A PT_LOAD segment; ``filesz``/``offset``/``vaddr`` override the honest values."""

    paddr: int
    data: bytes
    flags: int = PF_R | PF_X
    memsz: int | None = None
    filesz: int | None = None
    offset: int | None = None
    vaddr: int | None = None


@dataclass
class NoteSpec:
    """An ELF note encoded as Solo5 encodes its notes.

    Header (12 bytes) plus the name padded to 4; a descriptor with
    ``desc_align`` 8 starts at the next 8-aligned offset from the note start,
    and the padding before it is counted in n_descsz (the manifest's way).
    ``descsz`` overrides the honest size.
    """

    name: bytes
    type: int
    desc: bytes
    desc_align: int = 4
    descsz: int | None = None

    def encode(self) -> bytes:
        namesz = len(self.name) + 1
        name = (self.name + b"\0").ljust(_align(namesz, 4), b"\0")
        head_len = NHDR.size + len(name)
        pad = b"\0" * (-head_len % self.desc_align)
        desc = pad + self.desc
        descsz = len(desc) if self.descsz is None else self.descsz
        body = NHDR.pack(namesz, descsz, self.type) + name + desc
        return body + b"\0" * (-len(body) % 4)


@dataclass
class Elf:
    """Everything in the file; ``build()`` lays it out."""

    segments: list[Seg] = field(default_factory=list)
    notes: list[NoteSpec] = field(default_factory=list)
    entry: int = BASE
    machine: int = EM_X86_64
    e_type: int = ET_EXEC
    ei_class: int = 2
    ei_data: int = 1
    ehsize: int = EHDR.size
    phentsize: int = PHDR.size
    phnum: int | None = None
    notes_in_one_segment: bool = False
    extra_phdrs: list[tuple[int, ...]] = field(default_factory=list)

    def build(self) -> bytes:
        note_blobs = [n.encode() for n in self.notes]
        if self.notes_in_one_segment and note_blobs:
            note_blobs = [b"".join(note_blobs)]
        n_ph = len(self.segments) + len(note_blobs) + len(self.extra_phdrs)
        at = _align(EHDR.size + n_ph * PHDR.size, 16)
        out = bytearray(at)
        phdrs: list[bytes] = []
        for blob in note_blobs:
            at = _align(len(out), 8)
            out += b"\0" * (at - len(out)) + blob
            phdrs.append(PHDR.pack(PT_NOTE, PF_R, at, 0, 0, len(blob), len(blob), 8))
        for seg in self.segments:
            at = _align(len(out), 16)
            out += b"\0" * (at - len(out)) + seg.data
            filesz = len(seg.data) if seg.filesz is None else seg.filesz
            memsz = len(seg.data) if seg.memsz is None else seg.memsz
            offset = at if seg.offset is None else seg.offset
            vaddr = seg.paddr if seg.vaddr is None else seg.vaddr
            phdrs.append(
                PHDR.pack(PT_LOAD, seg.flags, offset, vaddr, seg.paddr, filesz, memsz, 0x1000)
            )
        phdrs += [PHDR.pack(*p) for p in self.extra_phdrs]
        ident = b"\x7fELF" + bytes([self.ei_class, self.ei_data, 1, 0]) + bytes(8)
        phnum = len(phdrs) if self.phnum is None else self.phnum
        out[: EHDR.size] = EHDR.pack(
            ident, self.e_type, self.machine, 1, self.entry, EHDR.size, 0, 0,
            self.ehsize, self.phentsize, phnum, 64, 0, 0,
        )  # fmt: skip
        table = b"".join(phdrs)
        out[EHDR.size : EHDR.size + len(table)] = table
        return bytes(out)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def abi_note(target: int = 1, version: int = 2, extra: bytes = b"") -> NoteSpec:
    desc = struct.pack("<IIII", target, version, 0, 0) + extra
    return NoteSpec(b"Solo5", lib.SOLO5_NOTE_ABI, desc)


def manifest_desc(
    entries: Sequence[tuple[bytes, int]],
    *,
    version: int = 1,
    count: int | None = None,
    attached: Sequence[int] = (),
) -> bytes:
    """A ``struct mft`` with ``entries`` as (name, type); the first is entry 0."""
    size = ffi.sizeof("struct mft") + len(entries) * ffi.sizeof("struct mft_entry")
    buf = bytearray(size)
    mft = ffi.from_buffer("struct mft *", buf, require_writable=True)
    mft.version = version
    mft.entries = len(entries) if count is None else count
    for i, (name, type_) in enumerate(entries):
        name = name[: ffi.sizeof(mft.e[i].name)]
        ffi.memmove(mft.e[i].name, name, len(name))
        mft.e[i].type = type_
        mft.e[i].attached = 1 if i in attached else 0
    return bytes(buf)


def devices(*named: tuple[bytes, int]) -> list[tuple[bytes, int]]:
    """Reserved entry 0 followed by ``named``."""
    return [(b"", RESERVED), *named]


def manifest_note(desc: bytes, align: int = 8) -> NoteSpec:
    return NoteSpec(b"Solo5", lib.SOLO5_NOTE_MANIFEST, desc, desc_align=align)


TEXT = bytes(range(256)) * 20  # 5120 bytes: text spills into a second page
RODATA = b"hello, rodata\0" * 10
DATA = b"\xa5" * 100


def good_elf(**overrides: object) -> Elf:
    """A plausible hvt unikernel: RX text, R rodata, RW data + bss, one net device."""
    elf = Elf(
        segments=[
            Seg(BASE, TEXT, PF_R | PF_X),
            Seg(BASE + 0x2000, RODATA, PF_R),
            Seg(BASE + 0x3000, DATA, PF_R | PF_W, memsz=0x1800),
        ],
        notes=[abi_note(), manifest_note(manifest_desc(devices((b"service", NET))))],
        entry=BASE + 0x10,
    )
    for key, value in overrides.items():
        setattr(elf, key, value)
    return elf
