"""The Solo5 application manifest: which devices a unikernel expects.

The manifest comes from the MFT1 note, i.e. from an untrusted file, so it is
validated completely before anything is believed. Its binary layout is taken
from the cffi module (``struct mft`` / ``struct mft_entry`` in hvt_abi.h), the
same declaration the guests are compiled against, so host and guest cannot
disagree about an offset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import IntEnum

from pyvmm._native import ffi, lib
from pyvmm.common.errors import LoaderError, UsageError
from pyvmm.common.record import Record
from pyvmm.loader.elf import ElfImage
from pyvmm.loader.notes import SOLO5_MANIFEST, note_descriptor

MFT_HEADER_SIZE = ffi.sizeof("struct mft")
MFT_ENTRY_SIZE = ffi.sizeof("struct mft_entry")
MFT_NAME_SIZE = lib.MFT_NAME_SIZE

_VALID_NAME = re.compile(rb"[A-Za-z0-9]+")


class DeviceType(IntEnum):
    """Manifest entry types (``enum mft_type``)."""

    BLOCK = lib.MFT_DEV_BLOCK_BASIC
    NET = lib.MFT_DEV_NET_BASIC
    #: Reserved for pyvmm's tests (the test-only device kind, testkit/devkind).
    PYVMM_TEST = lib.MFT_DEV_PYVMM_TEST
    RESERVED_FIRST = lib.MFT_RESERVED_FIRST

    @property
    def label(self) -> str:
        return {
            DeviceType.BLOCK: "block",
            DeviceType.NET: "net",
            DeviceType.PYVMM_TEST: "pyvmm-test",
            DeviceType.RESERVED_FIRST: "reserved-first",
        }[self]

    @property
    def solo5_name(self) -> str:
        """The name Solo5's tools print (mft_type_to_string, solo5-elftool)."""
        return {
            DeviceType.BLOCK: "BLOCK_BASIC",
            DeviceType.NET: "NET_BASIC",
            DeviceType.PYVMM_TEST: DeviceType.PYVMM_TEST.name,  # no Solo5 name: its own
            DeviceType.RESERVED_FIRST: "RESERVED_FIRST",
        }[self]


class ManifestEntry(Record):
    """One declared device; ``index`` is also its hypercall handle."""

    __slots__ = ("index", "name", "type")

    def __init__(self, index: int, name: str, type: DeviceType) -> None:
        self.index = index
        self.name = name
        self.type = type


def _field(what: str, value: int, bits: int, least: int = 1) -> int:
    """``value`` checked against its manifest field (an unsigned of
    ``bits``; ``least`` the smallest a guest can use)."""
    if not least <= value < 1 << bits:
        raise ValueError(f"{what} {value} does not fit the manifest's u{bits}")
    return value


class NetAttachment(Record):
    """What the guest learns about an attached network device."""

    __slots__ = ("mac", "mtu")
    type = DeviceType.NET

    def __init__(self, mac: bytes, mtu: int) -> None:
        if len(mac) != 6:
            raise ValueError(f"a MAC address is 6 bytes, not {len(mac)}")
        self.mac = mac
        self.mtu = _field("MTU", mtu, 16)


class BlockAttachment(Record):
    """What the guest learns about an attached block device."""

    __slots__ = ("capacity", "block_size")
    type = DeviceType.BLOCK

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity = _field("capacity", capacity, 64, least=0)
        self.block_size = _field("block size", block_size, 16)


class BareAttachment(Record):
    """An attached device of a type whose entry says nothing more (the
    test-only kind's): its union stays zero."""

    __slots__ = ("type",)

    def __init__(self, type: DeviceType) -> None:
        self.type = type


Attachment = NetAttachment | BlockAttachment | BareAttachment


def _shown(name: bytes) -> str:
    """An untrusted name, printable on one line whatever bytes it holds."""
    return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in name)


