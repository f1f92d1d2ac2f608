"""Where a stopped guest's registers live, for the GDB stub (gdbstub.py).

Views with one interface (``read``, ``write``, ``set_trap_flag``). On
aarch64 one (``Aarch64View``: KVM_{GET,SET}_ONE_REG) and a faulted
guest's. On x86_64 three:
the vCPU's registers (level 0, and deprivileged when the guest stopped in
its own code), the trap frame's (deprivileged, stopped in pyvmm's trap
stub: rip, rsp, rflags, cs and ss are the CPU's frame on the trap stack)
and a faulted guest's, read-only. The x87 and SSE registers are the
vCPU's in every view (KVM's XSAVE area: pyvmm's trap stubs touch none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyvmm.common.errors import GuestFault
from pyvmm.vm.debug import gdbregs
from pyvmm.vm.debug.regs import MACHINE

# Imported at set-up (the sandbox refuses a module's open later), each
# architecture's own.
if MACHINE == "aarch64":
    from pyvmm.arch.aarch64 import guestregs
else:
    from pyvmm.arch.x86_64 import fpu
    from pyvmm.arch.x86_64.cpu import RFLAGS_RESERVED, RFLAGS_TF

if TYPE_CHECKING:
    from pyvmm.arch.x86_64.traps import Frame
    from pyvmm.kvm import Vcpu

#: The rflags bits a debugger may set (no reserved bit, no VM or IOPL).
_RFLAGS_WRITABLE = 0x3F7FD7
_FP_NAMES = frozenset(fpu.NAMES) if MACHINE != "aarch64" else frozenset()


def fp_registers(vcpu: Vcpu) -> dict[str, int]:
    """The FP registers (x87/SSE, FP/SIMD) for a faulted guest's view."""
    if MACHINE == "aarch64":
        return guestregs.read_fp(vcpu)
    return fpu.values(fpu.get(vcpu))


def _write_fp(vcpu: Vcpu, values: dict[str, int]) -> dict[str, int]:
    """Set the x87/SSE registers among ``values``; the others are returned."""
    fp = {k: v for k, v in values.items() if k in _FP_NAMES}
    if fp:
        fpu.put(vcpu, fpu.with_values(fpu.get(vcpu), fp))
    return {k: v for k, v in values.items() if k not in _FP_NAMES}


class VcpuView:
    """The guest's registers are the vCPU's (level 0; deprivileged at its
    start or when interrupted in its own code)."""

    def __init__(self, vcpu: Vcpu) -> None:
        self.vcpu = vcpu

    def read(self) -> dict[str, int]:
        from pyvmm.vm.debug.regs import vcpu_registers

        return vcpu_registers(self.vcpu) | fp_registers(self.vcpu)

    def write(self, values: dict[str, int]) -> None:
        from pyvmm.arch.x86_64.cpu import get_regs, get_sregs, set_regs, set_sregs

        values = _write_fp(self.vcpu, values)
        if not values:
            return
        regs = get_regs(self.vcpu)
        for name, value in values.items():
            if name == "eflags":
                regs.rflags = (value & _RFLAGS_WRITABLE) | RFLAGS_RESERVED
            elif hasattr(regs, name):
                setattr(regs, name, value)
        set_regs(self.vcpu, regs)
        bases = {k: v for k, v in values.items() if k in ("fs_base", "gs_base")}
        if bases:
            sregs = get_sregs(self.vcpu)
            for name, value in bases.items():
                getattr(sregs, name[:2]).base = value
            set_sregs(self.vcpu, sregs)

    def set_trap_flag(self, on: bool) -> None:
        flags = self.read()["eflags"]
        self.write({"eflags": flags | RFLAGS_TF if on else flags & ~RFLAGS_TF})


class Aarch64View:
    """aarch64: the vCPU's registers (the guest stops in its own code;
    a single step is KVM's, not a flag of the guest's)."""

    def __init__(self, vcpu: Vcpu) -> None:
        self.vcpu = vcpu

    def read(self) -> dict[str, int]:
        return guestregs.read(self.vcpu)

    def write(self, values: dict[str, int]) -> None:
        guestregs.write(self.vcpu, values)

    def set_trap_flag(self, on: bool) -> None:
        """Nothing: KVM_GUESTDBG_SINGLESTEP steps (gdbstub.py)."""


class FrameView:
    """Deprivileged, stopped in pyvmm's trap stub: rip, rsp, rflags, cs and
    ss are the CPU's frame on the trap stack (the emulator's ``Frame``,
    written back when the stub returns), the other registers the vCPU's."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def read(self) -> dict[str, int]:
        frame = self.frame
        regs, sregs = frame.regs, frame.sregs
        out = {name: getattr(regs, name) for name in gdbregs.BY_NAME if hasattr(regs, name)}
        out |= {"rip": frame.rip, "rsp": frame.rsp, "eflags": frame.rflags}
        out |= {"cs": frame.cs, "ss": frame.ss}
        for seg in ("ds", "es", "fs", "gs"):
            out[seg] = getattr(sregs, seg).selector
        out["fs_base"], out["gs_base"] = sregs.fs.base, sregs.gs.base
        return out | fp_registers(frame.vcpu)

    def write(self, values: dict[str, int]) -> None:
        frame = self.frame
        for name, value in _write_fp(frame.vcpu, values).items():
            if name == "rip":
                frame.rip = value
            elif name == "rsp":
                frame.rsp = value
            elif name == "eflags":
                frame.rflags = (value & _RFLAGS_WRITABLE) | RFLAGS_RESERVED
            elif name in ("fs_base", "gs_base"):
                getattr(frame.sregs, name[:2]).base = value
                frame.sregs_dirty = True
            elif hasattr(frame.regs, name):
                setattr(frame.regs, name, value)
                frame.regs_dirty = True

    def set_trap_flag(self, on: bool) -> None:
        if on:
            self.frame.rflags |= RFLAGS_TF
        else:
            self.frame.rflags &= ~RFLAGS_TF


class FaultView:
    """A faulted guest: its registers as the fault report reads them; it
    cannot run on, so writes are refused."""

    def __init__(self, values: dict[str, int]) -> None:
        self.values = values

    def read(self) -> dict[str, int]:
        return dict(self.values)

    def write(self, values: dict[str, int]) -> None:
        raise GuestFault("the guest faulted: its registers are read-only")

    def set_trap_flag(self, on: bool) -> None:
        """Nothing: a faulted guest does not run again."""
