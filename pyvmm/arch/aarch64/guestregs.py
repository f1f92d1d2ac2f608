"""The aarch64 guest's registers as a debugger sees them (the GDB stub's
x0-x30, sp, pc, cpsr, v0-v31, fpsr, fpcr; a core file's NT_PRSTATUS and
NT_PRFPREG), through KVM_{GET,SET}_ONE_REG.

A guest runs at EL1 on SP_EL1 (EL1h), so its ``sp`` is SP_EL1 while
PSTATE says so, SP_EL0 otherwise. When it took an exception into pyvmm's
vectors (mmu.VECTORS: a fault it cannot handle) the registers a debugger
wants are those it had at the faulting instruction: pc is ELR_EL1, cpsr
SPSR_EL1, and x0 what the vector kept in TPIDR_EL1 (it then uses x0).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib
from pyvmm.arch.aarch64 import cpu, regs
from pyvmm.kvm.ioctl import ioctl

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu

#: <linux/kvm.h>: a ONE_REG id's size field is log2 of its bytes at bit 52
#: (KVM_REG_SIZE_U64 is 3 there); a V register is 16 bytes.
_SIZE_SHIFT = 52
SIZE_U128 = 4 << _SIZE_SHIFT
#: PSTATE.M[3:0] of EL1 on SP_EL1.
_EL1H = 0b0101
#: Linux's user_pt_regs (the NT_PRSTATUS register set) and gdb's core names.
USER_REGS = tuple(f"x{n}" for n in range(31)) + ("sp", "pc", "cpsr")
FP_NAMES = tuple(f"v{n}" for n in range(32)) + ("fpsr", "fpcr")
#: Linux's user_fpsimd_state (NT_PRFPREG): vregs[32], fpsr, fpcr, 2 reserved.
_FPSIMD = struct.Struct("<512sII8x")


def _fp_base() -> int:
    """offsetof(struct kvm_regs, fp_regs): after spsr[], 16-byte aligned
    (user_fpsimd_state holds __uint128_t, which cffi cannot declare; the
    id it gives is checked against the headers' in tests/aarch64)."""
    spsr = ffi.new("struct kvm_regs *").spsr
    end = ffi.offsetof("struct kvm_regs", "spsr") + ffi.sizeof(spsr)
    return -(-end // 16) * 16


def _core_id(size: int, offset: int) -> int:
    return lib.KVM_REG_ARM64 | size | lib.KVM_REG_ARM_CORE | offset // 4


def v(n: int) -> int:
    return _core_id(SIZE_U128, _fp_base() + 16 * n)


def fpsr() -> int:
    return _core_id(lib.KVM_REG_SIZE_U32, _fp_base() + 512)


def fpcr() -> int:
    return _core_id(lib.KVM_REG_SIZE_U32, _fp_base() + 516)


def table() -> dict[str, int]:
    """The FP register ids, by name (compared with the headers' in tests)."""
    ids = {f"v{n}": v(n) for n in range(32)}
    ids.update(fpsr=fpsr(), fpcr=fpcr())
    return ids


def _get_raw(vcpu: Vcpu, reg_id: int, size: int) -> int:
    buf = ffi.new("uint8_t[]", size)
    one = ffi.new("struct kvm_one_reg *", {"id": reg_id, "addr": int(ffi.cast("uintptr_t", buf))})
    ioctl(vcpu.fd, lib.KVM_GET_ONE_REG, one, call="KVM_GET_ONE_REG")
    return int.from_bytes(ffi.buffer(buf, size), "little")


def _set_raw(vcpu: Vcpu, reg_id: int, size: int, value: int) -> None:
    data = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
    buf = ffi.new("uint8_t[]", data)
    one = ffi.new("struct kvm_one_reg *", {"id": reg_id, "addr": int(ffi.cast("uintptr_t", buf))})
    ioctl(vcpu.fd, lib.KVM_SET_ONE_REG, one, call="KVM_SET_ONE_REG")


def _sp_id(vcpu: Vcpu) -> int:
    pstate = cpu.get(vcpu, regs.core("regs", "pstate"))
    return regs.core("sp_el1") if pstate & 0xF == _EL1H else regs.core("regs", "sp")


def read(vcpu: Vcpu) -> dict[str, int]:
    """The vCPU's registers under gdb's names (the guest stopped in its code)."""
    out = {f"x{n}": cpu.get(vcpu, regs.x(n)) for n in range(31)}
    out["sp"] = cpu.get(vcpu, _sp_id(vcpu))
    out["pc"] = cpu.get(vcpu, regs.core("regs", "pc"))
    out["cpsr"] = cpu.get(vcpu, regs.core("regs", "pstate")) & 0xFFFFFFFF
    return out | read_fp(vcpu)


def read_fp(vcpu: Vcpu) -> dict[str, int]:
    out = {f"v{n}": _get_raw(vcpu, v(n), 16) for n in range(32)}
    out["fpsr"] = _get_raw(vcpu, fpsr(), 4)
    out["fpcr"] = _get_raw(vcpu, fpcr(), 4)
    return out


def write(vcpu: Vcpu, values: dict[str, int]) -> None:
    """Set the named registers (gdb's names); others are left alone."""
    for name, value in values.items():
        if name.startswith("x") and name[1:].isdigit() and int(name[1:]) < 31:
            cpu.set(vcpu, regs.x(int(name[1:])), value & (1 << 64) - 1)
        elif name == "sp":
            cpu.set(vcpu, _sp_id(vcpu), value & (1 << 64) - 1)
        elif name == "pc":
            cpu.set(vcpu, regs.core("regs", "pc"), value & (1 << 64) - 1)
        elif name == "cpsr":
            # The condition flags only: the mode, masks and step bits are
            # pyvmm's to keep (a debugger changing EL would lose the guest).
            pstate = cpu.get(vcpu, regs.core("regs", "pstate"))
            cpu.set(vcpu, regs.core("regs", "pstate"), pstate & ~0xF0000000 | value & 0xF0000000)
        elif name.startswith("v") and name[1:].isdigit() and int(name[1:]) < 32:
            _set_raw(vcpu, v(int(name[1:])), 16, value)
        elif name in ("fpsr", "fpcr"):
            _set_raw(vcpu, fpsr() if name == "fpsr" else fpcr(), 4, value)


def at_fault(vcpu: Vcpu) -> dict[str, int]:
    """The guest's registers at the instruction that faulted, when its
    exception went to pyvmm's vectors; else the vCPU's."""
    out = read(vcpu)
    if cpu.in_vectors(out["pc"]):
        out["pc"] = cpu.get(vcpu, regs.core("elr_el1"))
        out["cpsr"] = cpu.get(vcpu, regs.core("spsr", 0)) & 0xFFFFFFFF
        out["x0"] = cpu.get(vcpu, regs.sysreg("tpidr_el1"))
    return out


def fpsimd(values: dict[str, int]) -> bytes:
    """NT_PRFPREG's user_fpsimd_state of ``values`` (gdb's names)."""
    vregs = b"".join(values.get(f"v{n}", 0).to_bytes(16, "little") for n in range(32))
    return _FPSIMD.pack(vregs, values.get("fpsr", 0), values.get("fpcr", 0))
