"""x86_64 vCPU state: registers, CPUID and the TSC through KVM's x86 ioctls.

These ioctls exist on x86 only (aarch64 sets registers one by one with
KVM_SET_ONE_REG), so they live here rather than on ``Vcpu``.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib
from pyvmm.arch import REGISTERS_UNAVAILABLE
from pyvmm.arch.x86_64.boot import (
    PML4_BASE,
    SEG_TYPE_TSS64_BUSY,
    TSS_BASE,
    TSS_LIMIT,
    gdt_bytes,
    profile_for,
)
from pyvmm.arch.x86_64.layout import IDT, IDT_LIMIT
from pyvmm.kvm.ioctl import KvmError, ioctl

if TYPE_CHECKING:
    from pyvmm.kvm import System, Vcpu

CR0_PE = 1 << 0
CR0_NE = 1 << 5
CR0_WP = 1 << 16
CR0_PG = 1 << 31
CR4_PAE = 1 << 5
CR4_OSFXSR = 1 << 9
CR4_OSXMMEXCPT = 1 << 10
CR4_FSGSBASE = 1 << 16
EFER_LME = 1 << 8
EFER_LMA = 1 << 10
EFER_NXE = 1 << 11
# RFLAGS (the start state here, the deprivileged guest's in traps.py).
RFLAGS_RESERVED = 1 << 1  # always set
RFLAGS_TF = 1 << 8
RFLAGS_IF = 1 << 9
RFLAGS_IOPL = 3 << 12  # the field; all of it set: IOPL 3
RFLAGS_NT = 1 << 14
RFLAGS_RF = 1 << 16
RFLAGS_VM = 1 << 17

CPUID_MAX_ENTRIES = 256


def _read(vcpu: Vcpu, struct: str, request: int, call: str):
    """A new ``struct`` (a cffi type name) filled by the vCPU ioctl ``request``."""
    value = ffi.new(f"{struct} *")
    ioctl(vcpu.fd, request, value, call=call)
    return value


def get_regs(vcpu: Vcpu):
    return _read(vcpu, "struct kvm_regs", lib.KVM_GET_REGS, "KVM_GET_REGS")


def set_regs(vcpu: Vcpu, regs) -> None:
    ioctl(vcpu.fd, lib.KVM_SET_REGS, regs, call="KVM_SET_REGS")


def get_sregs(vcpu: Vcpu):
    return _read(vcpu, "struct kvm_sregs", lib.KVM_GET_SREGS, "KVM_GET_SREGS")


def set_sregs(vcpu: Vcpu, sregs) -> None:
    ioctl(vcpu.fd, lib.KVM_SET_SREGS, sregs, call="KVM_SET_SREGS")


def set_cpuid(vcpu: Vcpu, cpuid) -> None:
    ioctl(vcpu.fd, lib.KVM_SET_CPUID2, cpuid, call="KVM_SET_CPUID2")


def tsc_khz(vcpu: Vcpu) -> int:
    return ioctl(vcpu.fd, lib.KVM_GET_TSC_KHZ, call="KVM_GET_TSC_KHZ")


#: KVM_GET_SUPPORTED_CPUID's answer: a fact of the host's KVM, asked once
#: per process (the warm launcher asks before it forks: pyvmm/serve/warm.py).
_supported = None


def supported_cpuid(system: System):
    """KVM_GET_SUPPORTED_CPUID as a cffi ``struct kvm_cpuid2 *`` (shared:
    not to be changed)."""
    global _supported
    if _supported is None:
        _supported = _ask_supported_cpuid(system)
    return _supported


def _ask_supported_cpuid(system: System):
    nent = CPUID_MAX_ENTRIES
    while True:
        cpuid = ffi.new("struct kvm_cpuid2 *", {"entries": nent})
        cpuid.nent = nent
        try:
            ioctl(system.fd, lib.KVM_GET_SUPPORTED_CPUID, cpuid, call="KVM_GET_SUPPORTED_CPUID")
            return cpuid
        except KvmError as err:
            if err.errno != errno.E2BIG or nent >= 4096:
                raise
            nent *= 2


def _state(vcpu: Vcpu):
    """(regs, sregs) for a fault's line, or None: reading them is best
    effort, a fault must still be reported without them."""
    try:
        return get_regs(vcpu), get_sregs(vcpu)
    except KvmError:
        return None


def where(vcpu: Vcpu) -> str:
    """Where the guest is, for fault messages (best effort)."""
    state = _state(vcpu)
    if state is None:
        return REGISTERS_UNAVAILABLE
    regs, sregs = state
    return f"rip={regs.rip:#x} rsp={regs.rsp:#x} cr2={sregs.cr2:#x}"


_GPRS = "rax rbx rcx rdx rsi rdi rbp rsp r8 r9 r10 r11 r12 r13 r14 r15 rip rflags".split()


def registers(vcpu: Vcpu) -> str:
    """The general registers and the control state, for the debug log."""
    state = _state(vcpu)
    if state is None:
        return REGISTERS_UNAVAILABLE
    regs, sregs = state
    parts = [f"{name}={getattr(regs, name):#x}" for name in _GPRS]
    parts += [f"{seg}={getattr(sregs, seg).selector:#x}" for seg in ("cs", "ss", "ds", "fs")]
    parts += [f"fs_base={sregs.fs.base:#x}"]
    parts += [f"{name}={getattr(sregs, name):#x}" for name in ("cr0", "cr2", "cr3", "cr4", "efer")]
    return " ".join(parts)


def linear_address_bits() -> int:
    """The linear-address width of the CPU setup_vcpu gives the guest
    (CPUID.80000008H:EAX[15:8]): 57 where KVM offers 5-level paging. WRMSR
    checks the FS, GS and kernel-GS bases against it whatever paging is on,
    as KVM's own emulator does; 48 before any vCPU is set up."""
    cpuid = _supported
    for i in range(cpuid.nent if cpuid is not None else 0):
        entry = cpuid.entries[i]
        if entry.function == 0x80000008:
            return (entry.eax >> 8) & 0xFF or 48
    return 48


