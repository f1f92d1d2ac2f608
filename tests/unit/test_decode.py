"""The deprivileged-mode decoder, instruction by instruction.

Encodings were produced by GNU as (x86_64) and are checked byte for byte:
name, length and operands, for every prefix and addressing form the
emulated instructions allow, and for instructions cut short by the end of
guest memory.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyvmm.arch.x86_64.decode import MAX_LENGTH, DecodeError, Memory, decode

REGS = {
    "rax": 0x1000,
    "rbx": 0x10,
    "rbp": 0x2000,
    "rdi": 0x3000,
    "rsi": 0x4000,
    "r12": 0x5000,
    "r13": 0x6000,
}


def reg(name: str) -> int:
    return REGS[name]


# (hex bytes, name, length, reg field, rm (register number or a Memory), address at rip 0)
CASES = [
    ("0f0117", "lgdt", 3, 2, Memory("rdi", None, 1, 0, None, 64), 0x3000),
    ("0f01549810", "lgdt", 5, 2, Memory("rax", "rbx", 4, 0x10, None, 64), 0x1050),
    ("0f011551000000", "lgdt", 7, 2, Memory("rip", None, 1, 0x51, None, 64), 0x58),
    ("410f011c24", "lidt", 5, 3, Memory("r12", None, 1, 0, None, 64), 0x5000),
    ("0f015df8", "lidt", 4, 3, Memory("rbp", None, 1, -8, None, 64), 0x1FF8),
    ("410f015d00", "lidt", 5, 3, Memory("r13", None, 1, 0, None, 64), 0x6000),
    ("670f0110", "lgdt", 4, 2, Memory("rax", None, 1, 0, None, 32), 0x1000),
    ("640f01142520000000", "lgdt", 9, 2, Memory(None, None, 1, 0x20, "fs", 64), 0x20),
    ("0f00d8", "ltr", 3, 3, 0, None),
    ("410f00d9", "ltr", 4, 3, 9, None),
    ("0f001e", "ltr", 3, 3, Memory("rsi", None, 1, 0, None, 64), 0x4000),
    ("8ed0", "mov_to_sreg", 2, 2, 0, None),
    ("418ed0", "mov_to_sreg", 3, 2, 8, None),
    ("8ed8", "mov_to_sreg", 2, 3, 0, None),
    ("48cb", "retf", 2, None, None, None),
    ("cb", "retf", 1, None, None, None),
    ("ca1000", "retf_imm", 3, None, None, None),
    ("48cf", "iret", 2, None, None, None),
    ("cf", "iret", 1, None, None, None),
    ("0f20d7", "mov_from_cr", 3, 2, 7, None),
    ("410f20c2", "mov_from_cr", 4, 0, 10, None),
    ("0f22d8", "mov_to_cr", 3, 3, 0, None),
    # REX.R alone extends the reg field (cr8), REX.W alone does not
    ("440f20c0", "mov_from_cr", 4, 8, 0, None),
    ("480f20d7", "mov_from_cr", 4, 2, 7, None),
    ("4c0f22c0", "mov_to_cr", 4, 8, 0, None),
    ("0f30", "wrmsr", 2, None, None, None),
    ("0f32", "rdmsr", 2, None, None, None),
    ("fa", "cli", 1, None, None, None),
    ("fb", "sti", 1, None, None, None),
    ("f4", "hlt", 1, None, None, None),
    ("0f01f8", "swapgs", 3, None, None, None),
    ("0f0138", "invlpg", 3, 7, Memory("rax", None, 1, 0, None, 64), 0x1000),
    ("cc", "int3", 1, None, None, None),
    ("cd80", "int", 2, None, None, None),
    ("0f31", "rdtsc", 2, None, None, None),
]


@pytest.mark.parametrize(("code", "name", "length", "reg_field", "rm", "address"), CASES)
def test_decodes_each_emulated_form(code, name, length, reg_field, rm, address) -> None:
    insn = decode(bytes.fromhex(code) + b"\x90" * 8)
    assert (insn.name, insn.length, insn.reg, insn.rm) == (name, length, reg_field, rm)
    if isinstance(rm, Memory):
        assert insn.rm.address(reg, next_rip=insn.length) == address


def test_operand_size_follows_rex_w_and_0x66() -> None:
    assert decode(bytes.fromhex("48cb")).operand_size == 64
    assert decode(bytes.fromhex("cb")).operand_size == 32
    assert decode(bytes.fromhex("66cb")).operand_size == 16


def test_immediates() -> None:
    assert decode(bytes.fromhex("ca1000")).immediate == 16
    assert decode(bytes.fromhex("cd80")).immediate == 0x80


def test_segment_base_is_added_and_32_bit_addresses_wrap() -> None:
    fs = decode(bytes.fromhex("640f01142520000000")).rm
    assert fs.address(reg, next_rip=9, seg_base=0x7000) == 0x7020
    wrapped = Memory("rax", None, 1, -0x2000, None, 32)
    assert wrapped.address(reg, next_rip=0) == 0xFFFFF000


@pytest.mark.parametrize(
    "code",
    [
        "90",  # nop: not privileged, never emulated
        "0f05",  # syscall
        "0f0110",  # lgdt with the mod=3 form missing: cut short below
        "0f01d8",  # group 7 register form that is not swapgs (vmrun)
        "0f0100",  # sgdt: a sensitive instruction that does not trap
        "0f00c8",  # str
    ],
)
def test_refuses_what_it_does_not_emulate(code: str) -> None:
    data = bytes.fromhex(code)
    if code == "0f0110":
        data = data[:2]
    with pytest.raises(DecodeError):
        decode(data)


@pytest.mark.parametrize("code", CASES)
def test_an_instruction_cut_by_the_end_of_memory_is_refused(code) -> None:
    full = bytes.fromhex(code[0])
    for cut in range(len(full)):
        with pytest.raises(DecodeError, match="end of guest memory"):
            decode(full[:cut])


def test_prefixes_beyond_fifteen_bytes_are_refused() -> None:
    with pytest.raises(DecodeError, match="15 bytes"):
        decode(b"\x66" * 14 + bytes.fromhex("0f0117"))


@given(st.binary(min_size=0, max_size=MAX_LENGTH + 4))
def test_any_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    try:
        insn = decode(data)
    except DecodeError:
        return
    assert 1 <= insn.length <= min(len(data), MAX_LENGTH)
