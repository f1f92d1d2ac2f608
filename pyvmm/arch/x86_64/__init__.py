"""x86_64: long mode at CPL 0 (solo5-hvt's state) or 3 (pyvmm's user mode),
hypercalls and doorbells as 4-byte ``outl`` to I/O ports.

``boot`` holds the memory the guest finds at entry (GDT, page tables, TSS),
``cpu`` the register state, ``faults`` the reading of x86-only exits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyvmm._native import lib
from pyvmm.arch import ArchBase
from pyvmm.arch.x86_64 import cpu, faults
from pyvmm.arch.x86_64.boot import *  # noqa: F403  (the layout, for tests and docs)
from pyvmm.arch.x86_64.boot import DEPRIVILEGED, PROFILES, mode_page_tables, setup_memory
from pyvmm.kvm import IoOut

if TYPE_CHECKING:
    from pyvmm.arch import ExitHandler
    from pyvmm.kvm import System, Vcpu, VcpuExit, Vm
    from pyvmm.kvm.memory import GuestMemory, Protection

#: Whether the extension was built for x86_64 (it has x86's KVM ioctls).
NATIVE = hasattr(lib, "KVM_GET_REGS")


class X86_64(ArchBase):
    machine = "x86_64"
    hypercall_exit = IoOut
    modes = {name: profile.cpl for name, profile in PROFILES.items()}

    def __init__(self) -> None:
        super().__init__(mode_page_tables)

    def prepare_memory(
        self, memory: GuestMemory, regions: list[tuple[int, int, Protection]], mode: str
    ) -> None:
        setup_memory(memory, regions, mode, tables=self.boot_tables(regions, mode))

    def setup_vcpu(
        self, system: System, vcpu: Vcpu, *, entry: int, stack: int, boot_info: int, mode: str
    ) -> None:
        cpu.setup_vcpu(system, vcpu, entry=entry, stack=stack, boot_info=boot_info, cpl=mode)

    def exit_handler(self, mode: str, vcpu: Vcpu, memory: GuestMemory) -> ExitHandler | None:
        if mode != DEPRIVILEGED.name:
            return None
        # The decoder and trap emulator load only for the mode that needs them.
        from pyvmm.arch.x86_64 import traps

        return traps.emulator(mode, vcpu, memory)

    def cycle_freq(self, vcpu: Vcpu) -> int:
        return cpu.tsc_khz(vcpu) * 1000

    def hypercall_number(self, exit: IoOut) -> int:
        return lib.pyvmm_hypercall_pio(exit.size, exit.count, exit.port)

    def add_doorbell(self, vm: Vm, eventfd: int, doorbell: int) -> None:
        vm.add_ioeventfd(eventfd, doorbell, 4, pio=True)

    def doorbell(self, exit: VcpuExit) -> int:
        if type(exit) is not IoOut:
            return 0
        return lib.pyvmm_doorbell_pio(exit.size, exit.count, exit.port)

    # A fault, where the guest is and its registers: read by this
    # architecture's own modules.
    explain = staticmethod(faults.explain)
    where = staticmethod(cpu.where)
    registers = staticmethod(cpu.registers)


ARCH = X86_64()
