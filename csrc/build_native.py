"""cffi builder for pyvmm._native (API mode: compiled against the headers).

Struct layouts and ioctl numbers come from <linux/kvm.h> and from the
headers in csrc/ at build time; nothing here hand-computes an offset.
csrc/*.h are written so cffi's cdef parser can read them directly, which is
how the guest/host ABI stays defined in exactly one place.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
SOURCE_DIR = "csrc"
SHARED_HEADERS = (
    "hvt_abi.h",
    "pyvmm_abi.h",
    "shmstream.h",
    "solo5_ring.h",
    "kvm_run.h",
    "kvm_ioctl.h",
    "hctransport.h",
    "fdwait.h",
    "guestmap.h",
    "signals.h",
    "console.h",
    "netns.h",
    "guestmem.h",
    "imagelease.h",
    "hcfast.h",
    "iothread.h",
    "tap_io.h",
    "sandbox.h",
)
SOURCES = (
    "kvm_run.c",
    "kvm_ioctl.c",
    "hctransport.c",
    "fdwait.c",
    "guestmap.c",
    "signals.c",
    "console.c",
    "netns.c",
    "guestmem.c",
    "imagelease.c",
    "hcfast.c",
    "iothread.c",
    "iothread_shm.c",
    "iothread_solo5.c",
    "tap_io.c",
    "sandbox.c",
)

_DEFINE = re.compile(r"^#define\s+\w+\s+(0x[0-9a-fA-F]+|\d+)\s*$")


def cdef_of(header: Path) -> str:
    """The header with preprocessor lines dropped, except integer #defines."""
    lines = []
    for line in header.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and not _DEFINE.match(stripped):
            continue
        lines.append(line)
    return "\n".join(lines)


# Values filled in by the C compiler from <linux/kvm.h> ("..." in cdef).
KVM_CONSTANTS = """
KVM_API_VERSION KVM_GET_API_VERSION KVM_CREATE_VM KVM_CHECK_EXTENSION
KVM_GET_VCPU_MMAP_SIZE KVM_CREATE_VCPU KVM_SET_USER_MEMORY_REGION KVM_RUN
KVM_IOEVENTFD KVM_GET_STATS_FD KVM_MEM_READONLY
KVM_EXIT_UNKNOWN KVM_EXIT_EXCEPTION KVM_EXIT_IO KVM_EXIT_HYPERCALL
KVM_EXIT_DEBUG KVM_EXIT_HLT KVM_EXIT_MMIO KVM_EXIT_SHUTDOWN
KVM_EXIT_FAIL_ENTRY KVM_EXIT_INTR KVM_EXIT_INTERNAL_ERROR
KVM_EXIT_SYSTEM_EVENT KVM_EXIT_IO_IN KVM_EXIT_IO_OUT
KVM_CAP_USER_MEMORY KVM_CAP_IOEVENTFD KVM_CAP_BINARY_STATS_FD
KVM_CAP_READONLY_MEM KVM_CAP_NR_MEMSLOTS
KVM_IOEVENTFD_FLAG_PIO KVM_IOEVENTFD_FLAG_DATAMATCH KVM_IOEVENTFD_FLAG_DEASSIGN
KVM_STATS_TYPE_MASK KVM_STATS_UNIT_MASK KVM_STATS_BASE_MASK
""".split()

X86_CONSTANTS = """
KVM_GET_REGS KVM_SET_REGS KVM_GET_SREGS KVM_SET_SREGS
KVM_GET_SUPPORTED_CPUID KVM_SET_CPUID2 KVM_GET_TSC_KHZ KVM_SET_TSS_ADDR
KVM_SET_IDENTITY_MAP_ADDR KVM_CAP_GET_TSC_KHZ KVM_CAP_EXT_CPUID

""".split()

# arm64 (<asm/kvm.h> through <linux/kvm.h>): vCPU init, ONE_REG ids (the
# id of a core register adds offsetof(struct kvm_regs, ...) / 4, read from
# the struct below; a system register's the op0..op2 fields shifted here).
AARCH64_CONSTANTS = """
KVM_ARM_VCPU_INIT KVM_ARM_PREFERRED_TARGET KVM_GET_ONE_REG KVM_SET_ONE_REG
KVM_GET_REG_LIST KVM_ARM_VCPU_PSCI_0_2
KVM_REG_ARM64 KVM_REG_SIZE_U32 KVM_REG_SIZE_U64 KVM_REG_ARM_CORE
KVM_REG_ARM64_SYSREG KVM_REG_ARM_COPROC_SHIFT
KVM_REG_ARM64_SYSREG_OP0_SHIFT KVM_REG_ARM64_SYSREG_OP1_SHIFT
KVM_REG_ARM64_SYSREG_CRN_SHIFT KVM_REG_ARM64_SYSREG_CRM_SHIFT
KVM_REG_ARM64_SYSREG_OP2_SHIFT
KVM_EXIT_ARM_NISV KVM_SYSTEM_EVENT_SHUTDOWN KVM_SYSTEM_EVENT_RESET
KVM_CAP_ARM_PSCI_0_2 KVM_CAP_ONE_REG KVM_CAP_ARM_VM_IPA_SIZE KVM_CAP_ARM_PMU_V3
KVM_CAP_ARM_PTRAUTH_ADDRESS KVM_CAP_ARM_SVE KVM_CAP_ARM_EL1_32BIT
""".split()

