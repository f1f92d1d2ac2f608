"""The x86_64 vCPU state a snapshot holds, read and set through KVM
(``for_arch`` gives aarch64's, vcpu_aarch64.py, with the same functions).

Each part is the kernel's own struct, kept as its raw bytes: general and
special registers, the FPU/SSE/AVX state (XSAVE, or the legacy FPU area
where KVM has no XSAVE), the extended control registers, the debug
registers, pending events and the MSRs a unikernel uses. The ioctl numbers
are the _IOC encodings of <linux/kvm.h> (their sizes checked by the
kernel: a wrong size is ENOTTY, never a wrong copy).
"""

from __future__ import annotations

import struct
import sys
from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib
from pyvmm.kvm.ioctl import KvmError

if TYPE_CHECKING:
    from pyvmm.kvm import Vcpu

_KVMIO = 0xAE
_READ, _WRITE = 2, 1


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (_KVMIO << 8) | nr


#: part -> (size, get nr, set nr); the order is the order they are set in
#: (special registers before the MSRs, XSAVE after CPUID and XCR0).
PARTS: dict[str, tuple[int, int, int]] = {
    "sregs": (312, 0x83, 0x84),
    "regs": (144, 0x81, 0x82),
    "xcrs": (392, 0xA6, 0xA7),
    "xsave": (4096, 0xA4, 0xA5),
    "fpu": (416, 0x8C, 0x8D),
    "debugregs": (128, 0xA1, 0xA2),
    "events": (64, 0x9F, 0xA0),
}
_KVM_GET_CPUID2 = _ioc(3, 0x91, 8)
_KVM_GET_MSRS = _ioc(3, 0x88, 8)
_KVM_SET_MSRS = _ioc(_WRITE, 0x89, 8)
_MSR_ENTRY = struct.Struct("<IIQ")
_MSRS_HEAD = struct.Struct("<II")

MSR_TSC = 0x10
#: The MSRs that matter to a unikernel (SYSCALL, TLS and GS bases, the
#: TSC, PAT, SYSENTER); KVM's set may lack some: those are left out.
MSRS = (
    0xC0000080,  # EFER
    0xC0000081,  # STAR
    0xC0000082,  # LSTAR
    0xC0000083,  # CSTAR
    0xC0000084,  # SFMASK
    0xC0000100,  # FS_BASE
    0xC0000101,  # GS_BASE
    0xC0000102,  # KERNEL_GS_BASE
    0xC0000103,  # TSC_AUX
    0x174,  # SYSENTER_CS
    0x175,  # SYSENTER_ESP
    0x176,  # SYSENTER_EIP
    0x277,  # PAT
    0x1A0,  # MISC_ENABLE
    MSR_TSC,  # last: set after everything it could depend on
)


def _call(vcpu: Vcpu, request: int, buf, call: str) -> int:
    ret = lib.pyvmm_ioctl_ptr(vcpu.fd, request, ffi.cast("void *", buf))
    if ret < 0:
        raise KvmError(call, -ret)
    return ret


#: ``struct kvm_cpuid_entry2``'s size, and the most entries a snapshot's
#: CPUID may have (a boot's KVM_GET_SUPPORTED_CPUID asks for as many).
CPUID_ENTRY = 40
CPUID_ENTRIES_MAX = 256


def _get_cpuid(vcpu: Vcpu) -> bytes | None:
    """The CPUID entries set on the vCPU (KVM_GET_CPUID2), or None where
    this KVM does not say."""
    cpuid = ffi.new("struct kvm_cpuid2 *", {"entries": CPUID_ENTRIES_MAX})
    cpuid.nent = CPUID_ENTRIES_MAX
    try:
        _call(vcpu, _KVM_GET_CPUID2, cpuid, "KVM_GET_CPUID2")
    except KvmError:
        return None
    return bytes(ffi.buffer(cpuid.entries, cpuid.nent * CPUID_ENTRY))


def capture(vcpu: Vcpu) -> dict[str, bytes]:
    """Every part KVM gives for this vCPU, as raw bytes, plus ``msrs`` and
    the ``cpuid`` its guest was shown."""
    state: dict[str, bytes] = {}
    for name, (size, get_nr, _) in PARTS.items():
        buf = ffi.new("char[]", size)
        try:
            _call(vcpu, _ioc(_READ, get_nr, size), buf, f"KVM_GET_{name.upper()}")
        except KvmError:
            if name in ("regs", "sregs", "fpu"):
                raise
            continue  # a part this KVM lacks (XSAVE, XCRS, ...): FPU covers it
        state[name] = bytes(ffi.buffer(buf, size))
    if "xsave" in state:
        del state["fpu"]  # XSAVE holds the same x87/SSE state and more
    state["msrs"] = _get_msrs(vcpu, MSRS)
    cpuid = _get_cpuid(vcpu)
    if cpuid:
        state["cpuid"] = cpuid
    return state


def _msr_buffer(entries: list[tuple[int, int]]):
    raw = _MSRS_HEAD.pack(len(entries), 0) + b"".join(
        _MSR_ENTRY.pack(index, 0, value) for index, value in entries
    )
    return ffi.new("char[]", raw), len(raw)


