/*
 * fault_xdata: calls a `ret` instruction placed in a writable data array,
 * which the tender maps without execute permission.  The tender must stop
 * the guest; surviving prints "FAILURE: not stopped" and exits 2.
 */
#include "rt.h"

GUEST_MANIFEST();

/* ret, then int3 padding; initialised so it lives in .data, not .bss. */
#if defined(__aarch64__)
static volatile uint32_t code[4] = { 0xd65f03c0 }; /* ret */
#else
static volatile uint8_t code[16] = { 0xc3, 0xcc, 0xcc, 0xcc };
#endif

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    rt_printf("fault_xdata: calling code in data at %p\n", (void *)code);
#if defined(__aarch64__)
    __asm__ __volatile__("blr %0" : : "r"(code) : "x30", "memory");
#else
    __asm__ __volatile__("call *%0" : : "r"(code) : "memory");
#endif
    rt_puts("FAILURE: not stopped\n");
    return 2;
}
