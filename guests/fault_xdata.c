/*
 * fault_xdata: calls a `ret` instruction placed in a writable data array,
 * which the tender maps without execute permission.  The tender must stop
 * the guest; surviving prints "FAILURE: not stopped" and exits 2.
 */
#include "rt.h"

GUEST_MANIFEST();

/* ret, then int3 padding; initialised so it lives in .data, not .bss. */
static volatile uint8_t code[16] = { 0xc3, 0xcc, 0xcc, 0xcc };

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    rt_printf("fault_xdata: calling code in data at %p\n", (void *)code);
    __asm__ __volatile__("call *%0" : : "r"(code) : "memory");
    rt_puts("FAILURE: not stopped\n");
    return 2;
}
