"""x86_64's x87 and SSE state for a debugger (the GDB stub's st0-7,
fctrl..fop, xmm0-15, mxcsr) and a core file (NT_PRFPREG, Linux's
``user_i387_struct``), both kept as the FXSAVE image they are.

Read and written with KVM_GET_XSAVE/KVM_SET_XSAVE, whose first 512 bytes
are that image, and with KVM_GET_FPU/KVM_SET_FPU where KVM has no XSAVE.
XSAVE first because Linux's KVM_GET_FPU and KVM_SET_FPU leave MXCSR out
(the struct has the field; the kernel neither fills nor reads it: 0 here
while XSAVE holds the guest's 0x1f80). Either works in every privilege
mode pyvmm runs a guest in (its trap stubs touch no FP register).

The image keeps the "abridged" tag (one bit per physical register); gdb
shows the full 2-bit tag word, derived from the registers' contents as
FSTENV would.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib
from pyvmm.kvm.ioctl import KvmError

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu

_KVMIO = 0xAE


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (_KVMIO << 8) | nr


# <linux/kvm.h> struct kvm_fpu (x86): fpr[8][16], fcw, fsw, ftwx, pad1,
# last_opcode, last_ip, last_dp, xmm[16][16], mxcsr, pad2: 416 bytes.
_KVM_FPU = struct.Struct("<128sHHBxHQQ256sI4x")
KVM_GET_FPU, KVM_SET_FPU = _ioc(2, 0x8C, _KVM_FPU.size), _ioc(1, 0x8D, _KVM_FPU.size)
# struct kvm_xsave: 4096 bytes, the FXSAVE image first, then the XSAVE
# header, whose XSTATE_BV says which components are not in their reset state.
_XSAVE_SIZE = 4096
KVM_GET_XSAVE, KVM_SET_XSAVE = _ioc(2, 0xA4, _XSAVE_SIZE), _ioc(1, 0xA5, _XSAVE_SIZE)
_XSTATE_BV = 512
_X87_SSE = 0b11  # XSTATE_BV bits of the two components the image holds

#: The registers gdb's i387 and sse features name, in their order.
X87_CONTROL = ("fctrl", "fstat", "ftag", "fiseg", "fioff", "foseg", "fooff", "fop")
NAMES = (
    *(f"st{i}" for i in range(8)),
    *X87_CONTROL,
    *(f"xmm{i}" for i in range(16)),
    "mxcsr",
)
_EMPTY, _ZERO, _SPECIAL, _VALID = 3, 1, 2, 0
#: The FXSAVE image = Linux's struct user_i387_struct (x86_64): cwd, swd,
#: twd (abridged), fop, rip, rdp, mxcsr, mxcsr_mask, st_space (8 x 16
#: bytes), xmm_space (16 x 16), 96 bytes for software.
FXSAVE = struct.Struct("<HHHHQQII128s256s96s")
MXCSR_MASK = 0xFFFF  # FXSAVE's default mask: every MXCSR bit up to DAZ


def _call(vcpu: Vcpu, request: int, buf, call: str) -> None:
    ret = lib.pyvmm_ioctl_ptr(vcpu.fd, request, buf)
    if ret < 0:
        raise KvmError(call, -ret)


def _xsave(vcpu: Vcpu):
    """The vCPU's struct kvm_xsave, or None where KVM has no XSAVE."""
    buf = ffi.new("char[]", _XSAVE_SIZE)
    try:
        _call(vcpu, KVM_GET_XSAVE, buf, "KVM_GET_XSAVE")
    except KvmError:
        return None
    return buf


def get(vcpu: Vcpu) -> bytes:
    """The vCPU's FXSAVE image (512 bytes)."""
    xsave = _xsave(vcpu)
    if xsave is not None:
        return bytes(ffi.buffer(xsave, FXSAVE.size))
    buf = ffi.new("char[]", _KVM_FPU.size)
    _call(vcpu, KVM_GET_FPU, buf, "KVM_GET_FPU")
    return from_kvm_fpu(bytes(ffi.buffer(buf, _KVM_FPU.size)))


