/*
 * Privileged CPU setup lives here and nowhere else.
 *
 * The tender already enters the guest in long mode with paging, so there is
 * nothing to do yet: no IDT (a fault ends the guest, which is what the
 * tender reports), no interrupts, no MSRs.  When the runtime runs at CPL 3
 * this function is the one thing to skip.
 */
#include "rt_internal.h"

void rt_platform_setup(const struct hvt_boot_info *bi)
{
    (void)bi;
}
