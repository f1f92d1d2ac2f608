/*
 * solo5_set_tls_base.  Its own file so that only programs that set a TLS
 * base link the one privileged instruction of the runtime (wrmsr, run only
 * at CPL 0).
 */
#include "rt_internal.h"

/*
 * The TLS base is FS.base.  At CPL 0 write MSR_FS_BASE (always available in
 * long mode; emulated on kvm_pvm, but correct).  At CPL 3 wrmsr faults, so
 * use wrfsbase, which needs the CPU to have FSGSBASE (CPUID leaf 7, EBX bit
 * 0) and the tender to have set CR4.FSGSBASE (pyvmm's user-mode profile does
 * whenever the CPU has it).  Without FSGSBASE there is no way from user mode.
 */
#if !defined(__aarch64__)
#define MSR_FS_BASE 0xc0000100u
#define CPUID7_EBX_FSGSBASE (1u << 0)

static bool cpu_has_fsgsbase(void)
{
    uint32_t eax, ebx, ecx, edx;
    __asm__ __volatile__("cpuid"
                         : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx)
                         : "a"(0), "c"(0));
    if (eax < 7)
        return false;
    __asm__ __volatile__("cpuid"
                         : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx)
                         : "a"(7), "c"(0));
    return (ebx & CPUID7_EBX_FSGSBASE) != 0;
}
#endif

#if defined(__aarch64__)
/* aarch64: TPIDR_EL0, as Solo5's bindings (any value, any level). */
solo5_result_t solo5_set_tls_base(uintptr_t base)
{
    __asm__ __volatile__("msr tpidr_el0, %0" : : "r"((uint64_t)base) : "memory");
    return SOLO5_R_OK;
}
#else
solo5_result_t solo5_set_tls_base(uintptr_t base)
{
    /* Both instructions fault on a non-canonical address (48-bit paging). */
    uint64_t top = (uint64_t)base >> 47; /* bits 63..47 must be all equal */
    if (top != 0 && top != 0x1ffff)
        return SOLO5_R_EINVAL;
    if (rt_cpl() == 0) {
        __asm__ __volatile__("wrmsr"
                             :
                             : "c"(MSR_FS_BASE), "a"((uint32_t)base),
                               "d"((uint32_t)((uint64_t)base >> 32))
                             : "memory");
        return SOLO5_R_OK;
    }
    if (!cpu_has_fsgsbase())
        return SOLO5_R_EUNSPEC;
    __asm__ __volatile__("wrfsbase %0" : : "r"((uint64_t)base) : "memory");
    return SOLO5_R_OK;
}
#endif
