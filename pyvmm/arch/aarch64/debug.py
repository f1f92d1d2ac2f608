"""arm64 KVM's guest debugging, for the GDB stub: KVM_SET_GUEST_DEBUG with
arm64's ``struct kvm_guest_debug_arch`` (breakpoint and watchpoint value
and control registers), software breakpoints (``brk #0`` written over the
guest's text, trapped to pyvmm with KVM_GUESTDBG_USE_SW_BP), single step
(KVM_GUESTDBG_SINGLESTEP) and hardware breakpoints (KVM_GUESTDBG_USE_HW)
where KVM offers them (KVM_CAP_GUEST_DEBUG_HW_BPS, asked of the VM).

While any of these is on, the guest's own debug exceptions are KVM's,
which is what a debugger wants of a unikernel (it has no debugger of its own).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib
from pyvmm.kvm.ioctl import KvmError, ioctl

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu

# <linux/kvm.h> struct kvm_guest_debug: control, pad, then arm64's arch
# part: dbg_bcr[16], dbg_bvr[16], dbg_wcr[16], dbg_wvr[16] (KVM_ARM_MAX_DBG_REGS).
_MAX_DBG_REGS = 16
_GUEST_DEBUG = struct.Struct(f"<II{4 * _MAX_DBG_REGS}Q")
KVM_SET_GUEST_DEBUG = (1 << 30) | (_GUEST_DEBUG.size << 16) | (0xAE << 8) | 0x9B  # _IOW
GUESTDBG_ENABLE = 0x1
GUESTDBG_SINGLESTEP = 0x2
GUESTDBG_USE_SW_BP = 1 << 16
GUESTDBG_USE_HW = 1 << 17
KVM_CAP_GUEST_DEBUG_HW_BPS = 119
#: brk #0, little-endian: the software breakpoint.
BRK = struct.pack("<I", 0xD4200000)
#: DBGBCR: enabled, at EL1 and EL0 (PMC 0b11), all four bytes (BAS 0b1111).
_BCR_EXEC = 1 | 0b11 << 1 | 0b1111 << 5


def hardware_breakpoints(vcpu: Vcpu) -> int:
    """How many hardware breakpoints KVM offers this VM (0: none)."""
    try:
        return max(
            0,
            ioctl(
                vcpu.vm_fd,
                lib.KVM_CHECK_EXTENSION,
                KVM_CAP_GUEST_DEBUG_HW_BPS,
                call="KVM_CHECK_EXTENSION",
            ),
        )
    except KvmError:
        return 0


def set_guest_debug(
    vcpu: Vcpu, *, step: bool, software: bool, breakpoints: tuple[int, ...] = ()
) -> None:
    """Arm (or, with nothing asked, disarm) the vCPU's debug exits."""
    control = 0
    bcr = [0] * _MAX_DBG_REGS
    bvr = [0] * _MAX_DBG_REGS
    if step or software or breakpoints:
        control = GUESTDBG_ENABLE
    if step:
        control |= GUESTDBG_SINGLESTEP
    if software:
        control |= GUESTDBG_USE_SW_BP
    if breakpoints:
        control |= GUESTDBG_USE_HW
        for i, address in enumerate(breakpoints):
            bcr[i], bvr[i] = _BCR_EXEC, address & ~3
    raw = _GUEST_DEBUG.pack(control, 0, *bcr, *bvr, *([0] * 2 * _MAX_DBG_REGS))
    ret = lib.pyvmm_ioctl_ptr(vcpu.fd, KVM_SET_GUEST_DEBUG, ffi.new("char[]", raw))
    if ret < 0:
        raise KvmError("KVM_SET_GUEST_DEBUG", -ret)
