/*
 * fault_wtext: writes to a byte of its own text segment, which the tender
 * maps read-only.  The tender must stop the guest (non-zero exit, message on
 * stderr); surviving prints "FAILURE: not stopped" and exits 2.
 */
#include "rt.h"

GUEST_MANIFEST();

static void __attribute__((noinline)) target(void)
{
    __asm__ __volatile__("");
}

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    volatile uint8_t *p = (volatile uint8_t *)(uintptr_t)&target;
    rt_printf("fault_wtext: writing to text at %p\n", (void *)p);
    *p = *p;
    rt_puts("FAILURE: not stopped\n");
    return 2;
}
