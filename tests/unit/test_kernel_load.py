"""Loading a unikernel file and placing it in real guest memory."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import pytest
from elfbuild import (
    BASE,
    DATA,
    EM_AARCH64,
    NET,
    PF_R,
    PF_W,
    PF_X,
    RODATA,
    TEXT,
    Seg,
    abi_note,
    devices,
    good_elf,
    manifest_desc,
    manifest_note,
)

from conftest import guest
from pyvmm.common.errors import GuestFault, LoaderError
from pyvmm.kvm.memory import GuestMemory, Protection
from pyvmm.loader import (
    AbiInfo,
    DeviceType,
    Kernel,
    ProtectedRange,
    load_kernel,
    page_protections,
    place,
)

MIB = 1 << 20
RX = Protection(read=True, write=False, execute=True)
RO = Protection(read=True, write=False, execute=False)
RW = Protection(read=True, write=True, execute=False)
RWX = Protection(read=True, write=True, execute=True)


def write(tmp_path: Path, data: bytes, name: str = "app.hvt") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def load(tmp_path: Path, data: bytes, machine: str = "x86_64") -> Kernel:
    return load_kernel(write(tmp_path, data), machine)


def refuses(tmp_path: Path, data: bytes, match: str, machine: str = "x86_64") -> str:
    path = write(tmp_path, data)
    with pytest.raises(LoaderError) as info:
        load_kernel(path, machine)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    assert re.search(match, message), message
    return message


@pytest.fixture
def memory():
    with GuestMemory(4 * MIB) as mem:
        yield mem


# -- load_kernel --------------------------------------------------------------


def test_loads_a_good_unikernel(tmp_path: Path) -> None:
    k = load(tmp_path, good_elf().build())
    assert k.abi == AbiInfo(target=1, version=2)
    assert [e.name for e in k.manifest.devices(DeviceType.NET)] == ["service"]
    assert k.entry == BASE + 0x10
    assert k.kernel_end == BASE + 0x3000 + 0x1800
    assert k.min_mem_size == 2 * MIB
    assert k.path.endswith("app.hvt")


def test_loads_an_aarch64_unikernel_on_an_aarch64_host(tmp_path: Path) -> None:
    assert load(tmp_path, good_elf(machine=EM_AARCH64).build(), "aarch64").image.machine == (
        "aarch64"
    )


def test_refuses_a_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "app.hvt")
    with pytest.raises(LoaderError, match=rf"^{path}: Could not open: No such file or directory$"):
        load_kernel(path, "x86_64")


def test_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match=r"^.*: Could not open: Is a directory$"):
        load_kernel(str(tmp_path), "x86_64")


def test_refuses_something_that_is_not_a_regular_file() -> None:
    with pytest.raises(LoaderError, match=r"^/dev/null: Could not open: not a regular file$"):
        load_kernel("/dev/null", "x86_64")


def test_refuses_an_unreadable_file(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # Root reads files whatever their mode; a write-only sysctl (mode
        # 0200) refuses even root's readers (as tests/unit/test_block.py).
        path = "/proc/sys/vm/compact_memory"
    else:
        path = write(tmp_path, good_elf().build())
        os.chmod(path, 0)
    with pytest.raises(LoaderError, match=r"^.*: Could not open: Permission denied$"):
        load_kernel(path, "x86_64")


def test_refuses_a_file_that_is_not_elf(tmp_path: Path) -> None:
    refuses(tmp_path, b"MZ\x90\x00" + bytes(200), r": not an ELF file$")


def test_refuses_a_unikernel_built_for_another_architecture(tmp_path: Path) -> None:
    msg = refuses(tmp_path, good_elf(machine=EM_AARCH64).build(), r"built for aarch64")
    assert msg.endswith("app.hvt: built for aarch64, this host runs x86_64")


def test_refuses_an_unknown_machine(tmp_path: Path) -> None:
    refuses(tmp_path, good_elf(machine=40).build(), r"built for unknown\(40\), this host runs")


def test_refuses_an_elf_without_abi_note(tmp_path: Path) -> None:
    elf = good_elf(notes=[manifest_note(manifest_desc(devices()))])
    refuses(
        tmp_path,
        elf.build(),
        r"app\.hvt: No Solo5 ABI information found in executable \(no Solo5 ABI note: "
        r"not a Solo5 unikernel\)$",
    )


@pytest.mark.parametrize(
    "note, message",
    [
        (
            {"target": 3},
            r"app\.hvt: Executable is not for the solo5-hvt target \(ABI target 3 \(virtio\) "
            r"is not hvt\)$",
        ),
        ({"target": 99}, r"ABI target 99 \(unknown\) is not hvt\)$"),
        ({"version": 3}, r"Executable requests unsupported ABI version 3 \(hvt needs version 2\)$"),
    ],
    ids=["virtio-target", "unknown-target", "version-3"],
)
def test_refuses_another_target_or_version(tmp_path: Path, note: dict, message: str) -> None:
    elf = good_elf()
    elf.notes[0] = abi_note(**note)
    refuses(tmp_path, elf.build(), message)


def test_refuses_abi_version_1_unless_asked(tmp_path: Path) -> None:
    elf = good_elf()
    elf.notes[0] = abi_note(version=1)
    refuses(
        tmp_path,
        elf.build(),
        r"Executable requests unsupported ABI version 1 \(hvt needs version 2; "
        r"--legacy-abi boots Solo5 0.9 and older builds\)$",
    )
    path = tmp_path / "old.hvt"
    path.write_bytes(elf.build())
    kernel = load_kernel(str(path), "x86_64", legacy_abi=True)
    assert kernel.abi.version == 1 and kernel.abi.legacy


def test_legacy_flag_still_refuses_other_versions(tmp_path: Path) -> None:
    elf = good_elf()
    elf.notes[0] = abi_note(version=0)
    path = tmp_path / "zero.hvt"
    path.write_bytes(elf.build())
    with pytest.raises(LoaderError, match="Executable requests unsupported ABI version 0"):
        load_kernel(str(path), "x86_64", legacy_abi=True)


def test_refuses_a_malformed_abi_note(tmp_path: Path) -> None:
    elf = good_elf()
    elf.notes[0] = abi_note(extra=b"\0\0\0\0")
    refuses(tmp_path, elf.build(), r"malformed Solo5 ABI note: 20 bytes, need 16\)$")


def test_refuses_two_abi_notes(tmp_path: Path) -> None:
    elf = good_elf()
    elf.notes.append(abi_note())
    refuses(tmp_path, elf.build(), r"more than one Solo5 ABI note$")


def test_refuses_an_elf_without_manifest(tmp_path: Path) -> None:
    refuses(
        tmp_path,
        good_elf(notes=[abi_note()]).build(),
        r"app\.hvt: No Solo5 manifest found in executable$",
    )


def test_refuses_an_invalid_manifest(tmp_path: Path) -> None:
    elf = good_elf()
    elf.notes[1] = manifest_note(manifest_desc(devices((b"a-b", NET))))
    refuses(
        tmp_path,
        elf.build(),
        r"Solo5 manifest is invalid: entry 1 name 'a-b' has invalid characters$",
    )


def test_refuses_a_segment_with_filesz_larger_than_memsz(tmp_path: Path) -> None:
    elf = good_elf()
    elf.segments[0].memsz = 16
    refuses(tmp_path, elf.build(), r"segment 2 has p_filesz 0x1400 larger than p_memsz 0x10$")


def test_a_segment_without_file_bytes_is_not_loaded(tmp_path: Path) -> None:
    elf = good_elf()
    elf.segments.append(Seg(BASE + 0x8000, b"", PF_R | PF_W, memsz=0x100000))
    k = load(tmp_path, elf.build())
    assert len(k.segments) == 3
    assert k.kernel_end == BASE + 0x4800  # the skipped .bss segment does not count
    k.check_fits(2 * MIB)


# -- check_fits -----------------------------------------------------------------


def test_refuses_a_segment_below_the_load_base(tmp_path: Path) -> None:
    elf = good_elf()
    elf.segments.insert(0, Seg(0x80000, b"\x90" * 16, PF_R | PF_X))
    k = load(tmp_path, elf.build())
    with pytest.raises(LoaderError, match=r"segment 2 loads at 0x80000, below the guest load base"):
        k.check_fits(512 * MIB)


def test_refuses_a_segment_beyond_4_gib(tmp_path: Path) -> None:
    elf = good_elf()
    elf.segments.append(Seg((4 << 30) - 0x1000, b"x" * 16, PF_R, memsz=0x2000))
    k = load(tmp_path, elf.build())
    with pytest.raises(LoaderError, match=r"segment 5 \(0xfffff000-0x100001000\) ends beyond"):
        k.check_fits(4096 * MIB)


def test_refuses_an_entry_point_below_the_load_base(tmp_path: Path) -> None:
    k = load(tmp_path, good_elf(entry=0x1000).build())
    with pytest.raises(LoaderError, match=r"entry point 0x1000 is outside \[0x100000, 4 GiB\)$"):
        k.check_fits(512 * MIB)


def test_refuses_an_entry_point_beyond_4_gib(tmp_path: Path) -> None:
    k = load(tmp_path, good_elf(entry=1 << 40).build())
    with pytest.raises(LoaderError, match=r"entry point 0x10000000000 is outside"):
        k.check_fits(512 * MIB)


def test_refuses_an_entry_point_outside_guest_memory(tmp_path: Path) -> None:
    k = load(tmp_path, good_elf(entry=0x3FF0000).build())  # 64 MiB - 64 KiB
    k.check_fits(64 * MIB)
    with pytest.raises(LoaderError) as info:
        k.check_fits(32 * MIB)
    assert str(info.value) == (
        f"{k.path} needs at least 64 MiB of guest memory, --mem gives 32 MiB"
    )


def test_says_how_much_memory_a_large_kernel_needs(tmp_path: Path) -> None:
    elf = good_elf()
    elf.segments[2].memsz = 100 * MIB  # a big .bss: ends at 0x103000 + 100 MiB
    k = load(tmp_path, elf.build())
    k.check_fits(102 * MIB)
    with pytest.raises(LoaderError) as info:
        k.check_fits(64 * MIB)
    # 1 MiB + 12 KiB + 100 MiB, rounded up to the 2 MiB granule of --mem.
    assert str(info.value) == (
        f"{k.path} needs at least 102 MiB of guest memory, --mem gives 64 MiB"
    )


def test_accepts_a_kernel_that_ends_exactly_at_the_top_of_memory(tmp_path: Path) -> None:
    elf = good_elf()
    elf.segments[2].memsz = 2 * MIB - 0x3000 - BASE
    k = load(tmp_path, elf.build())
    assert k.kernel_end == 2 * MIB
    k.check_fits(2 * MIB)


# -- page protections and place() ----------------------------------------------------


def test_protections_follow_the_segment_flags(tmp_path: Path) -> None:
    k = load(tmp_path, good_elf().build())
    assert page_protections(k) == (
        ProtectedRange(BASE, 0x2000, RX),  # text spills into its second page
        ProtectedRange(BASE + 0x2000, 0x1000, RO),
        ProtectedRange(BASE + 0x3000, 0x2000, RW),  # data + bss, rounded up
    )


def test_a_page_shared_by_two_segments_gets_the_union_of_their_flags(tmp_path: Path) -> None:
    elf = good_elf()
    elf.segments[1] = Seg(BASE + 0x1400, RODATA, PF_R)  # same page as the end of text
    elf.segments[2] = Seg(BASE + 0x1800, DATA, PF_R | PF_W)  # and data too
    elf.segments.append(Seg(BASE + 0x5000, b"r" * 0x1000, PF_R))
    elf.segments.append(Seg(BASE + 0x6000, b"r" * 0x10, PF_R))  # adjacent, same flags
    k = load(tmp_path, elf.build())
    assert page_protections(k) == (
        ProtectedRange(BASE, 0x1000, RX),
        ProtectedRange(BASE + 0x1000, 0x1000, RWX),
        ProtectedRange(BASE + 0x5000, 0x2000, RO),
    )


def test_place_copies_segments_and_zero_fills_bss(tmp_path: Path, memory: GuestMemory) -> None:
    k = load(tmp_path, good_elf().build())
    memory.write(BASE + 0x3000, b"\xee" * 0x2000)  # dirty where .bss goes
    place(k, memory)
    assert memory.read(BASE, len(TEXT)) == TEXT
    assert memory.read(BASE + 0x2000, len(RODATA)) == RODATA
    assert memory.read(BASE + 0x3000, len(DATA)) == DATA
    assert memory.read(BASE + 0x3000 + len(DATA), 0x1800 - len(DATA)) == bytes(0x1800 - len(DATA))
    assert memory.read(BASE + 0x4800, 16) == b"\xee" * 16  # past memsz: untouched


def test_place_makes_text_and_rodata_read_only(tmp_path: Path, memory: GuestMemory) -> None:
    place(load(tmp_path, good_elf().build()), memory)
    for gpa in (BASE, BASE + 0x1FFF, BASE + 0x2000):
        with pytest.raises(GuestFault, match="read-only"):
            memory.write(gpa, b"\xcc")
    memory.write(BASE + 0x3000, b"ok")  # data stays writable
    memory.write(BASE + 0x4000, b"ok")  # .bss page too
    memory.write(BASE + 0x10000, b"ok")  # and memory outside the kernel
    assert memory.read(BASE, 4) == TEXT[:4]


def test_place_refuses_a_kernel_that_does_not_fit(tmp_path: Path, memory: GuestMemory) -> None:
    elf = good_elf()
    elf.segments[2].memsz = 8 * MIB
    with pytest.raises(
        LoaderError, match=r"needs at least 10 MiB of guest memory, --mem gives 4 MiB"
    ):
        place(load(tmp_path, elf.build()), memory)


# -- real guests, when they have been built --------------------------------------

GUESTS_DIR = Path(__file__).resolve().parents[2] / "guests"
# Every program guests/Makefile builds; one not built is a failure (guest()).
REAL_GUESTS = (
    re.search(r"^PROGRAMS = ((?:.*\\\n)*.*)$", (GUESTS_DIR / "Makefile").read_text(), re.M)
    .group(1)
    .replace("\\", " ")
    .split()
)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="guests are built for x86_64")
@pytest.mark.parametrize("name", REAL_GUESTS)
def test_accepts_the_real_guests(name: str) -> None:
    path = guest(name)
    k = load_kernel(str(path), "x86_64")
    k.check_fits(k.min_mem_size)
    with GuestMemory(max(k.min_mem_size, 2 * MIB)) as mem:
        place(k, mem)
        first = k.segments[0]
        assert mem.read(first.paddr, first.filesz) == first.data
    text = [s for s in k.segments if s.executable]
    assert text and all(not s.writable for s in text)
