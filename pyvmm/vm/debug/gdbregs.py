"""x86_64's registers as gdb's remote protocol numbers and sizes them.

The order is that of the target description pyvmm sends (``TARGET_XML``,
read by gdb with qXfer:features:read): gdb's i386 core feature (the
general registers, rip, eflags, the segment selectors, the x87 state),
its sse feature (xmm0-15, mxcsr) and fs_base/gs_base. pyvmm's guests use
no FPU state a debugger needs, so the x87 and SSE registers read as zero
and writes to them are ignored; the others are the guest's.
"""

from __future__ import annotations

from pyvmm.common.record import Record

_GPRS = "rax rbx rcx rdx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15".split()
_SEGMENTS = "cs ss ds es fs gs".split()
_X87_CONTROL = "fctrl fstat ftag fiseg fioff foseg fooff fop".split()


class Register(Record):
    """One register of the target description."""

    __slots__ = ("name", "size", "kind", "live")

    def __init__(self, name: str, size: int, kind: str, live: bool) -> None:
        self.name = name
        self.size = size  # bytes
        self.kind = kind  # the target description's type
        self.live = live  # False: reads as zero, writes ignored


def _layout() -> tuple[Register, ...]:
    regs = [Register(name, 8, "int64", True) for name in _GPRS]
    regs[6] = Register("rbp", 8, "data_ptr", True)
    regs[7] = Register("rsp", 8, "data_ptr", True)
    regs.append(Register("rip", 8, "code_ptr", True))
    regs.append(Register("eflags", 4, "int32", True))
    regs += [Register(name, 4, "int32", True) for name in _SEGMENTS]
    regs += [Register(f"st{i}", 10, "i387_ext", False) for i in range(8)]
    regs += [Register(name, 4, "int", False) for name in _X87_CONTROL]
    regs += [Register(f"xmm{i}", 16, "uint128", False) for i in range(16)]
    regs.append(Register("mxcsr", 4, "int", False))
    regs += [Register(name, 8, "int64", True) for name in ("fs_base", "gs_base")]
    return tuple(regs)


REGISTERS = _layout()
BY_NAME = {reg.name: number for number, reg in enumerate(REGISTERS)}
G_SIZE = sum(reg.size for reg in REGISTERS)


def _target_xml() -> bytes:
    def regs(first: str, last: str) -> str:
        lo, hi = BY_NAME[first], BY_NAME[last]
        return "".join(
            f'<reg name="{r.name}" bitsize="{8 * r.size}" type="{r.kind}" regnum="{n}"/>'
            for n, r in enumerate(REGISTERS[lo : hi + 1], lo)
        )

    return (
        '<?xml version="1.0"?><!DOCTYPE target SYSTEM "gdb-target.dtd">'
        "<target><architecture>i386:x86-64</architecture>"
        '<feature name="org.gnu.gdb.i386.core">' + regs("rax", "fop") + "</feature>"
        '<feature name="org.gnu.gdb.i386.sse">' + regs("xmm0", "mxcsr") + "</feature>"
        '<feature name="org.gnu.gdb.i386.segments">' + regs("fs_base", "gs_base") + "</feature>"
        "</target>"
    ).encode()


TARGET_XML = _target_xml()


def encode(number: int, values: dict[str, int]) -> str:
    """One register's bytes in hex, little-endian (``xx`` for each byte of
    a register the stub does not have: "unavailable" to gdb)."""
    reg = REGISTERS[number]
    if not reg.live:
        return "00" * reg.size
    value = values.get(reg.name)
    if value is None:
        return "xx" * reg.size
    return (value & ((1 << (8 * reg.size)) - 1)).to_bytes(reg.size, "little").hex()


def encode_all(values: dict[str, int]) -> str:
    return "".join(encode(n, values) for n in range(len(REGISTERS)))


def decode(number: int, data: bytes) -> tuple[str, int] | None:
    """(name, value) of a register write, or None for one that is ignored."""
    reg = REGISTERS[number]
    if not reg.live or len(data) != reg.size:
        return None
    return reg.name, int.from_bytes(data, "little")


def decode_all(data: bytes) -> dict[str, int]:
    """The live registers of a G packet's bytes (a short one: those it has)."""
    out: dict[str, int] = {}
    at = 0
    for number, reg in enumerate(REGISTERS):
        chunk = data[at : at + reg.size]
        at += reg.size
        if len(chunk) < reg.size:
            break
        write = decode(number, chunk)
        if write is not None:
            out[write[0]] = write[1]
    return out
