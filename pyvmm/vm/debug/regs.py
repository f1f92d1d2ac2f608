"""The guest's registers at a fault, as a debugger should see them.

Usually the vCPU's own. In deprivileged mode (docs/pvm.md) a fault the
guest cannot take stops the vCPU inside one of pyvmm's trap stubs, just
after its ``out``: the general registers are still the guest's (the stub
changes none), but rip, cs, rflags, rsp and ss are the CPU's frame on the
trap stack, which says where the guest was. On aarch64, a fault the
guest took into pyvmm's vectors is read back to its instruction
(pyvmm/arch/aarch64/guestregs.py).
"""

from __future__ import annotations

import os
import struct
import sys
from typing import TYPE_CHECKING

from pyvmm.common.errors import GuestFault
from pyvmm.kvm.ioctl import KvmError

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu
    from pyvmm.kvm.memory import GuestMemory

#: Linux's user_regs_struct (x86_64), the order of an NT_PRSTATUS note.
USER_REGS = (
    "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs "
    "eflags rsp ss fs_base gs_base ds es fs gs"
).split()
_GPRS = [name for name in USER_REGS[:15] if name != "orig_rax"]
_OUT_LENGTH = 2  # out %al, $imm8
MACHINE = os.uname().machine
# Imported now, at set-up: the sandbox refuses the open of a module at a fault.
if MACHINE == "aarch64":
    from pyvmm.arch.aarch64 import guestregs


def vcpu_registers(vcpu: Vcpu) -> dict[str, int]:
    """The vCPU's registers under user_regs_struct's names (x86_64)."""
    from pyvmm.arch.x86_64.cpu import get_regs, get_sregs

    regs, sregs = get_regs(vcpu), get_sregs(vcpu)
    out = {name: getattr(regs, name) for name in _GPRS}
    out |= {"rip": regs.rip, "eflags": regs.rflags, "rsp": regs.rsp}
    for seg in ("cs", "ss", "ds", "es", "fs", "gs"):
        out[seg] = getattr(sregs, seg).selector
    out["fs_base"], out["gs_base"] = sregs.fs.base, sregs.gs.base
    out["cr2"] = sregs.cr2
    return out


def guest_registers(vcpu: Vcpu, memory: GuestMemory) -> dict[str, int]:
    """The guest's registers at a fault ({} if KVM cannot say)."""
    if MACHINE == "aarch64":
        try:
            return guestregs.at_fault(vcpu)
        except KvmError:
            return {}
    try:
        regs = vcpu_registers(vcpu)
    except KvmError:
        return {}
    # Loaded only by a deprivileged run (its trap emulator): no stubs otherwise.
    if "pyvmm.arch.x86_64.traps" not in sys.modules or regs["cs"] & 3:
        return regs
    from pyvmm.arch.x86_64 import layout as traps  # the stubs' and frames' places

    offset = regs["rip"] - _OUT_LENGTH - traps.STUBS
    if not 0 <= offset < traps.VECTORS * traps.STUB_SIZE or offset % traps.STUB_SIZE:
        return regs
    vector = offset // traps.STUB_SIZE
    with_code = vector in traps.ERROR_CODE_VECTORS
    words = traps.FRAME_WORDS + with_code
    try:
        raw = memory.read(traps.frame_address(vector), 8 * words, what="trap frame")
    except GuestFault:
        return regs
    rip, cs, rflags, rsp, ss = struct.unpack(f"<{words}Q", raw)[with_code:]
    regs |= {"rip": rip, "cs": cs & 0xFFFF, "eflags": rflags, "rsp": rsp, "ss": ss & 0xFFFF}
    return regs