def _get_msrs(vcpu: Vcpu, wanted: tuple[int, ...]) -> bytes:
    """The MSRs of ``wanted`` that KVM knows, as ``struct kvm_msr_entry``s
    (KVM_GET_MSRS stops at the first one it refuses: that one is dropped)."""
    indices = list(wanted)
    while indices:
        buf, size = _msr_buffer([(i, 0) for i in indices])
        got = _call(vcpu, _KVM_GET_MSRS, buf, "KVM_GET_MSRS")
        if got == len(indices):
            return bytes(ffi.buffer(buf, size))[_MSRS_HEAD.size :]
        del indices[got]
    return b""


def msr_entries(raw: bytes) -> list[tuple[int, int]]:
    """``(index, value)`` of each entry of a saved MSR list."""
    return [(i, v) for i, _, v in _MSR_ENTRY.iter_unpack(raw)]


def pack_msrs(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(_MSR_ENTRY.pack(index, 0, value) for index, value in entries)


def apply(vcpu: Vcpu, state: dict[str, bytes]) -> None:
    """Set every saved part on a fresh vCPU (CPUID already set)."""
    for name, (size, _, set_nr) in PARTS.items():
        raw = state.get(name)
        if raw is None:
            continue
        buf = ffi.new("char[]", raw)
        _call(vcpu, _ioc(_WRITE, set_nr, size), buf, f"KVM_SET_{name.upper()}")
    entries = msr_entries(state["msrs"])
    buf, _ = _msr_buffer(entries)
    done = _call(vcpu, _KVM_SET_MSRS, buf, "KVM_SET_MSRS")
    if done != len(entries):
        raise KvmError(f"KVM_SET_MSRS (MSR {entries[done][0]:#x})", 22)


def part_sizes() -> dict[str, int]:
    """The size each part must have (the checks of a snapshot's state)."""
    return {name: size for name, (size, _, _) in PARTS.items()}


def rip(state: dict[str, bytes]) -> int:
    """The saved rip (``struct kvm_regs``: the 17th u64)."""
    return struct.unpack_from("<Q", state["regs"], 16 * 8)[0]


def with_rip(regs: bytes, value: int) -> bytes:
    """``struct kvm_regs`` bytes with rip set to ``value``."""
    out = bytearray(regs)
    struct.pack_into("<Q", out, 16 * 8, value)
    return bytes(out)


def read_tsc(vcpu: Vcpu) -> int:
    """The guest's TSC now (KVM_GET_MSRS)."""
    return dict(msr_entries(_get_msrs(vcpu, (MSR_TSC,)))).get(MSR_TSC, 0)


# -- what a snapshot asks of an architecture's vCPU state ----------------------------
#: The hypercall instruction: ``outl %eax, (%dx)`` (hvt's ports are above
#: 0xff, so never the imm8 form).
OUT_EAX_DX = 0xEF


def state_sizes() -> dict[str, int | tuple[int, int]]:
    """Each part's size for format.unpack_state (the MSR list: 16-byte entries)."""
    return part_sizes() | {
        "msrs": (16, 4096),
        "cpuid": (CPUID_ENTRY, CPUID_ENTRY * CPUID_ENTRIES_MAX),
    }


def missing_part(state: dict[str, bytes]) -> str | None:
    """What a saved state lacks to be set, or None."""
    for needed in ("regs", "sregs", "msrs"):
        if needed not in state:
            return f"cpu.state has no '{needed}'"
    if "xsave" not in state and "fpu" not in state:
        return "cpu.state has neither 'xsave' nor 'fpu'"
    return None


def counter(state: dict[str, bytes]) -> int | None:
    """The guest's clock counter in a state: its TSC."""
    return dict(msr_entries(state["msrs"])).get(MSR_TSC)


def with_counter(state: dict[str, bytes], value: int) -> dict[str, bytes]:
    entries = [(i, value if i == MSR_TSC else v) for i, v in msr_entries(state["msrs"])]
    return {**state, "msrs": pack_msrs(entries)}


read_counter = read_tsc


def rewind_hypercall(state: dict[str, bytes], read) -> dict[str, bytes] | None:
    """The state moved back onto the hypercall instruction just completed
    (``read(gpa, n)``: guest memory), or None if that is not one."""
    at = rip(state) - 1
    if read(at, 1) != bytes([OUT_EAX_DX]):
        return None
    return {**state, "regs": with_rip(state["regs"], at)}


def prepare(system, vcpu: Vcpu, state: dict[str, bytes]) -> None:
    """A fresh vCPU made ready for a saved state: its CPUID, the one the
    guest was shown (what it probed at its boot holds on), or, for a
    snapshot that has none, the host's as a boot sets it. Setting the saved
    one skips KVM_GET_SUPPORTED_CPUID, 0.4 ms of a cold restore here."""
    from pyvmm.arch.x86_64 import cpu

    saved = state.get("cpuid")
    if not saved:
        cpu.set_cpuid(vcpu, cpu.supported_cpuid(system))
        return
    count = len(saved) // CPUID_ENTRY
    cpuid = ffi.new("struct kvm_cpuid2 *", {"entries": count})
    cpuid.nent = count
    ffi.memmove(cpuid.entries, saved, len(saved))
    cpu.set_cpuid(vcpu, cpuid)


def for_arch(machine: str):
    """The module with these functions for ``machine`` (x86_64: this one)."""
    if machine == "aarch64":
        from pyvmm.vm.snapshot import vcpu_aarch64

        return vcpu_aarch64
    return sys.modules[__name__]