def cpu_has_fsgsbase(cpuid) -> bool:
    """CPUID.(EAX=7,ECX=0):EBX bit 0, as KVM would show it to the guest."""
    for i in range(cpuid.nent):
        entry = cpuid.entries[i]
        if entry.function == 7 and entry.index == 0:
            return bool(entry.ebx & 1)
    return False


def setup_vcpu(
    system: System,
    vcpu: Vcpu,
    *,
    entry: int,
    stack: int,
    boot_info: int,
    cpl: int | str = 0,
) -> None:
    """Long mode, CPUID from KVM, registers as the hvt ABI says.

    The kernel profile (CPL 0) is solo5-hvt's state exactly. The user
    profile (pyvmm's guests at CPL 3) starts in 64-bit user mode: DPL 3
    segments, user page tables, IOPL 3 and a TSS whose I/O bitmap allows the
    hypercall ports, FSGSBASE so the guest can set its TLS base without a
    privileged instruction. The deprivileged profile (unmodified guests at
    CPL 3) adds pyvmm's IDT and trap stack (traps.py) and keeps IOPL 0.
    """
    profile = profile_for(cpl)
    cpuid = supported_cpuid(system)
    set_cpuid(vcpu, cpuid)
    sregs = get_sregs(vcpu)
    profile.code.load(sregs.cs)
    for seg in (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss):
        profile.data.load(seg)
    sregs.tr.base = TSS_BASE if profile.tss else 0
    sregs.tr.limit = TSS_LIMIT if profile.tss else 0
    sregs.tr.g = 0
    sregs.tr.selector = 0
    sregs.tr.type = SEG_TYPE_TSS64_BUSY
    sregs.tr.present = 1
    sregs.tr.s = 0
    sregs.tr.dpl = 0
    sregs.tr.unusable = 0
    sregs.ldt.unusable = 1
    sregs.ldt.present = 0
    sregs.gdt.base = profile.gdt_base
    sregs.gdt.limit = len(gdt_bytes(profile.segments)) - 1
    sregs.idt.base, sregs.idt.limit = idt_of(profile)
    sregs.cr0 = CR0_PE | CR0_NE | CR0_WP | CR0_PG
    sregs.cr3 = PML4_BASE
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT
    if profile.fsgsbase and cpu_has_fsgsbase(cpuid):
        sregs.cr4 |= CR4_FSGSBASE
    sregs.efer = EFER_LME | EFER_LMA | EFER_NXE
    set_sregs(vcpu, sregs)
    # Every field of kvm_regs is set (the GPRs zero): nothing to read first.
    regs = ffi.new("struct kvm_regs *")
    regs.rflags = RFLAGS_RESERVED | (RFLAGS_IOPL if profile.iopl3 else 0)
    regs.rip = entry
    regs.rsp = stack
    regs.rdi = boot_info
    set_regs(vcpu, regs)


def idt_of(profile) -> tuple[int, int]:
    """(base, limit) of the IDT the vCPU starts with: none but pyvmm's own
    in deprivileged mode (a fault elsewhere is a triple fault, reported)."""
    if profile.name != "deprivileged":
        return 0, 0
    return IDT, IDT_LIMIT
