/*
 * fault_badptr: makes the puts hypercall with data pointing past the end of
 * guest memory (mem_size + 0x1000, 16 bytes).  The tender must check the
 * range and stop the guest with a message instead of reading host memory;
 * surviving prints "FAILURE: not stopped" and exits 2.
 */
#include "hypercall.h"
#include "rt.h"

GUEST_MANIFEST();

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    uint64_t bad = rt_boot_info()->mem_size + 0x1000;
    rt_printf("fault_badptr: puts with data at 0x%lx (past mem_size 0x%lx)\n",
              (unsigned long)bad, (unsigned long)rt_boot_info()->mem_size);
    volatile struct hvt_hc_puts p = { .data = bad, .len = 16 };
    hvt_hypercall(HVT_HYPERCALL_PUTS, &p);
    rt_puts("FAILURE: not stopped\n");
    return 2;
}