KVM_STRUCTS = """
struct kvm_userspace_memory_region {
    uint32_t slot;
    uint32_t flags;
    uint64_t guest_phys_addr;
    uint64_t memory_size;
    uint64_t userspace_addr;
};
struct kvm_ioeventfd {
    uint64_t datamatch;
    uint64_t addr;
    uint32_t len;
    int32_t fd;
    uint32_t flags;
    ...;
};
struct kvm_stats_header {
    uint32_t flags;
    uint32_t name_size;
    uint32_t num_desc;
    uint32_t id_offset;
    uint32_t desc_offset;
    uint32_t data_offset;
};
struct kvm_stats_desc {
    uint32_t flags;
    int16_t exponent;
    uint16_t size;
    uint32_t offset;
    uint32_t bucket_size;
    char name[];
};
"""

X86_STRUCTS = """
struct kvm_regs {
    uint64_t rax, rbx, rcx, rdx;
    uint64_t rsi, rdi, rsp, rbp;
    uint64_t r8, r9, r10, r11;
    uint64_t r12, r13, r14, r15;
    uint64_t rip, rflags;
};
struct kvm_segment {
    uint64_t base;
    uint32_t limit;
    uint16_t selector;
    uint8_t type;
    uint8_t present, dpl, db, s, l, g, avl;
    uint8_t unusable;
    ...;
};
struct kvm_dtable {
    uint64_t base;
    uint16_t limit;
    ...;
};
struct kvm_sregs {
    struct kvm_segment cs, ds, es, fs, gs, ss;
    struct kvm_segment tr, ldt;
    struct kvm_dtable gdt, idt;
    uint64_t cr0, cr2, cr3, cr4, cr8;
    uint64_t efer;
    uint64_t apic_base;
    unsigned long long interrupt_bitmap[...];
};
struct kvm_cpuid_entry2 {
    uint32_t function;
    uint32_t index;
    uint32_t flags;
    uint32_t eax;
    uint32_t ebx;
    uint32_t ecx;
    uint32_t edx;
    ...;
};
struct kvm_cpuid2 {
    uint32_t nent;
    ...;
    struct kvm_cpuid_entry2 entries[];
};
"""

# cffi cannot parse __uint128_t (struct user_fpsimd_state): kvm_regs names
# only the fields pyvmm uses and lets the compiler place them ("...").
AARCH64_STRUCTS = """
struct user_pt_regs {
    uint64_t regs[31];
    uint64_t sp;
    uint64_t pc;
    uint64_t pstate;
};
struct kvm_regs {
    struct user_pt_regs regs;
    uint64_t sp_el1;
    uint64_t elr_el1;
    uint64_t spsr[...];
    ...;
};
struct kvm_vcpu_init {
    uint32_t target;
    uint32_t features[...];
};
struct kvm_one_reg {
    uint64_t id;
    uint64_t addr;
};
uint64_t pyvmm_arm64_cntfrq(void);
"""


def arch_source(machine: str) -> str:
    """The architecture's part of the data plane (csrc/arch.h)."""
    if not (HERE / f"arch_{machine}.c").exists():
        raise SystemExit(f"pyvmm: no data plane for {machine} (csrc/arch_{machine}.c)")
    return f"arch_{machine}.c"


def build_ffi(machine: str | None = None) -> FFI:
    machine = machine or platform.machine()
    ffi = FFI()
    constants = list(KVM_CONSTANTS)
    structs = KVM_STRUCTS
    if machine == "x86_64":
        constants += X86_CONSTANTS
        structs += X86_STRUCTS
    elif machine == "aarch64":
        constants += AARCH64_CONSTANTS
        structs += AARCH64_STRUCTS
    ffi.cdef("\n".join(f"#define {name} ..." for name in constants))
    ffi.cdef(structs)
    for header in SHARED_HEADERS:
        ffi.cdef(cdef_of(HERE / header))
    ffi.set_source(
        "pyvmm._native",
        '#include <linux/kvm.h>\n#include "arch.h"\n'
        + "".join(f'#include "{h}"\n' for h in SHARED_HEADERS),
        # setuptools insists on /-separated paths relative to setup.py's
        # directory, whatever the current directory of whoever imports this.
        sources=[f"{SOURCE_DIR}/{s}" for s in (*SOURCES, arch_source(machine))],
        include_dirs=[SOURCE_DIR],
        # The sandbox's filter (csrc/sandbox.c): Debian's libseccomp-dev.
        libraries=["seccomp"],
        extra_compile_args=["-O2", "-Wall", "-std=gnu11"],
    )
    return ffi


ffibuilder = build_ffi()

# Build with pip (`pip install -e .`), which runs this through setup.py's
# cffi_modules; there is deliberately no direct-run entry point, whose
# interpreter-tagged .so would shadow the abi3 one pip builds.