class Manifest(Record):
    """The validated device list; ``entries[0]`` is the reserved first entry."""

    __slots__ = ("entries", "source")
    _uncompared = ("source",)

    def __init__(self, entries: tuple[ManifestEntry, ...], source: str = "the unikernel") -> None:
        self.entries = entries
        self.source = source

    # -- parsing ----------------------------------------------------------
    @classmethod
    def from_image(cls, image: ElfImage) -> Manifest:
        """The manifest of ``image``; a Solo5 unikernel must have one."""
        desc = note_descriptor(image, SOLO5_MANIFEST)
        if desc is None:
            raise LoaderError(f"{image.source}: No Solo5 manifest found in executable")
        return cls.parse(desc, image.source)

    @classmethod
    def parse(cls, desc: bytes, source: str) -> Manifest:
        """Validate the aligned MFT1 descriptor ``desc`` (a ``struct mft``)."""

        def invalid(problem: str) -> LoaderError:
            return LoaderError(f"{source}: Solo5 manifest is invalid: {problem}")

        if len(desc) < MFT_HEADER_SIZE:
            raise invalid(f"{len(desc)} bytes, too short for the header")
        mft = ffi.from_buffer("struct mft *", desc)
        if mft.version != lib.MFT_VERSION:
            raise invalid(f"version {mft.version}, need {lib.MFT_VERSION}")
        count = mft.entries
        if not 1 <= count <= lib.MFT_MAX_ENTRIES:
            raise invalid(f"{count} entries, need 1 to {lib.MFT_MAX_ENTRIES}")
        expected = MFT_HEADER_SIZE + count * MFT_ENTRY_SIZE
        if len(desc) != expected:
            raise invalid(f"{len(desc)} bytes for {count} entries, need exactly {expected}")

        entries: list[ManifestEntry] = []
        seen: dict[str, int] = {}
        for i in range(count):
            e = mft.e[i]
            raw = ffi.buffer(e.name)[:]
            nul = raw.find(b"\0")
            if nul < 0:
                raise invalid(f"entry {i} name is not NUL-terminated")
            name = raw[:nul]
            if e.attached:
                raise invalid(f"entry {i} is already marked attached")
            if i == 0:
                if e.type != DeviceType.RESERVED_FIRST or name:
                    raise invalid("entry 0 is not the reserved first entry with an empty name")
                entries.append(ManifestEntry(0, "", DeviceType.RESERVED_FIRST))
                continue
            if e.type == DeviceType.RESERVED_FIRST:
                raise invalid(f"entry {i} has type reserved-first, allowed only at entry 0")
            if e.type not in (DeviceType.BLOCK, DeviceType.NET, DeviceType.PYVMM_TEST):
                raise invalid(f"entry {i} has unknown type {e.type:#x}")
            if not name:
                raise invalid(f"entry {i} has an empty name")
            if not _VALID_NAME.fullmatch(name):
                raise invalid(f"entry {i} name '{_shown(name)}' has invalid characters")
            text = name.decode("ascii")
            if text in seen:
                raise invalid(f"entry {i} name '{text}' duplicates entry {seen[text]}")
            seen[text] = i
            entries.append(ManifestEntry(i, text, DeviceType(e.type)))
        return cls(tuple(entries), source)

    # -- queries ----------------------------------------------------------
    def devices(self, type: DeviceType | None = None) -> tuple[ManifestEntry, ...]:
        """Declared devices (never the reserved entry), optionally of one type."""
        return tuple(
            e
            for e in self.entries
            if e.type != DeviceType.RESERVED_FIRST and (type is None or e.type == type)
        )

    def by_name(self, name: str) -> ManifestEntry | None:
        for e in self.devices():
            if e.name == name:
                return e
        return None

    @property
    def size(self) -> int:
        """Bytes of the guest's copy (``struct mft`` plus its entries)."""
        return MFT_HEADER_SIZE + len(self.entries) * MFT_ENTRY_SIZE

    # -- the guest's copy -------------------------------------------------
    def check_devices(self, requested: Mapping[str, DeviceType]) -> None:
        """Every declared device requested, nothing undeclared, types matching.

        solo5-hvt refuses to start otherwise, so a typo on the command line
        never leaves a guest waiting for a device that will not come. The
        VMM calls this with what the command line asks for, before opening
        anything; ``guest_copy`` calls it again with what was attached.
        """
        for name, kind in requested.items():
            entry = self.by_name(name)
            if entry is None:
                declared = ", ".join(e.name for e in self.devices()) or "no devices"
                raise UsageError(
                    f"Resource not declared in manifest: '{name}' "
                    f"({self.source} declares: {declared})"
                )
            if kind != entry.type:
                raise UsageError(
                    f"Resource not declared in manifest: '{name}' as a "
                    f"{DeviceType(kind).label} device ({self.source} declares '{name}' "
                    f"as a {entry.type.label} device)"
                )
        for entry in self.devices():
            if entry.name not in requested:
                raise UsageError(
                    f"Device '{entry.name}' of type {entry.type.solo5_name} declared but "
                    f"not attached. All declared devices must be attached "
                    f"({self.source}: --{entry.type.label}:{entry.name}=...)"
                )

    def check_attachments(self, attachments: Mapping[str, Attachment]) -> None:
        """``check_devices`` for devices already attached."""
        self.check_devices({name: att.type for name, att in attachments.items()})

    def guest_copy(self, attachments: Mapping[str, Attachment]) -> bytes:
        """The filled-in ``struct mft`` the guest reads through boot info.

        Built from scratch rather than patched from the file's bytes, so the
        host-private ``b`` field and every unused byte are zero whatever the
        file contained.
        """
        self.check_attachments(attachments)
        buf = bytearray(self.size)
        mft = ffi.from_buffer("struct mft *", buf, require_writable=True)
        mft.version = lib.MFT_VERSION
        mft.entries = len(self.entries)
        for entry in self.entries:
            e = mft.e[entry.index]
            e.name = entry.name.encode("ascii")
            e.type = int(entry.type)
            if entry.type == DeviceType.RESERVED_FIRST:
                # The reserved entry counts as attached, as in solo5-hvt, so
                # "every entry is attached" holds for the whole copy.
                e.attached = 1
                continue
            att = attachments[entry.name]
            if isinstance(att, NetAttachment):
                ffi.memmove(e.u.net_basic.mac, att.mac, len(att.mac))
                e.u.net_basic.mtu = att.mtu
            elif isinstance(att, BlockAttachment):
                e.u.block_basic.capacity = att.capacity
                e.u.block_basic.block_size = att.block_size
            e.b = 0
            e.attached = 1
        return bytes(buf)


def read_manifest(image: ElfImage) -> Manifest:
    """Shorthand for ``Manifest.from_image``."""
    return Manifest.from_image(image)
