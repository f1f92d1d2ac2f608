"""ELF notes that tell the loader what kind of unikernel it has.

Each note pyvmm understands is described by a ``NoteKind`` (owner, type,
descriptor alignment), so adding one is a constant plus a small parser next to
``read_abi``. pyvmm's own note (owner ``b"pyvmm"``, type CAP1) declares guest
capabilities such as user mode; a guest that lacks it boots exactly as
under solo5-hvt.
"""

from __future__ import annotations

from pyvmm._native import ffi, lib
from pyvmm.common.errors import LoaderError
from pyvmm.common.record import Record
from pyvmm.loader.elf import ElfImage, Note

SOLO5_OWNER = b"Solo5"

# Names of the Solo5 ABI targets, for messages about a unikernel built for
# another one.
ABI_TARGETS = {1: "hvt", 2: "spt", 3: "virtio", 4: "muen", 5: "genode", 6: "xen"}


class NoteKind(Record):
    """Which note to look for and how its descriptor is aligned.

    ``desc_align`` is the alignment of the C struct the descriptor holds,
    relative to the note header; it decides how much padding to skip.
    """

    __slots__ = ("owner", "type", "desc_align", "what")

    def __init__(self, owner: bytes, type: int, desc_align: int, what: str) -> None:
        self.owner = owner
        self.type = type
        self.desc_align = desc_align
        self.what = what


SOLO5_ABI = NoteKind(SOLO5_OWNER, lib.SOLO5_NOTE_ABI, 4, "Solo5 ABI note")
SOLO5_MANIFEST = NoteKind(SOLO5_OWNER, lib.SOLO5_NOTE_MANIFEST, 8, "Solo5 manifest note")
PYVMM_CAPS = NoteKind(b"pyvmm", lib.PYVMM_NOTE_CAPS, 4, "pyvmm capability note")


def find_note(image: ElfImage, name: bytes, type: int) -> Note | None:
    """The first note with owner ``name`` and type ``type``, or None."""
    for note in image.notes:
        if note.name == name and note.type == type:
            return note
    return None


def note_descriptor(image: ElfImage, kind: NoteKind) -> bytes | None:
    """The aligned descriptor of the one note of ``kind``, or None if absent.

    Two notes of the same kind would make the file ambiguous, so that is an
    error rather than a silent choice.
    """
    found = [n for n in image.notes if n.name == kind.owner and n.type == kind.type]
    if not found:
        return None
    if len(found) > 1:
        raise LoaderError(f"{image.source}: more than one {kind.what}")
    note = found[0]
    # Solo5's loader (elf_load_note) refuses a descriptor that is empty or
    # holds nothing past its alignment padding; so does pyvmm, in its words.
    pad = -note.desc_offset % kind.desc_align
    if len(note.desc) <= pad:
        raise LoaderError(
            f"{image.source}: phdr[{note.phdr_index}] note does not fall within valid size "
            f"({kind.what} of {len(note.desc)} bytes, {pad} of them alignment padding)"
        )
    return note.aligned_desc(kind.desc_align)


class AbiInfo(Record):
    """The Solo5 ABI a unikernel was built for (target 1 = hvt)."""

    __slots__ = ("target", "version")

    def __init__(self, target: int, version: int) -> None:
        self.target = target
        self.version = version

    @property
    def target_name(self) -> str:
        return ABI_TARGETS.get(self.target, "unknown")

    @property
    def legacy(self) -> bool:
        """Built for Solo5 0.9 or older: reads no host features, so no rings."""
        return self.version == LEGACY_ABI_VERSION


# The ABI note descriptor: u32 abi_target, abi_version, reserved0, reserved1.
_ABI_DESC_WORDS = 4


# Solo5 0.9 and older (most MirageOS unikernels built before v0.12) say 1.
# Their boot info is the first 40 bytes of version 2's, and every hypercall
# is the same, so pyvmm boots them on request (--legacy-abi) without rings.
LEGACY_ABI_VERSION = 1


def read_abi(image: ElfImage, *, legacy: bool = False) -> AbiInfo:
    """The ABI note, required to say hvt version 2 (or 1 with ``legacy``)."""
    desc = note_descriptor(image, SOLO5_ABI)
    if desc is None:
        raise LoaderError(
            f"{image.source}: No Solo5 ABI information found in executable "
            "(no Solo5 ABI note: not a Solo5 unikernel)"
        )
    need = _ABI_DESC_WORDS * ffi.sizeof("uint32_t")
    if len(desc) != need:
        raise LoaderError(
            f"{image.source}: No Solo5 ABI information found in executable "
            f"(malformed Solo5 ABI note: {len(desc)} bytes, need {need})"
        )
    words = ffi.from_buffer("uint32_t[]", desc)
    abi = AbiInfo(target=words[0], version=words[1])
    if abi.target != lib.HVT_ABI_TARGET:
        raise LoaderError(
            f"{image.source}: Executable is not for the solo5-hvt target "
            f"(ABI target {abi.target} ({abi.target_name}) is not hvt)"
        )
    if abi.version == LEGACY_ABI_VERSION and not legacy:
        raise LoaderError(
            f"{image.source}: Executable requests unsupported ABI version 1 (hvt needs version "
            f"{lib.HVT_ABI_VERSION}; --legacy-abi boots Solo5 0.9 and older builds)"
        )
    if abi.version not in (lib.HVT_ABI_VERSION, LEGACY_ABI_VERSION):
        raise LoaderError(
            f"{image.source}: Executable requests unsupported ABI version {abi.version} "
            f"(hvt needs version {lib.HVT_ABI_VERSION})"
        )
    return abi


class Capabilities(Record):
    """What a guest declares it can do beyond plain hvt (pyvmm's CAP1 note)."""

    __slots__ = ("flags",)

    def __init__(self, flags: int = 0) -> None:
        self.flags = flags

    @property
    def user_mode(self) -> bool:
        return bool(self.flags & lib.PYVMM_CAP_USER_MODE)

    @property
    def shmstream(self) -> bool:
        return bool(self.flags & lib.PYVMM_CAP_SHMSTREAM)


def read_capabilities(image: ElfImage) -> Capabilities:
    """The pyvmm capability note; absent means none (every Solo5 unikernel)."""
    desc = note_descriptor(image, PYVMM_CAPS)
    if desc is None:
        return Capabilities()
    size = ffi.sizeof("struct pyvmm_caps")
    if len(desc) != size:
        raise LoaderError(
            f"{image.source}: malformed pyvmm capability note ({len(desc)} bytes, need {size})"
        )
    caps = ffi.from_buffer("struct pyvmm_caps *", desc)
    if caps.version != lib.PYVMM_CAPS_VERSION:
        raise LoaderError(
            f"{image.source}: pyvmm capability note version {caps.version} is not supported "
            f"(need {lib.PYVMM_CAPS_VERSION})"
        )
    return Capabilities(flags=caps.flags)
