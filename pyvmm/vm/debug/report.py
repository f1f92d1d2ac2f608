"""A fault report that names the code.

The one fault line gets `` at FUNCTION+0xOFF`` for the guest's rip (pc
on aarch64), from the unikernel's symbols (symbols.py: read only now, at
the fault). With -v it is preceded by a frame-pointer backtrace and the
guest's registers. The backtrace follows the rbp chain (x29 on aarch64,
whose frame record has the same two words) through guest memory (each
frame's saved frame pointer and return address), through the guest-memory accessor, and
stops at the first frame that is not inside guest memory, not aligned or
not above the previous one: a guest built without frame pointers shows
fewer frames, never wrong memory.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pyvmm.common.errors import GuestFault
from pyvmm.common.log import INFO, log
from pyvmm.vm.debug.regs import guest_registers

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu
    from pyvmm.kvm.memory import GuestMemory
    from pyvmm.vm.debug.symbols import SymbolFile

MAX_FRAMES = 32
_REGISTERS = (
    "rax rbx rcx rdx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15 rip eflags "
    "cs ss fs_base gs_base cr2"
).split()
_AARCH64_REGISTERS = [f"x{n}" for n in range(31)] + ["sp", "pc", "cpsr"]


def backtrace(memory: GuestMemory, rip: int, rbp: int) -> list[int]:
    """The return addresses up the rbp chain, ``rip`` first."""
    frames = [rip]
    while len(frames) < MAX_FRAMES and rbp % 8 == 0 and 0 < rbp < memory.size - 16:
        try:
            next_rbp, ret = struct.unpack("<QQ", memory.read(rbp, 16, what="stack frame"))
        except GuestFault:
            break
        if ret == 0:
            break
        frames.append(ret)
        if next_rbp <= rbp:
            break
        rbp = next_rbp
    return frames


def name(symbols: SymbolFile | None, address: int, *, caller: bool = False) -> str | None:
    return symbols.describe(address, caller=caller) if symbols is not None else None


def annotate(err: GuestFault, vcpu: Vcpu, memory: GuestMemory, symbols: SymbolFile | None) -> None:
    """Add the function to ``err``'s line; with -v log the backtrace and
    the registers first. Never raises: a report is best effort."""
    try:
        regs = guest_registers(vcpu, memory)
        if not regs:
            return
        aarch64 = "pc" in regs
        pc, fp = (regs["pc"], regs["x29"]) if aarch64 else (regs["rip"], regs["rbp"])
        where = name(symbols, pc)
        if where is not None:
            # Before a hint ("...; run it with --cpl=0"): the place belongs
            # to the fault, not to the advice.
            fault, sep, hint = str(err).partition("; ")
            err.args = (f"{fault} at {where}{sep}{hint}", *err.args[1:])
        if log.isEnabledFor(INFO):
            for i, address in enumerate(backtrace(memory, pc, fp)):
                at = name(symbols, address, caller=i > 0)
                log.info("backtrace: #%d %#x%s", i, address, f" in {at}" if at else "")
            names = _AARCH64_REGISTERS if aarch64 else _REGISTERS
            log.info("registers: %s", " ".join(f"{r}={regs.get(r, 0):#x}" for r in names))
    except Exception:  # noqa: BLE001 (the fault's own line must still come out)
        return
