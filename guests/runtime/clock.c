/*
 * Clocks.  Monotonic: the TSC scaled to nanoseconds with a 32.32 fixed-point
 * factor computed once, so each read is one multiply (128-bit product, no
 * overflow for any TSC value) and no division.  Wall: the walltime hypercall.
 */
#include "hypercall.h"
#include "rt_internal.h"

static uint64_t tsc_at_start;
static uint64_t ns_per_tick_32; /* nanoseconds per TSC tick, times 2^32 */

void rt_clock_init(const struct hvt_boot_info *bi)
{
    if (bi->cpu_cycle_freq == 0) {
        rt_puts("pyvmm-rt: bad start-up state: cpu_cycle_freq is 0\n");
        rt_halt(SOLO5_EXIT_ABORT, NULL);
    }
    /* 1e9 * 2^32 < 2^64, so this fits; relative error < 1e-9 at GHz rates. */
    ns_per_tick_32 = (1000000000ULL << 32) / bi->cpu_cycle_freq;
    tsc_at_start = rt_cycle_counter();
}

solo5_time_t solo5_clock_monotonic(void)
{
    uint64_t ticks = rt_cycle_counter() - tsc_at_start;
    return (uint64_t)(((unsigned __int128)ticks * ns_per_tick_32) >> 32);
}

solo5_time_t solo5_clock_wall(void)
{
    volatile struct hvt_hc_walltime t = { .nsecs = 0 };
    hvt_hypercall(HVT_HYPERCALL_WALLTIME, &t);
    return t.nsecs;
}
