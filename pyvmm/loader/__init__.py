"""The unikernel loader: from a Solo5 hvt ``.hvt`` file to guest memory.

``load_kernel`` validates everything the file alone can tell (ELF structure,
architecture, ABI note, manifest); ``Kernel.check_fits`` and ``place`` need
the guest memory size. Every problem is a one-line ``LoaderError``.
"""

from pyvmm.loader.elf import ElfImage, Note, Segment, parse_elf
from pyvmm.loader.kernel import (
    GUEST_MEMORY_LIMIT,
    MIN_LOAD_ADDRESS,
    Kernel,
    ProtectedRange,
    load_kernel,
    page_protections,
    page_regions,
    place,
)
from pyvmm.loader.manifest import (
    Attachment,
    BlockAttachment,
    DeviceType,
    Manifest,
    ManifestEntry,
    NetAttachment,
    read_manifest,
)
from pyvmm.loader.notes import (
    PYVMM_CAPS,
    SOLO5_ABI,
    SOLO5_MANIFEST,
    AbiInfo,
    Capabilities,
    NoteKind,
    find_note,
    note_descriptor,
    read_abi,
    read_capabilities,
)

__all__ = [
    "GUEST_MEMORY_LIMIT",
    "MIN_LOAD_ADDRESS",
    "SOLO5_ABI",
    "SOLO5_MANIFEST",
    "PYVMM_CAPS",
    "AbiInfo",
    "Capabilities",
    "Attachment",
    "BlockAttachment",
    "DeviceType",
    "ElfImage",
    "Kernel",
    "Manifest",
    "ManifestEntry",
    "NetAttachment",
    "Note",
    "NoteKind",
    "ProtectedRange",
    "Segment",
    "find_note",
    "load_kernel",
    "note_descriptor",
    "page_protections",
    "page_regions",
    "parse_elf",
    "place",
    "read_abi",
    "read_capabilities",
    "read_manifest",
]
