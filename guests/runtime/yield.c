/*
 * solo5_yield: the poll hypercall, which blocks the vCPU until a net device
 * has input or the timeout passes.
 *
 * A back end whose frames arrive in guest memory (the shmstream rings,
 * net_shm.c) registers rt_yield_ops.  Then:
 *   1. look at its rings (no exit); frames waiting, or the deadline passed:
 *      return at once (a hypercall with timeout 0 only if other net devices
 *      need one to report their input);
 *   2. announce sleep on every ring (the host's IO thread then signals the
 *      eventfd the poll hypercall waits on when it fills one); if frames
 *      slipped in meanwhile, return them instead of sleeping;
 *   3. the poll hypercall with the remaining timeout;
 *   4. withdraw the announcements; the ready set is what the rings hold plus
 *      the hypercall's answer for the devices the back end does not serve.
 */
#include "hypercall.h"
#include "rt_internal.h"

static const struct rt_yield_ops *ops;

void rt_yield_set_ops(const struct rt_yield_ops *o)
{
    ops = o;
}

static solo5_handle_set_t poll_hypercall(solo5_time_t timeout)
{
    volatile struct hvt_hc_poll p = {
        .timeout_nsecs = timeout,
        .ready_set = 0,
        .ret = 0,
    };
    hvt_hypercall(HVT_HYPERCALL_POLL, &p);
    return p.ready_set;
}

void solo5_yield(solo5_time_t deadline, solo5_handle_set_t *ready_set)
{
    solo5_time_t now = solo5_clock_monotonic();
    solo5_time_t timeout = deadline > now ? deadline - now : 0;
    solo5_handle_set_t ready;

    if (ops == NULL) {
        ready = poll_hypercall(timeout);
    } else {
        ready = ops->ready();
        if (ready != 0 || timeout == 0) {
            if (ready == 0 && ops->others != 0)
                ready = poll_hypercall(0) & ~ops->served;
        } else if (!ops->prepare_sleep()) {
            ready = ops->ready();
        } else {
            solo5_handle_set_t host = poll_hypercall(timeout);
            ops->awake();
            ready = ops->ready() | (host & ~ops->served);
        }
    }
    if (ready_set != NULL)
        *ready_set = ready;
}
