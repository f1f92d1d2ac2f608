"""Fault reports that name the code: the one fault line ends with the
function and offset of the guest's rip (as gdb names it), in every
privilege mode, sandboxed; -v adds a frame-pointer backtrace and the
registers. Symbols are read only at a fault, and a file that lies about
its tables gives no names, never an error."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, guest, run_pyvmm
from pyvmm.common.errors import GuestFault
from pyvmm.vm.debug.report import backtrace
from pyvmm.vm.debug.symbols import SymbolFile

MODES = ("--cpl=0", "--cpl=3", "--cpl=deprivileged")
AT = re.compile(r" at ([A-Za-z_][\w.]*)(?:\+(0x[0-9a-f]+))?$")


def gdb_symbol(kernel: Path, address: int) -> tuple[str, int]:
    """What gdb calls ``address`` in ``kernel``: (function, offset)."""
    gdb = shutil.which("gdb")
    if gdb is None:
        pytest.fail("gdb is not installed (scripts/setup installs it)")
    out = subprocess.run(
        [gdb, "-nx", "-batch", "-ex", f"info symbol {address:#x}", str(kernel)],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    found = re.search(r"^(\S+)(?: \+ (\d+))? in section", out, re.M)
    assert found, out
    return found.group(1), int(found.group(2) or 0)


def fault_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert lines and lines[-1].startswith("pyvmm: guest fault"), result.stderr
    return lines[-1]


@pytest.mark.kvm
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ("fault_zeropage", "fault_wtext", "fault_xdata"))
def test_fault_line_names_the_function_as_gdb_does(mode, name):
    result = run_pyvmm(mode, guest(name))
    line = fault_line(result)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # still one line
    rip = int(re.search(r"rip=(0x[0-9a-f]+)", line).group(1), 16)
    found = AT.search(line)
    assert found, line
    function, offset = found.group(1), int(found.group(2) or "0", 16)
    assert (function, offset) == gdb_symbol(guest(name), rip), line


@pytest.mark.kvm
def test_bad_hypercall_pointer_line_names_the_caller():
    line = fault_line(run_pyvmm(guest("fault_badptr")))
    assert "outside guest memory" in line
    assert AT.search(line), line


@pytest.fixture(scope="module")
def frame_pointer_guest(tmp_path_factory) -> Path:
    """fault_zeropage built as guests/Makefile builds it, with frame
    pointers kept (the default build omits them)."""
    where = tmp_path_factory.mktemp("fp")
    flags = "-fcf-protection=none -mno-red-zone -mgeneral-regs-only -fno-omit-frame-pointer"
    out = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(ROOT / "guests"),
            f"BIN={where}/bin",
            f"BUILD={where}/build",
            f"ARCH_CFLAGS={flags}",
            f"{where}/bin/fault_zeropage.hvt",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return where / "bin" / "fault_zeropage.hvt"


@pytest.mark.kvm
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86_64 build flags")
@pytest.mark.parametrize("mode", MODES)
def test_verbose_fault_has_the_backtrace_and_registers(frame_pointer_guest, mode):
    result = run_pyvmm("-v", mode, frame_pointer_guest)
    line = fault_line(result)
    assert AT.search(line).group(1) == "solo5_app_main", line
    frames = re.findall(r"^pyvmm: backtrace: #(\d+) (0x[0-9a-f]+) in (\S+)$", result.stderr, re.M)
    names = [f[2].split("+")[0] for f in frames]
    assert names == ["solo5_app_main", "rt_init", "_start"], result.stderr
    regs = re.search(r"^pyvmm: registers: (.*)$", result.stderr, re.M)
    assert regs, result.stderr
    shown = dict(word.split("=") for word in regs.group(1).split())
    rip = re.search(r"rip=(0x[0-9a-f]+)", line).group(1)
    assert shown["rip"] == rip == frames[0][1]
    assert {"rax", "rbp", "rsp", "eflags", "cs", "cr2"} <= shown.keys()
    # Without -v: the one line only.
    assert len(run_pyvmm(mode, frame_pointer_guest).stderr.strip().splitlines()) == 1


# -- the symbol reader, on files that lie ------------------------------------------


def symbols_of(data: bytes, tmp_path: Path) -> SymbolFile:
    path = tmp_path / "k.hvt"
    path.write_bytes(data)
    found = SymbolFile.open(str(path))
    assert found is not None
    return found


def test_symbols_are_read_at_the_first_lookup_only(tmp_path):
    symbols = symbols_of(guest("hello").read_bytes(), tmp_path)
    assert symbols._table is None  # opened, nothing read but the header
    assert symbols.describe(symbols.address_of("solo5_app_main")) == "solo5_app_main"
    assert symbols._table is not None
    symbols.close()


def _section_headers(data: bytes) -> tuple[int, int]:
    (shoff,) = struct.unpack_from("<Q", data, 40)
    (shnum,) = struct.unpack_from("<H", data, 60)
    return shoff, shnum


def _symtab_header_offset(data: bytes) -> int:
    shoff, shnum = _section_headers(data)
    for i in range(shnum):
        if struct.unpack_from("<I", data, shoff + 64 * i + 4)[0] == 2:
            return shoff + 64 * i
    raise AssertionError("no symtab")


def _patched(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def lying_files() -> dict[str, bytes]:
    data = guest("hello").read_bytes()
    sym = _symtab_header_offset(data)
    shoff, _ = _section_headers(data)
    return {
        "not ELF": b"hello" * 100,
        "cut after the header": data[:64],
        "section headers past the end": _patched(data, 40, "<Q", len(data) + 4096),
        "a huge section count": _patched(data, 60, "<H", 0xFFFF),
        "section headers of another size": _patched(data, 58, "<H", 40),
        "a symbol table of 1 TiB": _patched(data, sym + 32, "<Q", 1 << 40),
        "a symbol table past the end": _patched(data, sym + 24, "<Q", len(data) - 8),
        "a string table link out of range": _patched(data, sym + 40, "<I", 0xFFFF),
        "symbols of another size": _patched(data, sym + 56, "<Q", 7),
        "the string table's offset past the end": _patched(
            data, shoff + 64 * struct.unpack_from("<I", data, sym + 40)[0] + 24, "<Q", 1 << 62
        ),
        "cut in the symbol table": data[: struct.unpack_from("<Q", data, sym + 24)[0] + 100],
    }


@pytest.mark.parametrize("what", lying_files())
def test_a_lying_file_gives_no_names_and_no_error(tmp_path, what):
    symbols = symbols_of(lying_files()[what], tmp_path)
    for address in (0, 0x100000, 0x100040, 1 << 63):
        found = symbols.describe(address)
        assert found is None or isinstance(found, str)
    symbols.close()


def test_a_file_rewritten_since_set_up_gives_no_names(tmp_path):
    data = guest("hello").read_bytes()
    first = symbols_of(data, tmp_path)
    entry = first.address_of("solo5_app_main")
    first.close()
    symbols = symbols_of(data, tmp_path)  # opened at set-up, not read yet
    with open(tmp_path / "k.hvt", "r+b") as f:  # in place: the same inode
        f.write(data[:24] + b"\x00" * 8 + data[32:64])
    assert symbols.describe(entry) is None
    symbols.close()


# -- the frame-pointer walk ------------------------------------------------------


class FakeMemory:
    """Guest memory for the walk: a dict of 8-byte words."""

    def __init__(self, size: int, words: dict[int, int]) -> None:
        self.size = size
        self.words = words

    def read(self, gpa: int, length: int, *, what: str = "") -> bytes:
        if gpa + length > self.size:
            raise GuestFault("outside")
        return b"".join(struct.pack("<Q", self.words.get(gpa + i, 0)) for i in range(0, length, 8))


def test_backtrace_follows_the_chain_and_stops_where_it_must():
    chain = {0x1000: 0x2000, 0x1008: 0x100100, 0x2000: 0x3000, 0x2008: 0x100200}
    assert backtrace(FakeMemory(0x10000, chain), 0x100050, 0x1000) == [0x100050, 0x100100, 0x100200]
    # A frame that points at itself or below: one step, no loop.
    loop = {0x1000: 0x1000, 0x1008: 0x100100}
    assert backtrace(FakeMemory(0x10000, loop), 0x100050, 0x1000) == [0x100050, 0x100100]
    # rbp outside guest memory, unaligned or zero: rip alone.
    for rbp in (1 << 40, 0x1001, 0, 0xFFF8):
        assert backtrace(FakeMemory(0x10000, chain), 0x100050, rbp) == [0x100050]


def test_an_aarch64_fault_report_walks_x29_and_logs_every_register(monkeypatch, caplog):
    """On aarch64 the frame pointer is x29 and the registers line names
    x0-x30, sp, pc and cpsr; a register the view lacks shows as 0."""
    import logging

    from pyvmm.vm.debug import report

    regs = {f"x{n}": 0x100 + n for n in range(31)}
    regs.update(x29=0x1000, sp=0xFF0, pc=0x100050)  # no cpsr
    monkeypatch.setattr(report, "guest_registers", lambda vcpu, memory: regs)
    chain = {0x1000: 0x2000, 0x1008: 0x100100, 0x2000: 0, 0x2008: 0x100200}
    with caplog.at_level(logging.INFO, logger="pyvmm"):
        report.annotate(GuestFault("fault"), None, FakeMemory(0x10000, chain), None)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:3] == [
        "backtrace: #0 0x100050",
        "backtrace: #1 0x100100",
        "backtrace: #2 0x100200",
    ]
    names = " ".join(f"x{n}={0x100 + n:#x}" for n in range(29))
    rest = "x29=0x1000 x30=0x11e sp=0xff0 pc=0x100050 cpsr=0x0"
    assert lines[3] == f"registers: {names} {rest}", lines
