"""x86_64 faults: what an exit only x86 has means, in one line.

The guest has no IDT of ours, so any exception it takes ends in a triple
fault (a shutdown exit); CR2 and RIP, reliable under PVM and VMX alike
(measured), tell the usual causes apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyvmm._native import lib
from pyvmm.arch.x86_64 import cpu
from pyvmm.arch.x86_64.boot import LOW_ABSENT_END, LOW_READONLY_END
from pyvmm.common.errors import GuestFault, HostError
from pyvmm.kvm import IoIn, IoOut, Shutdown

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu, VcpuExit
    from pyvmm.kvm.memory import GuestMemory


def explain(exit: VcpuExit, vcpu: Vcpu, memory: GuestMemory) -> GuestFault | None:
    match exit:
        case IoOut(port=port, size=size, count=count) if (
            number := lib.pyvmm_hypercall_pio_slot(size, count, port)
        ) >= 0:
            # Shaped as a hypercall (csrc/hctransport.h) but not one pyvmm answers.
            what = (
                f"invalid hypercall: 4-byte write to port {port:#x} "
                f"(Invalid guest hypercall: num={number})"
            )
        case IoOut(port=port, size=size):
            what = (
                f"invalid hypercall: {size}-byte write to port {port:#x} "
                f"(Invalid guest port access: port={port:#x})"
            )
        case IoIn(port=port, size=size):
            what = (
                f"invalid {size}-byte read from port {port:#x} "
                f"(Invalid guest port access: port={port:#x})"
            )
        case Shutdown():
            what = triple_fault(vcpu, memory)
        case _:
            return None
    return GuestFault(f"guest fault: {what} ({cpu.where(vcpu)})")


def triple_fault(vcpu: Vcpu, memory: GuestMemory) -> str:
    try:
        regs, sregs = cpu.get_regs(vcpu), cpu.get_sregs(vcpu)
    except HostError:
        return "triple fault (unhandled exception)"
    return explain_page_fault(memory, regs.rip, sregs.cr2)


def explain_page_fault(memory: GuestMemory, rip: int, cr2: int) -> str:
    """Best reading of a triple fault from RIP and the last fault address."""
    if cr2 == rip:
        return f"instruction fetch from non-executable memory at {cr2:#x}"
    if cr2 < LOW_ABSENT_END:
        return f"access to unmapped page zero at {cr2:#x} (NULL pointer?)"
    if cr2 >= memory.size:
        return f"access to {cr2:#x}, outside guest memory (size {memory.size:#x})"
    if memory.is_read_only(cr2, cr2 + 1) or cr2 < LOW_READONLY_END:
        return f"write to read-only memory at {cr2:#x}"
    return "triple fault (unhandled exception)"
