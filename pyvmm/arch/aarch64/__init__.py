"""aarch64: EL1 with the MMU on (solo5-hvt's state), hypercalls and
doorbells as 32-bit stores to the MMIO window above RAM.

``mmu`` holds the memory the guest finds at entry (translation tables,
pyvmm's fallback vectors), ``regs`` the KVM register ids, ``cpu`` the
register state, ``faults`` the reading of exceptions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyvmm._native import lib
from pyvmm.arch import ArchBase
from pyvmm.arch.aarch64 import cpu, faults, mmu
from pyvmm.kvm import Mmio

if TYPE_CHECKING:
    from pyvmm.arch import ExitHandler
    from pyvmm.kvm import System, Vcpu, VcpuExit, Vm
    from pyvmm.kvm.memory import GuestMemory, Protection

#: Whether the extension was built for aarch64 (it has arm64's KVM ioctls).
NATIVE = hasattr(lib, "KVM_ARM_VCPU_INIT")
#: The doorbells pyvmm names by their x86 port, at their MMIO address here.
DOORBELLS = {
    lib.HVT_RING_KICK_PIO: lib.HVT_RING_KICK_MMIO,
    lib.SHM_KICK_PIO: lib.SHM_KICK_MMIO,
    lib.PYVMM_NULL_KICK_PIO: lib.PYVMM_NULL_KICK_MMIO,
}


class Aarch64(ArchBase):
    machine = "aarch64"
    hypercall_exit = Mmio
    # EL1, the guest's kernel level (as solo5-hvt runs it).
    modes = {"kernel": 1}

    def __init__(self) -> None:
        # One mode: the tables depend on the regions alone.
        super().__init__(lambda regions, mode: mmu.translation_tables(regions))

    def prepare_memory(
        self, memory: GuestMemory, regions: list[tuple[int, int, Protection]], mode: str
    ) -> None:
        mmu.setup_memory(memory, regions, self.boot_tables(regions, mode))

    def setup_vcpu(
        self, system: System, vcpu: Vcpu, *, entry: int, stack: int, boot_info: int, mode: str
    ) -> None:
        cpu.init(vcpu.vm_fd, vcpu)
        cpu.setup_vcpu(vcpu, entry=entry, stack=stack, boot_info=boot_info)

    def exit_handler(self, mode: str, vcpu: Vcpu, memory: GuestMemory) -> ExitHandler | None:
        return None

    def cycle_freq(self, vcpu: Vcpu) -> int:
        # The generic timer's frequency: the guest reads the same CNTFRQ_EL0.
        return lib.pyvmm_arm64_cntfrq()

    def hypercall_number(self, exit: Mmio) -> int:
        return lib.pyvmm_hypercall_mmio(exit.is_write, exit.length, exit.addr)

    def add_doorbell(self, vm: Vm, eventfd: int, doorbell: int) -> None:
        vm.add_ioeventfd(eventfd, DOORBELLS[doorbell], 4, pio=False)

    def doorbell(self, exit: VcpuExit) -> int:
        if type(exit) is not Mmio:
            return 0
        return lib.pyvmm_doorbell_mmio(exit.is_write, exit.length, exit.addr)

    # A fault, where the guest is and its registers: read by this
    # architecture's own modules.
    explain = staticmethod(faults.explain)
    where = staticmethod(cpu.where)
    registers = staticmethod(cpu.registers)


ARCH = Aarch64()
