"""A small x86_64 decoder for the instructions a deprivileged guest traps on.

Deprivileged execution (docs/pvm.md) runs an unmodified kernel-mode guest
at CPL 3; the privileged instructions it executes raise #GP or #UD and
pyvmm emulates them. Only those need decoding: the table below lists them
with their operand form, everything else is "not emulated" and ends the run
with the instruction's bytes. Prefixes, REX and every ModRM/SIB addressing
form (including RIP-relative and 32-bit address size) are decoded, because
the guest's compiler chooses them.
"""

from __future__ import annotations

from collections.abc import Callable

from pyvmm.common.record import Record

MAX_LENGTH = 15  # the architectural limit of one instruction

_SEGMENT_PREFIXES = {0x26: "es", 0x2E: "cs", 0x36: "ss", 0x3E: "ds", 0x64: "fs", 0x65: "gs"}
_OTHER_PREFIXES = {0x66, 0x67, 0xF0, 0xF2, 0xF3}

#: General-purpose register names by number (REX-extended).
GPR = "rax rcx rdx rbx rsp rbp rsi rdi r8 r9 r10 r11 r12 r13 r14 r15".split()


class DecodeError(Exception):
    """The bytes are not an instruction pyvmm emulates (or not complete)."""


class Memory(Record):
    """A memory operand: ``segment:[base + index*scale + disp]``.

    ``base`` is a register name, "rip" or None; ``address_size`` is 64 or 32.
    """

    __slots__ = ("base", "index", "scale", "disp", "segment", "address_size")

    def __init__(
        self,
        base: str | None,
        index: str | None,
        scale: int,
        disp: int,
        segment: str | None,
        address_size: int,
    ) -> None:
        self.base = base
        self.index = index
        self.scale = scale
        self.disp = disp
        self.segment = segment
        self.address_size = address_size

    def address(self, reg: Callable[[str], int], next_rip: int, seg_base: int = 0) -> int:
        """The linear address, given register values (``reg(name)``)."""
        if self.base == "rip":
            ea = next_rip + self.disp
        else:
            ea = self.disp
            if self.base is not None:
                ea += reg(self.base)
            if self.index is not None:
                ea += reg(self.index) * self.scale
        mask = (1 << self.address_size) - 1
        return (seg_base + (ea & mask)) & ((1 << 64) - 1)


class Instruction:
    """One decoded instruction: what it is and where its operands are (made
    per trap, read by the emulator only: no value semantics to pay for)."""

    __slots__ = ("name", "length", "reg", "rm", "operand_size", "immediate")

    def __init__(
        self,
        name: str,
        length: int,
        reg: int | None = None,
        rm: int | Memory | None = None,
        operand_size: int = 32,
        immediate: int | None = None,
    ) -> None:
        self.name = name
        self.length = length
        #: The ModRM reg field (REX.R applied): a register number, a control
        #: register, a segment register, or a group's sub-opcode.
        self.reg = reg
        #: The r/m operand: a register number or a Memory.
        self.rm = rm
        self.operand_size = operand_size
        self.immediate = immediate


class _Op:
    """One opcode table entry."""

    __slots__ = ("name", "modrm", "immediate", "memory_only", "register_only")

    def __init__(
        self,
        name: str | dict[int, str],  # by ModRM reg field for groups
        modrm: bool = False,
        immediate: int = 0,  # bytes
        memory_only: bool = False,  # a register form is not this instruction
        register_only: dict[int, str] | None = None,  # group forms with mod=3, by rm
    ) -> None:
        self.name = name
        self.modrm = modrm
        self.immediate = immediate
        self.memory_only = memory_only
        self.register_only = register_only


# The instructions a kernel-mode guest may execute that trap at CPL 3 (and
# those that give the guest's view of its own privileged state).
ONE_BYTE = {
    0x8E: _Op("mov_to_sreg", modrm=True),
    0xCA: _Op("retf_imm", immediate=2),
    0xCB: _Op("retf"),
    0xCC: _Op("int3"),
    0xCD: _Op("int", immediate=1),
    0xCF: _Op("iret"),
    0xF4: _Op("hlt"),
    0xFA: _Op("cli"),
    0xFB: _Op("sti"),
}
TWO_BYTE = {
    0x00: _Op({2: "lldt", 3: "ltr"}, modrm=True),
    0x01: _Op(
        {2: "lgdt", 3: "lidt", 7: "invlpg"},
        modrm=True,
        memory_only=True,
        register_only={0xF8: "swapgs", 0xD1: "xsetbv", 0xF9: "rdtscp"},
    ),
    0x06: _Op("clts"),
    0x08: _Op("invd"),
    0x09: _Op("wbinvd"),
    0x07: _Op("sysret"),
    0x20: _Op("mov_from_cr", modrm=True),
    0x21: _Op("mov_from_dr", modrm=True),
    0x22: _Op("mov_to_cr", modrm=True),
    0x23: _Op("mov_to_dr", modrm=True),
    0x30: _Op("wrmsr"),
    0x31: _Op("rdtsc"),
    0x32: _Op("rdmsr"),
    0x33: _Op("rdpmc"),
    0x35: _Op("sysexit"),
}


