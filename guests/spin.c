/*
 * spin: prints "spinning", then loops forever without hypercalls, so the
 * only way to end it is from outside (tests: SIGTERM must stop a CPU-bound
 * guest).  Never exits by itself.
 */
#include "rt.h"

GUEST_MANIFEST();

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    rt_puts("spinning\n");
    volatile uint64_t count = 0;
    for (;;)
        count++;
}
