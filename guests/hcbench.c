/*
 * hcbench: what a guest exit costs.
 *
 *   hcbench.hvt [N]        default N = 1000
 *   hcbench.hvt ringkick   one write to Solo5's ring doorbell, which this
 *                          guest was given no ring for: the host must stop
 *                          it ("FAILURE: not stopped" and exit 2 if not)
 *
 * Times, with the TSC-based monotonic clock, N walltime hypercalls (each an
 * exit to the tender's user space and back), then N 4-byte writes of 0 to
 * port PYVMM_NULL_KICK_PIO, which pyvmm has KVM absorb in the kernel
 * (ioeventfd): the cost of a device kick.  A tender that does not register
 * that port sees an unknown port write and stops the guest.  Output:
 *   cpl: N
 *   hypercall_ns: <average ns per walltime hypercall>
 *   kick_ns: <average ns per kick>
 *   SUCCESS
 * Bad arguments: a FAILURE: line and exit status 1.
 */
#include "rt.h"
#include "pyvmm_abi.h"
#include "hvt_abi.h"

GUEST_MANIFEST();

#define DEFAULT_N 1000
#define MAX_N 100000000ULL

static inline void kick(uint16_t port)
{
    __asm__ __volatile__("outl %0, %1" : : "a"((uint32_t)0), "d"(port) : "memory");
}

static inline void null_kick(void)
{
    kick(PYVMM_NULL_KICK_PIO);
}

int solo5_app_main(const struct solo5_start_info *si)
{
    uint64_t n = DEFAULT_N;
    const char *p = rt_skip_spaces(si->cmdline);
    if (strcmp(p, "ringkick") == 0) {
        kick(HVT_RING_KICK_PIO);
        rt_puts("FAILURE: not stopped\n");
        return 2;
    }
    if (*p != '\0') {
        if (!rt_parse_u64(&p, &n) || *rt_skip_spaces(p) != '\0' || n < 1
                || n > MAX_N) {
            rt_printf("FAILURE: bad arguments (usage: hcbench [N], N 1-%llu)\n",
                      MAX_N);
            return SOLO5_EXIT_FAILURE;
        }
    }

    rt_printf("cpl: %d\n", rt_cpl());

    solo5_time_t t0 = solo5_clock_monotonic();
    for (uint64_t i = 0; i < n; i++)
        (void)solo5_clock_wall();
    solo5_time_t t1 = solo5_clock_monotonic();
    rt_printf("hypercall_ns: %llu\n", (unsigned long long)((t1 - t0) / n));

    t0 = solo5_clock_monotonic();
    for (uint64_t i = 0; i < n; i++)
        null_kick();
    t1 = solo5_clock_monotonic();
    rt_printf("kick_ns: %llu\n", (unsigned long long)((t1 - t0) / n));

    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
