"""The guest's registers as gdb's remote protocol numbers and sizes them,
for each architecture: a ``Target`` is the register list of the target
description pyvmm sends (read by gdb with qXfer:features:read), and the
g/G/p/P encodings over it.

- x86_64: gdb's i386 core feature (the general registers, rip, eflags,
  the segment selectors, the x87 state), its sse feature (xmm0-15,
  mxcsr) and fs_base/gs_base;
- aarch64: gdb's aarch64 core feature (x0-x30, sp, pc, cpsr) and its fpu
  feature (v0-v31, fpsr, fpcr).

All are the guest's (the views in gdbviews.py read and write them); a
register a view does not have is sent as ``xx`` bytes, "unavailable" to gdb.
"""

from __future__ import annotations

from pyvmm.common.record import Record

_GPRS = "rax rbx rcx rdx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15".split()
_SEGMENTS = "cs ss ds es fs gs".split()
# gdb's names, which pyvmm/arch/x86_64/fpu.py's values use too (a unit
# test holds them equal; importing it here would load x86 code on aarch64).
_X87_CONTROL = "fctrl fstat ftag fiseg fioff foseg fooff fop".split()


class Register(Record):
    """One register of the target description."""

    __slots__ = ("name", "size", "kind")

    def __init__(self, name: str, size: int, kind: str) -> None:
        self.name = name
        self.size = size  # bytes
        self.kind = kind  # the target description's type


def _vector_union(name: str, lanes: tuple[tuple[str, str, int], ...]) -> str:
    """A 128-bit register's union of lane views (as gdb's own descriptions
    define them, so ``p $xmm0.v4_int32`` / ``p $v0.s.u`` work)."""
    out = "".join(f'<vector id="{vid}" type="{kind}" count="{n}"/>' for vid, kind, n in lanes)
    fields = "".join(f'<field name="{vid}" type="{vid}"/>' for vid, _, _ in lanes)
    return out + f'<union id="{name}">{fields}<field name="uint128" type="uint128"/></union>'


_X86_TYPES = _vector_union(
    "vec128",
    (
        ("v4_float", "ieee_single", 4),
        ("v2_double", "ieee_double", 2),
        ("v16_int8", "int8", 16),
        ("v8_int16", "int16", 8),
        ("v4_int32", "int32", 4),
        ("v2_int64", "int64", 2),
    ),
) + (
    '<flags id="i386_mxcsr" size="4">'
    + "".join(
        f'<field name="{name}" start="{bit}" end="{bit}"/>'
        for bit, name in enumerate("IE DE ZE OE UE PE DAZ IM DM ZM OM UM PM".split())
    )
    + '<field name="FZ" start="15" end="15"/></flags>'
)
_AARCH64_TYPES = _vector_union(
    "aarch64v",
    (
        ("d", "ieee_double", 2),
        ("s", "ieee_single", 4),
        ("ud", "uint64", 2),
        ("us", "uint32", 4),
        ("uh", "uint16", 8),
        ("ub", "uint8", 16),
    ),
)


class Target:
    """One architecture's registers in gdb's numbering, and its description."""

    def __init__(
        self, arch: str, features: tuple[tuple[str, str, tuple[Register, ...]], ...]
    ) -> None:
        self.registers = tuple(reg for _, _, regs in features for reg in regs)
        self.by_name = {reg.name: number for number, reg in enumerate(self.registers)}
        self.g_size = sum(reg.size for reg in self.registers)
        body, number = "", 0
        for feature, types, regs in features:
            body += f'<feature name="{feature}">{types}'
            for reg in regs:
                body += (
                    f'<reg name="{reg.name}" bitsize="{8 * reg.size}" '
                    f'type="{reg.kind}" regnum="{number}"/>'
                )
                number += 1
            body += "</feature>"
        self.xml = (
            '<?xml version="1.0"?><!DOCTYPE target SYSTEM "gdb-target.dtd">'
            f"<target><architecture>{arch}</architecture>{body}</target>"
        ).encode()

    def encode(self, number: int, values: dict[str, int]) -> str:
        """One register's bytes in hex, little-endian (``xx`` for each byte
        of a register the view does not have: "unavailable" to gdb)."""
        reg = self.registers[number]
        value = values.get(reg.name)
        if value is None:
            return "xx" * reg.size
        return (value & ((1 << (8 * reg.size)) - 1)).to_bytes(reg.size, "little").hex()

    def encode_all(self, values: dict[str, int]) -> str:
        return "".join(self.encode(n, values) for n in range(len(self.registers)))

    def decode(self, number: int, data: bytes) -> tuple[str, int] | None:
        """(name, value) of a register write, or None for one of the wrong size."""
        reg = self.registers[number]
        if len(data) != reg.size:
            return None
        return reg.name, int.from_bytes(data, "little")

    def decode_all(self, data: bytes) -> dict[str, int]:
        """The registers of a G packet's bytes (a short one: those it has)."""
        out: dict[str, int] = {}
        at = 0
        for number, reg in enumerate(self.registers):
            chunk = data[at : at + reg.size]
            at += reg.size
            if len(chunk) < reg.size:
                break
            write = self.decode(number, chunk)
            if write is not None:
                out[write[0]] = write[1]
        return out


def _x86_64() -> Target:
    core = [Register(name, 8, "int64") for name in _GPRS]
    core[6] = Register("rbp", 8, "data_ptr")
    core[7] = Register("rsp", 8, "data_ptr")
    core.append(Register("rip", 8, "code_ptr"))
    core.append(Register("eflags", 4, "int32"))
    core += [Register(name, 4, "int32") for name in _SEGMENTS]
    core += [Register(f"st{i}", 10, "i387_ext") for i in range(8)]
    core += [Register(name, 4, "int") for name in _X87_CONTROL]
    sse = [Register(f"xmm{i}", 16, "vec128") for i in range(16)]
    sse.append(Register("mxcsr", 4, "i386_mxcsr"))
    segments = [Register(name, 8, "int64") for name in ("fs_base", "gs_base")]
    return Target(
        "i386:x86-64",
        (
            ("org.gnu.gdb.i386.core", "", tuple(core)),
            ("org.gnu.gdb.i386.sse", _X86_TYPES, tuple(sse)),
            ("org.gnu.gdb.i386.segments", "", tuple(segments)),
        ),
    )


def _aarch64() -> Target:
    core = [Register(f"x{n}", 8, "int") for n in range(31)]
    core += [Register("sp", 8, "data_ptr"), Register("pc", 8, "code_ptr")]
    core.append(Register("cpsr", 4, "int"))
    fpu = [Register(f"v{n}", 16, "aarch64v") for n in range(32)]
    fpu += [Register("fpsr", 4, "int"), Register("fpcr", 4, "int")]
    return Target(
        "aarch64",
        (
            ("org.gnu.gdb.aarch64.core", "", tuple(core)),
            ("org.gnu.gdb.aarch64.fpu", _AARCH64_TYPES, tuple(fpu)),
        ),
    )


X86_64 = _x86_64()
AARCH64 = _aarch64()
TARGETS = {"x86_64": X86_64, "aarch64": AARCH64}

# x86_64's, under the names the protocol tests use.
REGISTERS = X86_64.registers
BY_NAME = X86_64.by_name
G_SIZE = X86_64.g_size
TARGET_XML = X86_64.xml
encode, encode_all = X86_64.encode, X86_64.encode_all
decode, decode_all = X86_64.decode, X86_64.decode_all
