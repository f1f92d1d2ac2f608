/*
 * solo5_yield: the poll hypercall, which blocks the vCPU until a net device
 * has input or the timeout passes.  A future ring driver must look at its
 * rings before blocking here (frames may already be waiting in memory).
 */
#include "hypercall.h"
#include "rt_internal.h"

void solo5_yield(solo5_time_t deadline, solo5_handle_set_t *ready_set)
{
    solo5_time_t now = solo5_clock_monotonic();
    volatile struct hvt_hc_poll p = {
        .timeout_nsecs = deadline > now ? deadline - now : 0,
        .ready_set = 0,
        .ret = 0,
    };
    hvt_hypercall(HVT_HYPERCALL_POLL, &p);
    if (ready_set != NULL)
        *ready_set = p.ready_set;
}