def decode(code: bytes) -> Instruction:
    """Decode the instruction at the start of ``code`` (64-bit mode).

    ``code`` may be shorter than MAX_LENGTH where memory ends; an
    instruction that does not fit raises DecodeError.
    """
    i = 0
    segment: str | None = None
    opsize16 = addr32 = False
    rex = 0

    def need(end: int) -> None:
        """Bytes up to ``end`` must exist and fit the length limit."""
        if end > MAX_LENGTH:
            raise DecodeError("instruction longer than 15 bytes")
        if end > len(code):
            raise DecodeError("instruction runs past the end of guest memory")

    while True:
        need(i + 1)
        byte = code[i]
        if 0x40 <= byte <= 0x4F:
            rex = byte  # of several, the last counts
            i += 1
            continue
        if byte in _SEGMENT_PREFIXES:
            segment = _SEGMENT_PREFIXES[byte]
        elif byte == 0x66:
            opsize16 = True
        elif byte == 0x67:
            addr32 = True
        elif byte not in _OTHER_PREFIXES:
            break
        rex = 0  # a REX counts only right before the opcode
        i += 1
    rex_w, rex_r, rex_x, rex_b = (rex >> 3) & 1, (rex >> 2) & 1, (rex >> 1) & 1, rex & 1
    opcode = code[i]
    i += 1
    table = ONE_BYTE
    if opcode == 0x0F:
        need(i + 1)
        opcode = code[i]
        i += 1
        table = TWO_BYTE
    op = table.get(opcode)
    if op is None:
        raise DecodeError("not an instruction pyvmm emulates")
    operand_size = 64 if rex_w else (16 if opsize16 else 32)
    reg: int | None = None
    rm: int | Memory | None = None
    name = op.name
    if op.modrm:
        need(i + 1)
        modrm = code[i]
        i += 1
        mod, reg_field, rm_field = modrm >> 6, (modrm >> 3) & 7, modrm & 7
        if isinstance(name, dict):
            if mod == 3 and op.register_only is not None:
                name = op.register_only.get(modrm)
                if name is None:
                    raise DecodeError("not an instruction pyvmm emulates")
                return Instruction(name, i, operand_size=operand_size)
            else:
                name = name.get(reg_field)
                if name is None or (op.memory_only and mod == 3):
                    raise DecodeError("not an instruction pyvmm emulates")
        reg = reg_field | (rex_r << 3)
        if name.startswith(("mov_from_", "mov_to_")) and name != "mov_to_sreg":
            mod = 3  # these always name a register, whatever mod says
        if mod == 3:
            rm = rm_field | (rex_b << 3)
        else:
            rm, i = _memory_operand(code, i, mod, rm_field, rex_x, rex_b, segment, addr32, need)
    assert isinstance(name, str)
    immediate = None
    if op.immediate:
        need(i + op.immediate)
        immediate = int.from_bytes(code[i : i + op.immediate], "little")
        i += op.immediate
    return Instruction(name, i, reg, rm, operand_size, immediate)


def _memory_operand(code, i, mod, rm_field, rex_x, rex_b, segment, addr32, need):
    base: str | None
    index: str | None = None
    scale = 1
    if rm_field == 4:  # SIB
        need(i + 1)
        sib = code[i]
        i += 1
        scale = 1 << (sib >> 6)
        index_no = ((sib >> 3) & 7) | (rex_x << 3)
        index = None if index_no == 4 else GPR[index_no]
        base_no = sib & 7
        if base_no == 5 and mod == 0:
            base = None
            disp_size = 4
        else:
            base = GPR[base_no | (rex_b << 3)]
            disp_size = {0: 0, 1: 1, 2: 4}[mod]
    elif rm_field == 5 and mod == 0:
        base = "rip"
        disp_size = 4
    else:
        base = GPR[rm_field | (rex_b << 3)]
        disp_size = {0: 0, 1: 1, 2: 4}[mod]
    disp = 0
    if disp_size:
        need(i + disp_size)
        disp = int.from_bytes(code[i : i + disp_size], "little", signed=True)
        i += disp_size
    return Memory(base, index, scale, disp, segment, 32 if addr32 else 64), i
