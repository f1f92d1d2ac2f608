/*
 * Privilege level and privileged CPU setup.
 *
 * Privileged CPU setup lives in rt_platform_setup and nowhere else (apart
 * from the CPL 0 branch of solo5_set_tls_base).  The tender already enters
 * the guest in long mode with paging, so there is nothing to do yet: no IDT
 * (a fault ends the guest, which is what the tender reports), no interrupts,
 * no MSRs.  At CPL 3 (pyvmm's user-mode profile) privileged instructions
 * fault, so the function must do nothing privileged there.
 */
#include "rt_internal.h"

int rt_cpl(void)
{
#if defined(__aarch64__)
    return 0; /* EL1, the kernel level: pyvmm offers no user mode on arm64 */
#else
    uint16_t cs;
    /* Reading a segment register is allowed at every privilege level; the
     * low two bits of the code selector are the current privilege level. */
    __asm__ __volatile__("mov %%cs, %0" : "=r"(cs));
    return cs & 3;
#endif
}

void rt_platform_setup(const struct hvt_boot_info *bi)
{
    (void)bi;
    if (rt_cpl() != 0)
        return; /* user mode: nothing privileged may run */
    /* CPL 0: privileged setup would go here (none needed yet). */
}
