"""Why a run ended badly, in one line: the exits no handler answers.

The architecture reads its own exits first (an x86 triple fault, a stray
port access); what is left means the same everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyvmm.common.errors import GuestFault
from pyvmm.common.log import DEBUG, log
from pyvmm.kvm import FailEntry, Hlt, InternalError, MemoryFault, Mmio

if TYPE_CHECKING:
    from pyvmm.arch import Arch
    from pyvmm.kvm import Vcpu, VcpuExit
    from pyvmm.kvm.memory import GuestMemory


def fault(exit: VcpuExit, arch: Arch, vcpu: Vcpu, memory: GuestMemory) -> GuestFault:
    if log.isEnabledFor(DEBUG):
        log.debug("vCPU registers at the fault: %s", arch.registers(vcpu))
    specific = arch.explain(exit, vcpu, memory)
    if specific is not None:
        return specific
    where = arch.where(vcpu)
    match exit:
        case MemoryFault() if (gone := memory.gone_page()) is not None:
            return GuestFault(
                f"guest fault: KVM: guest memory at {gone:#x} is gone: the file it was "
                f"mapped from was truncated while the guest ran ({where})"
            )
        case MemoryFault(gpa=gpa):
            at = f" at {gpa:#x}" if gpa is not None else ""
            return GuestFault(
                f"guest fault: KVM: host/guest translation fault: write to read-only "
                f"memory{at} ({where})"
            )
        case Mmio(addr=addr, is_write=is_write) if addr < memory.size:
            # Under PVM, fetching code from a page the host mapped without
            # exec shows up as an MMIO exit inside RAM.
            return GuestFault(
                f"guest fault: KVM: host/guest translation fault "
                f"{'writing' if is_write else 'accessing'} "
                f"{addr:#x} (not executable or not accessible) ({where})"
            )
        case Mmio(addr=addr, is_write=is_write):
            verb = "write to" if is_write else "read from"
            return GuestFault(f"guest fault: {verb} unmapped address {addr:#x} ({where})")
        case InternalError(suberror=sub):
            return GuestFault(
                f"guest fault: KVM: internal error exit: suberror={sub:#x} "
                f"(instruction KVM cannot emulate?) ({where})"
            )
        case FailEntry(hardware_reason=reason):
            return GuestFault(
                f"KVM: entry failure: hw_entry_failure_reason={reason:#x} "
                f"(KVM could not enter the guest) ({where})"
            )
        case Hlt():
            return GuestFault(f"guest halted the CPU without the halt hypercall ({where})")
    return GuestFault(f"guest fault: unexpected VM exit {exit} ({where})")
