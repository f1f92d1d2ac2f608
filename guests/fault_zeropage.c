/*
 * fault_zeropage: reads the byte at guest address 0, which the tender's page
 * tables leave unmapped.  The tender must stop the guest; surviving prints
 * "FAILURE: not stopped" and exits 2.
 */
#include "rt.h"

GUEST_MANIFEST();

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    uint8_t value;
    rt_puts("fault_zeropage: reading address 0x0\n");
    /* Inline asm: a C null dereference would be undefined behaviour. */
#if defined(__aarch64__)
    __asm__ __volatile__("ldrb %w0, [%1]" : "=r"(value) : "r"((uintptr_t)0) : "memory");
#else
    __asm__ __volatile__("movb 0x0, %0" : "=q"(value) : : "memory");
#endif
    rt_printf("read %u\n", value);
    rt_puts("FAILURE: not stopped\n");
    return 2;
}
