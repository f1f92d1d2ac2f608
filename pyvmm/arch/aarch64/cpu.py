"""aarch64 vCPU state: bring-up (preferred target, KVM_ARM_VCPU_INIT) and
registers one by one through KVM_{GET,SET}_ONE_REG."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib
from pyvmm.arch import REGISTERS_UNAVAILABLE
from pyvmm.arch.aarch64 import mmu, regs
from pyvmm.kvm.ioctl import KvmError, ioctl

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu, Vm


def get(vcpu: Vcpu, reg_id: int) -> int:
    value = ffi.new("uint64_t *")
    one = ffi.new("struct kvm_one_reg *", {"id": reg_id, "addr": int(ffi.cast("uintptr_t", value))})
    ioctl(vcpu.fd, lib.KVM_GET_ONE_REG, one, call="KVM_GET_ONE_REG")
    return value[0]


def set(vcpu: Vcpu, reg_id: int, val: int) -> None:  # noqa: A001 (KVM's name)
    value = ffi.new("uint64_t *", val)
    one = ffi.new("struct kvm_one_reg *", {"id": reg_id, "addr": int(ffi.cast("uintptr_t", value))})
    ioctl(vcpu.fd, lib.KVM_SET_ONE_REG, one, call="KVM_SET_ONE_REG")


def init(vm: Vm | int, vcpu: Vcpu) -> None:
    """KVM_ARM_PREFERRED_TARGET on the VM, then KVM_ARM_VCPU_INIT (PSCI 0.2)."""
    vm_fd = vm if isinstance(vm, int) else vm.fd
    target = ffi.new("struct kvm_vcpu_init *")
    ioctl(vm_fd, lib.KVM_ARM_PREFERRED_TARGET, target, call="KVM_ARM_PREFERRED_TARGET")
    target.features[0] |= 1 << lib.KVM_ARM_VCPU_PSCI_0_2
    ioctl(vcpu.fd, lib.KVM_ARM_VCPU_INIT, target, call="KVM_ARM_VCPU_INIT")


def setup_vcpu(vcpu: Vcpu, *, entry: int, stack: int, boot_info: int) -> None:
    """The hvt ABI's entry state: MMU on with pyvmm's tables, EL1h with
    every exception masked, x0 = boot info, FP/SIMD not trapped."""
    set(vcpu, regs.sysreg("mair_el1"), mmu.MAIR_EL1)
    set(vcpu, regs.sysreg("tcr_el1"), mmu.TCR_EL1)
    set(vcpu, regs.sysreg("ttbr0_el1"), mmu.TTBR0_EL1)
    set(vcpu, regs.sysreg("ttbr1_el1"), 0)
    set(vcpu, regs.sysreg("vbar_el1"), mmu.VECTORS)
    set(vcpu, regs.sysreg("cpacr_el1"), mmu.CPACR_FPEN)
    sctlr = get(vcpu, regs.sysreg("sctlr_el1"))  # keeps the reset value's RES1 bits
    set(vcpu, regs.sysreg("sctlr_el1"), sctlr | mmu.SCTLR_M | mmu.SCTLR_C | mmu.SCTLR_I)
    set(vcpu, regs.core("regs", "pstate"), mmu.PSTATE)
    set(vcpu, regs.core("sp_el1"), stack & ~0xF)
    for n in range(31):
        set(vcpu, regs.x(n), 0)
    set(vcpu, regs.x(0), boot_info)
    set(vcpu, regs.core("regs", "pc"), entry)


def in_vectors(pc: int) -> bool:
    return mmu.VECTORS <= pc < mmu.VECTORS + mmu.PAGE


def where(vcpu: Vcpu) -> str:
    """Where the guest is, for fault messages (best effort): inside pyvmm's
    vectors, where the exception was taken from."""
    try:
        pc = get(vcpu, regs.core("regs", "pc"))
        sp = get(vcpu, regs.core("sp_el1"))
        if in_vectors(pc):
            pc = get(vcpu, regs.core("elr_el1"))
        far = get(vcpu, regs.sysreg("far_el1"))
    except KvmError:
        return REGISTERS_UNAVAILABLE
    return f"pc={pc:#x} sp={sp:#x} far={far:#x}"


def registers(vcpu: Vcpu) -> str:
    """The general registers and the system state, for the debug log."""
    try:
        values = {f"x{n}": get(vcpu, regs.x(n)) for n in range(31)}
        if in_vectors(get(vcpu, regs.core("regs", "pc"))):
            values["x0"] = get(vcpu, regs.sysreg("tpidr_el1"))  # what the vector kept
        for name in ("sp_el1", "elr_el1"):
            values[name] = get(vcpu, regs.core(name))
        values["pc"] = get(vcpu, regs.core("regs", "pc"))
        values["pstate"] = get(vcpu, regs.core("regs", "pstate"))
        values["spsr_el1"] = get(vcpu, regs.core("spsr", 0))
        for name in ("esr_el1", "far_el1", "sctlr_el1", "tcr_el1", "ttbr0_el1", "vbar_el1"):
            values[name] = get(vcpu, regs.sysreg(name))
    except KvmError:
        return REGISTERS_UNAVAILABLE
    return " ".join(f"{name}={value:#x}" for name, value in values.items())
