"""aarch64 faults: what an exception the guest took means, in one line.

Until the guest installs its own vectors, an exception runs pyvmm's
(mmu.VECTORS), which store to FAULT_MMIO + 8 * entry: the exit says which
kind of exception, ESR_EL1 why, FAR_EL1 where, ELR_EL1 from which
instruction, as an x86 triple fault is read from CR2 and RIP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyvmm._native import lib
from pyvmm.arch.aarch64 import cpu, mmu, regs
from pyvmm.common.errors import GuestFault, HostError
from pyvmm.kvm import Mmio, SystemEvent, UnknownExit

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu, VcpuExit
    from pyvmm.kvm.memory import GuestMemory

KINDS = ("synchronous exception", "IRQ", "FIQ", "SError")
ORIGINS = ("EL1 with SP_EL0", "EL1", "EL0 (AArch64)", "EL0 (AArch32)")

# ESR_EL1.EC values (ARM ARM D17.2.37).
EC_UNKNOWN = 0x00
EC_SVC64 = 0x15
EC_SYSREG = 0x18
EC_IABT_LOW, EC_IABT_CUR = 0x20, 0x21
EC_PC_ALIGN = 0x22
EC_DABT_LOW, EC_DABT_CUR = 0x24, 0x25
EC_SP_ALIGN = 0x26
EC_BRK64 = 0x3C


def explain_exception(memory_size: int, esr: int, far: int, elr: int) -> str:
    """Best reading of a synchronous exception from ESR, FAR and ELR."""
    ec = esr >> 26
    fsc = esr & 0x3F  # fault status code (aborts)
    kind = fsc >> 2  # 1 translation, 2 access flag, 3 permission
    if ec in (EC_IABT_LOW, EC_IABT_CUR) and kind == 3:
        return f"instruction fetch from non-executable memory at {far:#x}"
    if ec in (EC_IABT_LOW, EC_IABT_CUR, EC_DABT_LOW, EC_DABT_CUR):
        if far < mmu.LOW_ABSENT_END:
            return f"access to unmapped page zero at {far:#x} (NULL pointer?)"
        if far >= memory_size and not mmu.MMIO_BASE <= far < mmu.MMIO_BASE + mmu.MMIO_SIZE:
            return f"access to {far:#x}, outside guest memory (size {memory_size:#x})"
        if ec in (EC_DABT_LOW, EC_DABT_CUR) and kind == 3 and esr & (1 << 6):
            return f"write to read-only memory at {far:#x}"
        if ec in (EC_IABT_LOW, EC_IABT_CUR):
            return f"instruction abort at {far:#x} (ESR_EL1={esr:#x})"
        return f"data abort at {far:#x} (ESR_EL1={esr:#x})"
    names = {
        EC_UNKNOWN: "undefined instruction",
        EC_SVC64: "svc instruction",
        EC_SYSREG: "trapped system register access",
        EC_PC_ALIGN: "misaligned pc",
        EC_SP_ALIGN: "misaligned stack pointer",
        EC_BRK64: "brk instruction",
    }
    name = names.get(ec, f"exception class {ec:#x}")
    return f"{name} at {elr:#x} (ESR_EL1={esr:#x})"


def explain(exit: VcpuExit, vcpu: Vcpu, memory: GuestMemory) -> GuestFault | None:
    match exit:
        case Mmio(addr=addr, is_write=True) if (
            mmu.FAULT_MMIO <= addr < mmu.FAULT_MMIO + 8 * mmu.VECTOR_ENTRIES
        ):
            what = vector_fault((addr - mmu.FAULT_MMIO) // 8, vcpu, memory)
        case Mmio(addr=addr, length=length, is_write=True) if (
            0 <= addr - mmu.MMIO_BASE < 8 * (lib.HVT_HYPERCALL_MAX + 1)
        ):
            number = (addr - mmu.MMIO_BASE) >> 3
            what = (
                f"invalid hypercall: {length}-byte write to {addr:#x} "
                f"(Invalid guest hypercall: num={number})"
            )
        case SystemEvent():
            what = "the guest turned the system off or reset it (PSCI), not the halt hypercall"
        case UnknownExit(reason=reason, hardware_reason=iss) if reason == lib.KVM_EXIT_ARM_NISV:
            what = (
                f"data abort KVM cannot decode (ISS={iss:#x}): "
                "an MMIO access that is not a plain load or store"
            )
        case _:
            return None
    return GuestFault(f"guest fault: {what} ({cpu.where(vcpu)})")


def vector_fault(index: int, vcpu: Vcpu, memory: GuestMemory) -> str:
    kind, origin = KINDS[index % 4], ORIGINS[index // 4]
    if kind != KINDS[0]:
        return f"unexpected {kind} taken from {origin}"
    try:
        esr = cpu.get(vcpu, regs.sysreg("esr_el1"))
        far = cpu.get(vcpu, regs.sysreg("far_el1"))
        elr = cpu.get(vcpu, regs.core("elr_el1"))
    except HostError:
        return f"unhandled {kind} taken from {origin}"
    return explain_exception(memory.size, esr, far, elr)
