"""arm64 KVM's guest debugging, for the GDB stub: KVM_SET_GUEST_DEBUG with
arm64's ``struct kvm_guest_debug_arch`` (breakpoint and watchpoint value
and control registers), software breakpoints (``brk #0`` written over the
guest's text, trapped to pyvmm with KVM_GUESTDBG_USE_SW_BP), single step
(KVM_GUESTDBG_SINGLESTEP), hardware breakpoints and watchpoints
(KVM_GUESTDBG_USE_HW) where KVM offers them (KVM_CAP_GUEST_DEBUG_HW_BPS and
_WPS, asked of the VM). A debug exit says which of them stopped the guest
by its syndrome's exception class (ESR_EL2, the exit's ``hsr``) and, for a
watchpoint, the address accessed (``far``).

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
KVM_CAP_GUEST_DEBUG_HW_WPS = 120
# ESR's exception classes of a debug exit (the guest at EL1 is a lower EL
# than KVM's EL2; the current-EL ones are listed for completeness).
EC_HW_BREAK = frozenset({0x30, 0x31})
EC_STEP = frozenset({0x32, 0x33})
EC_WATCH = frozenset({0x34, 0x35})
EC_BRK = 0x3C
#: brk #0, little-endian: the software breakpoint.
BRK = struct.pack("<I", 0xD4200000)
#: DBGBCR: enabled, at EL1 and EL0 (PMC 0b11), all four bytes (BAS 0b1111).
_BCR_EXEC = 1 | 0b11 << 1 | 0b1111 << 5
#: gdb's watchpoint kinds (Z2 write, Z3 read, Z4 access) as DBGWCR.LSC
#: (0b10 stores, 0b01 loads, 0b11 both).
_LSC = {2: 0b10, 3: 0b01, 4: 0b11}
#: The stop reply's name for each kind.
WATCH_REPLY = {2: b"watch", 3: b"rwatch", 4: b"awatch"}
WATCH_LENGTHS = (1, 2, 4, 8)


def exception_class(hsr: int) -> int:
    """ESR's exception class (bits 31:26)."""
    return (hsr >> 26) & 0x3F


def _offered(vcpu: Vcpu, cap: int) -> int:
    try:
        return max(0, ioctl(vcpu.vm_fd, lib.KVM_CHECK_EXTENSION, cap, call="KVM_CHECK_EXTENSION"))
    except KvmError:
        return 0


def hardware_breakpoints(vcpu: Vcpu) -> int:
    """How many hardware breakpoints KVM offers this VM (0: none)."""
    return min(_offered(vcpu, KVM_CAP_GUEST_DEBUG_HW_BPS), _MAX_DBG_REGS)


def hardware_watchpoints(vcpu: Vcpu) -> int:
    """How many hardware watchpoints KVM offers this VM (0: none)."""
    return min(_offered(vcpu, KVM_CAP_GUEST_DEBUG_HW_WPS), _MAX_DBG_REGS)


def watch_registers(kind: int, address: int, length: int) -> tuple[int, int]:
    """(DBGWCR, DBGWVR) of a watchpoint on ``length`` bytes at ``address``:
    the doubleword holding them in WVR, the bytes in BAS. Only naturally
    aligned 1, 2, 4 or 8 bytes fit one register pair (ValueError else)."""
    if kind not in _LSC:
        raise ValueError(f"watchpoint kind {kind}")
    if length not in WATCH_LENGTHS or address % length or not 0 <= address < 1 << 64:
        raise ValueError(f"watchpoint of {length} bytes at {address:#x}")
    bas = ((1 << length) - 1) << (address & 7)
    wcr = 1 | 0b11 << 1 | _LSC[kind] << 3 | bas << 5  # enabled, at EL1 and EL0
    return wcr, address & ~7


def watch_hit(far: int, watchpoints: list[tuple[int, int, int]]) -> tuple[int, int, int] | None:
    """Which (kind, address, length) caught an access at ``far``: the one
    holding it, else the nearest (an access wider than the watched bytes,
    a pair store for one, may report an address below them)."""
    if not watchpoints:
        return None
    for watch in watchpoints:
        if watch[1] <= far < watch[1] + watch[2]:
            return watch
    return min(watchpoints, key=lambda watch: abs(watch[1] - far))


def guest_debug(
    *,
    step: bool,
    software: bool,
    breakpoints: tuple[int, ...] = (),
    watchpoints: tuple[tuple[int, int, int], ...] = (),
) -> bytes:
    """struct kvm_guest_debug for these: breakpoint addresses, and
    watchpoints as (Z kind, address, length)."""
    control = 0
    bcr = [0] * _MAX_DBG_REGS
    bvr = [0] * _MAX_DBG_REGS
    wcr = [0] * _MAX_DBG_REGS
    wvr = [0] * _MAX_DBG_REGS
    if step or software or breakpoints or watchpoints:
        control = GUESTDBG_ENABLE
    if step:
        control |= GUESTDBG_SINGLESTEP
    if software:
        control |= GUESTDBG_USE_SW_BP
    if breakpoints or watchpoints:
        control |= GUESTDBG_USE_HW
    for i, address in enumerate(breakpoints):
        bcr[i], bvr[i] = _BCR_EXEC, address & ~3
    for i, (kind, address, length) in enumerate(watchpoints):
        wcr[i], wvr[i] = watch_registers(kind, address, length)
    return _GUEST_DEBUG.pack(control, 0, *bcr, *bvr, *wcr, *wvr)


def set_guest_debug(
    vcpu: Vcpu,
    *,
    step: bool,
    software: bool,
    breakpoints: tuple[int, ...] = (),
    watchpoints: tuple[tuple[int, int, int], ...] = (),
) -> None:
    """Arm (or, with nothing asked, disarm) the vCPU's debug exits."""
    raw = guest_debug(
        step=step, software=software, breakpoints=breakpoints, watchpoints=watchpoints
    )
    ret = lib.pyvmm_ioctl_ptr(vcpu.fd, KVM_SET_GUEST_DEBUG, ffi.new("char[]", raw))
    if ret < 0:
        raise KvmError("KVM_SET_GUEST_DEBUG", -ret)
