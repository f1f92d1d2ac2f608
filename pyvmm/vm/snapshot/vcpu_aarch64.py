"""The aarch64 vCPU state a snapshot holds: every register KVM lists.

arm64 KVM has no per-area ioctls; its state is a list of registers, each
read and set on its own (KVM_GET_REG_LIST, KVM_{GET,SET}_ONE_REG): the
core registers (x0-x30, sp, pc, pstate, SP_EL1, ELR_EL1, the SPSRs), the
FP/SIMD registers (v0-v31, fpsr, fpcr), the system registers, the
generic timer's (control, compare value, virtual counter) and the
firmware's pseudo-registers (PSCI and SMCCC versions). The snapshot keeps
the whole list as one part, ``onereg``: each register as its u64 id and
then its value, whose size the id says. The same functions as vcpu.py's,
for the writer and the restore.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib
from pyvmm.arch.aarch64 import cpu, regs
from pyvmm.kvm.ioctl import KvmError, ioctl

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu

PART = "onereg"
#: Far more registers than arm64 KVM lists (about 150 without SVE).
MAX_REGS = 1024
_ID = struct.Struct("<Q")
_SIZE_SHIFT = 52
_SIZE_MASK = 0xF << _SIZE_SHIFT
#: <asm/kvm.h>'s KVM_REG_ARM_TIMER_CNT, the virtual counter: (3, 3, 14, 3, 2)
#: there (the header's CNT and CVAL encodings are each other's, kept so).
_TIMER_CNT = (3, 3, 14, 3, 2)
#: A 32-bit store without writeback (STR Wt, [Xn, #imm] / [Xn, Xm] / STUR):
#: the hvt hypercall, which a restored guest issues again.
_STORE_FORMS = ((0xFFC00000, 0xB9000000), (0xFFE00C00, 0xB8200800), (0xFFE00C00, 0xB8000000))


def reg_size(reg_id: int) -> int:
    return 1 << ((reg_id & _SIZE_MASK) >> _SIZE_SHIFT)


def reg_list(vcpu: Vcpu) -> list[int]:
    """KVM_GET_REG_LIST: every register id of this vCPU."""
    head = ffi.new("uint64_t[]", 1 + MAX_REGS)
    head[0] = MAX_REGS
    ioctl(vcpu.fd, lib.KVM_GET_REG_LIST, head, call="KVM_GET_REG_LIST")
    return [head[1 + i] for i in range(head[0])]


def _one(vcpu: Vcpu, request: int, reg_id: int, buf, call: str) -> None:
    one = ffi.new("struct kvm_one_reg *", {"id": reg_id, "addr": int(ffi.cast("uintptr_t", buf))})
    ioctl(vcpu.fd, request, one, call=call)


def capture(vcpu: Vcpu) -> dict[str, bytes]:
    """Every listed register, as (id, value) records."""
    records = []
    for reg_id in reg_list(vcpu):
        size = reg_size(reg_id)
        if size > 256:  # an SVE vector (not enabled by pyvmm): not a size to save
            raise KvmError(f"KVM_GET_ONE_REG ({reg_id:#x}: {size} bytes)", 22)
        buf = ffi.new("char[]", size)
        _one(vcpu, lib.KVM_GET_ONE_REG, reg_id, buf, "KVM_GET_ONE_REG")
        records.append(_ID.pack(reg_id) + bytes(ffi.buffer(buf, size)))
    return {PART: b"".join(records)}


def records(raw: bytes) -> list[tuple[int, bytes]] | None:
    """``onereg``'s (id, value) records, or None if they do not parse."""
    out, at = [], 0
    while at < len(raw):
        if len(raw) - at < _ID.size:
            return None
        (reg_id,) = _ID.unpack_from(raw, at)
        size = reg_size(reg_id)
        if (reg_id & 0xFF << 56) != lib.KVM_REG_ARM64 or size > 256 or len(raw) - at - 8 < size:
            return None
        out.append((reg_id, raw[at + 8 : at + 8 + size]))
        at += 8 + size
    return out


def _pack(entries: list[tuple[int, bytes]]) -> bytes:
    return b"".join(_ID.pack(reg_id) + value for reg_id, value in entries)


def state_sizes() -> dict[str, int | tuple[int, int]]:
    return {PART: (4, MAX_REGS * (8 + 256))}


def missing_part(state: dict[str, bytes]) -> str | None:
    entries = records(state.get(PART, b""))
    if entries is None:
        return "cpu.state: its register list does not parse"
    ids = {reg_id for reg_id, _ in entries}
    for name, reg_id in (
        ("pc", regs.core("regs", "pc")),
        ("the timer", regs.sysreg_id(*_TIMER_CNT)),
    ):
        if reg_id not in ids:
            return f"cpu.state has no {name} register"
    return None


def _value(state: dict[str, bytes], reg_id: int) -> int | None:
    for rid, value in records(state[PART]) or ():
        if rid == reg_id:
            return int.from_bytes(value, "little")
    return None


def _with(state: dict[str, bytes], reg_id: int, value: int) -> dict[str, bytes]:
    entries = [
        (rid, value.to_bytes(len(raw), "little") if rid == reg_id else raw)
        for rid, raw in records(state[PART]) or ()
    ]
    return {**state, PART: _pack(entries)}


def counter(state: dict[str, bytes]) -> int | None:
    """The guest's clock counter in a state: the virtual counter."""
    return _value(state, regs.sysreg_id(*_TIMER_CNT))


def with_counter(state: dict[str, bytes], value: int) -> dict[str, bytes]:
    """Setting KVM's virtual counter moves the guest's counter offset."""
    return _with(state, regs.sysreg_id(*_TIMER_CNT), value)


def read_counter(vcpu: Vcpu) -> int:
    return cpu.get(vcpu, regs.sysreg_id(*_TIMER_CNT))


def rewind_hypercall(state: dict[str, bytes], read) -> dict[str, bytes] | None:
    """Back onto the hypercall's store (KVM moved pc past it on completing
    the exit), or None if the instruction there is not one."""
    pc_id = regs.core("regs", "pc")
    at = (_value(state, pc_id) or 0) - 4
    word = int.from_bytes(read(at, 4), "little")
    if not any(word & mask == form for mask, form in _STORE_FORMS):
        return None
    return _with(state, pc_id, at)


def prepare(system, vcpu: Vcpu, state: dict[str, bytes]) -> None:
    """A fresh vCPU initialised as a boot does (KVM_ARM_VCPU_INIT)."""
    cpu.init(vcpu.vm_fd, vcpu)


def apply(vcpu: Vcpu, state: dict[str, bytes]) -> None:
    """Every saved register, in KVM's list order."""
    for reg_id, value in records(state[PART]) or ():
        buf = ffi.new("char[]", value)
        _one(vcpu, lib.KVM_SET_ONE_REG, reg_id, buf, f"KVM_SET_ONE_REG ({reg_id:#x})")
