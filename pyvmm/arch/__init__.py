"""The architecture seam: what differs between x86_64 and aarch64 hosts.

Everything above it (plan, runner, hvt, devices) is portable and reaches
the CPU only through an ``Arch``: how guest memory is prepared for entry
(page tables, descriptor tables), how the vCPU starts, how a VM exit
carries a hypercall or a doorbell, and how a fault is explained. An
architecture is a module under ``pyvmm/arch/`` exposing ``ARCH``;
``host_arch()`` picks the host's, imported lazily so that a start imports
one architecture only. The C side keeps the same split: the exit decoding
is per architecture (csrc/arch_<machine>.c), the rest shared; which exit
is a hypercall is decided once, in C (csrc/hctransport.h), for the fast
path and for ``Arch.hypercall`` alike.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Protocol

from pyvmm.arch.boottables import BootTables
from pyvmm.common.errors import HostError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pyvmm.common.errors import GuestFault
    from pyvmm.kvm import System, Vcpu, VcpuExit, Vm
    from pyvmm.kvm.memory import GuestMemory, Protection

# platform.machine() spelling -> module under pyvmm/arch/ (written ones only).
ARCHES = {"x86_64": "x86_64", "aarch64": "aarch64"}

#: How the guest's code runs: "kernel" at its own privilege level as
#: solo5-hvt runs it; "user" deprivileged by its own declaration (pyvmm's
#: CAP1 note: it executes nothing privileged); "deprivileged" an unmodified
#: kernel-mode guest run in user mode, its privileged instructions trapped
#: and emulated (docs/pvm.md).
MODES = ("kernel", "user", "deprivileged")

#: What a fault's line says where KVM will not give the registers (reading
#: them is best effort: the fault is still reported).
REGISTERS_UNAVAILABLE = "registers unavailable"


class ExitHandler(Protocol):
    def handle(self, exit: VcpuExit) -> bool:
        """True when this exit was answered and the guest may go on."""

    def counters(self) -> dict[str, int]: ...


class Arch(Protocol):
    """One architecture's part of a run (see docs/architecture.md)."""

    #: platform.machine() spelling; also what the ELF loader checks against.
    machine: str
    #: The exit type that carries hypercalls (counted by name in --stats).
    hypercall_exit: type

    #: Privilege modes this architecture offers (MODES below), with the
    #: privilege level the guest's code actually runs at in each.
    modes: dict[str, int]

    def prepare_memory(
        self, memory: GuestMemory, regions: list[tuple[int, int, Protection]], mode: str
    ) -> None:
        """Write what the guest needs at entry besides the ELF image (tables)."""

    def keep_boot_tables(self, entries: int) -> None:
        """From now on keep the page tables ``prepare_memory`` computes, for
        up to ``entries`` (regions, mode) pairs: a warm launcher forking many
        VMs of one image computes them once (pyvmm/arch/boottables.py)."""

    def boot_tables(
        self, regions: list[tuple[int, int, Protection]], mode: str
    ) -> Mapping[int, bytes]:
        """The page tables ``prepare_memory`` writes for ``regions`` in
        ``mode`` ({guest address: bytes}): kept ones, or computed now."""

    def setup_vcpu(
        self, system: System, vcpu: Vcpu, *, entry: int, stack: int, boot_info: int, mode: str
    ) -> None:
        """Registers and CPU state at entry, as the hvt ABI says."""

    def exit_handler(self, mode: str, vcpu: Vcpu, memory: GuestMemory) -> ExitHandler | None:
        """What answers the exits a mode adds (deprivileged mode's traps)."""

    def cycle_freq(self, vcpu: Vcpu) -> int:
        """The guest's cycle counter frequency in Hz (boot info)."""

    def hypercall(self, exit: VcpuExit) -> tuple[int, int] | None:
        """(hypercall number, argument GPA) if this exit is a hypercall, as
        csrc/hctransport.h decodes it (the C fast path's answer too)."""

    def add_doorbell(self, vm: Vm, eventfd: int, doorbell: int) -> None:
        """Let the guest's notification ``doorbell`` signal ``eventfd``
        inside KVM, without an exit to pyvmm."""

    def doorbell(self, exit: VcpuExit) -> int:
        """The doorbell (its x86 port) this exit rings, as
        csrc/hctransport.h decodes it for the fast path too; 0: none."""

    def explain(self, exit: VcpuExit, vcpu: Vcpu, memory: GuestMemory) -> GuestFault | None:
        """The fault for an exit only this architecture can read, or None."""

    def where(self, vcpu: Vcpu) -> str:
        """Where the guest is (registers), for fault messages."""

    def registers(self, vcpu: Vcpu) -> str:
        """Every register worth reading after a fault, on one line (-vv)."""


class ArchBase:
    """What every architecture does alike, written once; each writes the
    rest of ``Arch``. Its boot tables: one ``BootTables`` over its own
    computation (``compute(regions, mode)``), kept when a warm launcher
    asks (pyvmm/arch/boottables.py). A hypercall: an exit of its
    ``hypercall_exit`` type that its ``hypercall_number`` decodes."""

    hypercall_exit: type

    def __init__(
        self, compute: Callable[[list[tuple[int, int, Protection]], str], dict[int, bytes]]
    ) -> None:
        self._boot_tables = BootTables(compute)

    def keep_boot_tables(self, entries: int) -> None:
        self._boot_tables.keep(entries)

    def boot_tables(
        self, regions: list[tuple[int, int, Protection]], mode: str
    ) -> Mapping[int, bytes]:
        return self._boot_tables.get(regions, mode)

    def hypercall_number(self, exit: VcpuExit) -> int:
        """The hypercall an exit of ``hypercall_exit``'s type carries, as
        csrc/hctransport.h decodes it (the C fast path's answer too); 0: none."""
        raise NotImplementedError

    def doorbell(self, exit: VcpuExit) -> int:
        """The doorbell an exit of ``hypercall_exit``'s type rings; 0: none."""
        raise NotImplementedError

    def hypercall(self, exit: VcpuExit) -> tuple[int, int] | None:
        # The argument's GPA is the 32-bit value the guest wrote.
        if type(exit) is self.hypercall_exit:
            number = self.hypercall_number(exit)
            if number:
                return number, exit.value
        return None


def host_arch(machine: str | None = None) -> Arch:
    """The architecture pyvmm runs guests on here; one clear line if none."""
    machine = machine or os.uname().machine  # platform.machine(), without its import
    name = ARCHES.get(machine)
    if name is None:
        written = ", ".join(ARCHES)
        raise HostError(
            f"{machine} hosts are not supported yet (pyvmm boots guests on {written} only)"
        )
    module = importlib.import_module(f"pyvmm.arch.{name}")
    if not module.NATIVE:
        raise HostError(
            f"the native extension was built for another architecture than this "
            f"{machine} host: build it here (scripts/setup)"
        )
    return module.ARCH
