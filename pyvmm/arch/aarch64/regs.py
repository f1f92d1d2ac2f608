"""arm64 KVM register ids (KVM_{GET,SET}_ONE_REG), from the kernel headers
the extension was built against: a core register's id carries its offset
in ``struct kvm_regs`` (read by cffi from the compiler), a system
register's its op0, op1, CRn, CRm, op2 fields at the header's shifts.
Only meaningful in an extension built on an aarch64 machine.
"""

from __future__ import annotations

from pyvmm._native import ffi, lib

#: System registers pyvmm sets or reads: (op0, op1, CRn, CRm, op2).
SYSREGS = {
    "sctlr_el1": (3, 0, 1, 0, 0),
    "cpacr_el1": (3, 0, 1, 0, 2),
    "ttbr0_el1": (3, 0, 2, 0, 0),
    "ttbr1_el1": (3, 0, 2, 0, 1),
    "tcr_el1": (3, 0, 2, 0, 2),
    "esr_el1": (3, 0, 5, 2, 0),
    "far_el1": (3, 0, 6, 0, 0),
    "mair_el1": (3, 0, 10, 2, 0),
    "vbar_el1": (3, 0, 12, 0, 0),
    "tpidr_el1": (3, 0, 13, 0, 4),
}


def core(*field: str | int) -> int:
    """The id of a core register: ``core("regs", "pc")``, ``core("sp_el1")``,
    ``core("regs", "regs", 3)`` (x3), ``core("spsr", 0)`` (SPSR_EL1)."""
    offset = ffi.offsetof("struct kvm_regs", *field)
    return lib.KVM_REG_ARM64 | lib.KVM_REG_SIZE_U64 | lib.KVM_REG_ARM_CORE | offset // 4


def x(n: int) -> int:
    return core("regs", "regs", n)


def sysreg(name: str) -> int:
    return sysreg_id(*SYSREGS[name])


def sysreg_id(op0: int, op1: int, crn: int, crm: int, op2: int) -> int:
    """A system register's ONE_REG id from its encoding."""
    return (
        lib.KVM_REG_ARM64
        | lib.KVM_REG_SIZE_U64
        | lib.KVM_REG_ARM64_SYSREG
        | op0 << lib.KVM_REG_ARM64_SYSREG_OP0_SHIFT
        | op1 << lib.KVM_REG_ARM64_SYSREG_OP1_SHIFT
        | crn << lib.KVM_REG_ARM64_SYSREG_CRN_SHIFT
        | crm << lib.KVM_REG_ARM64_SYSREG_CRM_SHIFT
        | op2 << lib.KVM_REG_ARM64_SYSREG_OP2_SHIFT
    )


def table() -> dict[str, int]:
    """Every id pyvmm uses, by name (for tests/unit/test_aarch64.py)."""
    ids = {f"x{n}": x(n) for n in range(31)}
    ids.update(
        sp=core("regs", "sp"),
        pc=core("regs", "pc"),
        pstate=core("regs", "pstate"),
        sp_el1=core("sp_el1"),
        elr_el1=core("elr_el1"),
        spsr_el1=core("spsr", 0),
    )
    ids.update({name: sysreg(name) for name in SYSREGS})
    return ids