def put(vcpu: Vcpu, image: bytes) -> None:
    """Set the vCPU's x87 and SSE state to ``image`` (the rest stays)."""
    xsave = _xsave(vcpu)
    if xsave is not None:
        ffi.memmove(xsave, image, FXSAVE.size)
        (bv,) = struct.unpack_from("<Q", ffi.buffer(xsave, _XSAVE_SIZE), _XSTATE_BV)
        # A component whose bit is clear is loaded as its reset state: the
        # image's x87 and SSE parts must count.
        struct.pack_into("<Q", ffi.buffer(xsave, _XSAVE_SIZE), _XSTATE_BV, bv | _X87_SSE)
        _call(vcpu, KVM_SET_XSAVE, xsave, "KVM_SET_XSAVE")
        return
    _call(vcpu, KVM_SET_FPU, ffi.new("char[]", to_kvm_fpu(image)), "KVM_SET_FPU")


def from_kvm_fpu(raw: bytes) -> bytes:
    """The FXSAVE image of a struct kvm_fpu (MXCSR as KVM left it)."""
    fpr, fcw, fsw, ftwx, fop, fip, fdp, xmm, mxcsr = _KVM_FPU.unpack(raw)
    return FXSAVE.pack(fcw, fsw, ftwx, fop, fip, fdp, mxcsr, MXCSR_MASK, fpr, xmm, bytes(96))


def to_kvm_fpu(image: bytes) -> bytes:
    fcw, fsw, ftw, fop, fip, fdp, mxcsr, _, st, xmm, _ = FXSAVE.unpack(image)
    return _KVM_FPU.pack(st, fcw, fsw, ftw & 0xFF, fop, fip, fdp, xmm, mxcsr)


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


def values(image: bytes) -> dict[str, int]:
    """gdb's x87 and SSE registers of an FXSAVE image, by name."""
    fcw, fsw, ftw, fop, fip, fdp, mxcsr, _, st_space, xmm, _ = FXSAVE.unpack(image)
    st = [st_space[16 * i : 16 * i + 10] for i in range(8)]
    out = {f"st{i}": int.from_bytes(st[i], "little") for i in range(8)}
    out |= {"fctrl": fcw, "fstat": fsw, "ftag": full_tag(ftw & 0xFF, fsw, st), "fop": fop}
    # 64-bit FXSAVE: the selectors' places hold the addresses' high halves,
    # which is how gdb's amd64 target reads them.
    out |= {"fioff": fip & 0xFFFFFFFF, "fiseg": fip >> 32}
    out |= {"fooff": fdp & 0xFFFFFFFF, "foseg": fdp >> 32}
    out |= {f"xmm{i}": int.from_bytes(xmm[16 * i : 16 * i + 16], "little") for i in range(16)}
    out["mxcsr"] = mxcsr
    return out


def with_values(image: bytes, new: dict[str, int]) -> bytes:
    """``image`` with the named registers of ``new`` set."""
    fcw, fsw, ftw, fop, fip, fdp, mxcsr, mask, st, xmm, rest = FXSAVE.unpack(image)
    st, xmm = bytearray(st), bytearray(xmm)
    for name, value in new.items():
        if name.startswith("st"):
            i = int(name[2:])
            st[16 * i : 16 * i + 10] = (value & (1 << 80) - 1).to_bytes(10, "little")
        elif name.startswith("xmm"):
            i = int(name[3:])
            xmm[16 * i : 16 * i + 16] = (value & (1 << 128) - 1).to_bytes(16, "little")
    v = {**values(image), **new}
    fip = (v["fiseg"] & 0xFFFFFFFF) << 32 | v["fioff"] & 0xFFFFFFFF
    fdp = (v["foseg"] & 0xFFFFFFFF) << 32 | v["fooff"] & 0xFFFFFFFF
    return FXSAVE.pack(
        v["fctrl"] & 0xFFFF,
        v["fstat"] & 0xFFFF,
        abridged_tag(v["ftag"]),
        v["fop"] & 0x7FF,
        fip,
        fdp,
        v["mxcsr"] & (mask or MXCSR_MASK),
        mask,
        bytes(st),
        bytes(xmm),
        rest,
    )
