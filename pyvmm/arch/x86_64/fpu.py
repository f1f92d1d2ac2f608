"""x86_64's x87 and SSE state through KVM_GET_FPU / KVM_SET_FPU, for a
debugger (the GDB stub's st0-7, fctrl..fop, xmm0-15, mxcsr) and a core
file (NT_PRFPREG, Linux's ``user_i387_struct``: the FXSAVE image).

KVM_GET_FPU works in every privilege mode pyvmm runs a guest in (the
trap stubs of a deprivileged guest touch no FP register), where XSAVE may
be missing (kvm_pvm offers it, another KVM may not); the x87 and SSE
registers are the same in both. KVM keeps the FXSAVE "abridged" tag (one
bit per physical register); gdb shows the full 2-bit tag word, so it is
derived from the registers' contents as the FSTENV instruction would.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib
from pyvmm.kvm.ioctl import KvmError

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu

# <linux/kvm.h> struct kvm_fpu (x86): fpr[8][16], fcw, fsw, ftwx, pad1,
# last_opcode, last_ip, last_dp, xmm[16][16], mxcsr, pad2: 416 bytes.
_KVM_FPU = struct.Struct("<128sHHBxHQQ256sI4x")
_KVMIO = 0xAE
KVM_GET_FPU = (2 << 30) | (_KVM_FPU.size << 16) | (_KVMIO << 8) | 0x8C  # _IOR
KVM_SET_FPU = (1 << 30) | (_KVM_FPU.size << 16) | (_KVMIO << 8) | 0x8D  # _IOW

#: The registers gdb's i387 and sse features name, in their order.
X87_CONTROL = ("fctrl", "fstat", "ftag", "fiseg", "fioff", "foseg", "fooff", "fop")
NAMES = (
    *(f"st{i}" for i in range(8)),
    *X87_CONTROL,
    *(f"xmm{i}" for i in range(16)),
    "mxcsr",
)
_EMPTY, _ZERO, _SPECIAL, _VALID = 3, 1, 2, 0
#: Linux's struct user_i387_struct (x86_64) = FXSAVE's 512 bytes: cwd,
#: swd, twd (abridged), fop, rip, rdp, mxcsr, mxcsr_mask, st_space
#: (8 x 16 bytes), xmm_space (16 x 16), padding.
_FXSAVE = struct.Struct("<HHHHQQII128s256s96x")
MXCSR_MASK = 0xFFFF  # FXSAVE's default mask: every MXCSR bit up to DAZ


def get(vcpu: Vcpu) -> bytes:
    """The vCPU's struct kvm_fpu, raw."""
    buf = ffi.new("char[]", _KVM_FPU.size)
    ret = lib.pyvmm_ioctl_ptr(vcpu.fd, KVM_GET_FPU, buf)
    if ret < 0:
        raise KvmError("KVM_GET_FPU", -ret)
    return bytes(ffi.buffer(buf, _KVM_FPU.size))


def put(vcpu: Vcpu, raw: bytes) -> None:
    buf = ffi.new("char[]", raw)
    ret = lib.pyvmm_ioctl_ptr(vcpu.fd, KVM_SET_FPU, buf)
    if ret < 0:
        raise KvmError("KVM_SET_FPU", -ret)


def _tag(register: bytes) -> int:
    """The full tag of a non-empty 80-bit register (Intel SDM, FSTENV)."""
    exponent = int.from_bytes(register[8:10], "little") & 0x7FFF
    mantissa = int.from_bytes(register[:8], "little")
    if exponent == 0x7FFF:
        return _SPECIAL
    if exponent == 0:
        return _ZERO if mantissa == 0 else _SPECIAL
    return _VALID if mantissa >> 63 else _SPECIAL


def full_tag(abridged: int, fsw: int, st: list[bytes]) -> int:
    """The 16-bit tag word from FXSAVE's abridged one; ``st`` in stack
    order (st[0] = ST(0)), tags by physical register."""
    top = (fsw >> 11) & 7
    word = 0
    for physical in range(8):
        tag = _tag(st[(physical - top) & 7]) if abridged >> physical & 1 else _EMPTY
        word |= tag << (2 * physical)
    return word


def abridged_tag(full: int) -> int:
    return sum(1 << p for p in range(8) if (full >> (2 * p)) & 3 != _EMPTY)


def values(raw: bytes) -> dict[str, int]:
    """gdb's x87 and SSE registers of a struct kvm_fpu, by name."""
    fpr, fcw, fsw, ftwx, fop, fip, fdp, xmm, mxcsr = _KVM_FPU.unpack(raw)
    st = [fpr[16 * i : 16 * i + 10] for i in range(8)]
    out = {f"st{i}": int.from_bytes(st[i], "little") for i in range(8)}
    out |= {"fctrl": fcw, "fstat": fsw, "ftag": full_tag(ftwx, fsw, st), "fop": fop}
    # 64-bit FXSAVE: the selectors' places hold the addresses' high halves,
    # which is how gdb's amd64 target reads them.
    out |= {"fioff": fip & 0xFFFFFFFF, "fiseg": fip >> 32}
    out |= {"fooff": fdp & 0xFFFFFFFF, "foseg": fdp >> 32}
    out |= {f"xmm{i}": int.from_bytes(xmm[16 * i : 16 * i + 16], "little") for i in range(16)}
    out["mxcsr"] = mxcsr
    return out


def with_values(raw: bytes, new: dict[str, int]) -> bytes:
    """``raw`` (a struct kvm_fpu) with the named registers of ``new`` set."""
    fpr, fcw, fsw, ftwx, fop, fip, fdp, xmm, mxcsr = _KVM_FPU.unpack(raw)
    fpr, xmm = bytearray(fpr), bytearray(xmm)
    for name, value in new.items():
        if name.startswith("st"):
            i = int(name[2:])
            fpr[16 * i : 16 * i + 10] = (value & (1 << 80) - 1).to_bytes(10, "little")
        elif name.startswith("xmm"):
            i = int(name[3:])
            xmm[16 * i : 16 * i + 16] = (value & (1 << 128) - 1).to_bytes(16, "little")
    v = {**values(raw), **new}
    fip = (v["fiseg"] & 0xFFFFFFFF) << 32 | v["fioff"] & 0xFFFFFFFF
    fdp = (v["foseg"] & 0xFFFFFFFF) << 32 | v["fooff"] & 0xFFFFFFFF
    return _KVM_FPU.pack(
        bytes(fpr),
        v["fctrl"] & 0xFFFF,
        v["fstat"] & 0xFFFF,
        abridged_tag(v["ftag"]),
        v["fop"] & 0x7FF,
        fip,
        fdp,
        bytes(xmm),
        v["mxcsr"] & MXCSR_MASK,
    )


def fxsave(raw: bytes) -> bytes:
    """The FXSAVE image (NT_PRFPREG's ``user_i387_struct``) of a struct kvm_fpu."""
    fpr, fcw, fsw, ftwx, fop, fip, fdp, xmm, mxcsr = _KVM_FPU.unpack(raw)
    return _FXSAVE.pack(fcw, fsw, ftwx, fop, fip, fdp, mxcsr, MXCSR_MASK, fpr, xmm)
