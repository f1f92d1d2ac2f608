/*
 * sleep: clocks and poll timeouts.
 *  - the monotonic clock never goes backwards;
 *  - solo5_yield with a deadline already passed returns at once;
 *  - solo5_yield to now + 1 ms, 10 ms, 100 ms returns no earlier than the
 *    deadline and less than 1 s after it;
 *  - the wall clock is after 2020-01-01 and advances across the sleeps.
 */
#include "rt.h"

GUEST_MANIFEST();

#define MS 1000000ULL
#define WALL_2020 1577836800ULL /* 2020-01-01T00:00:00Z, in seconds */

static int failures;

static void fail(const char *what, uint64_t value)
{
    rt_printf("FAILURE: %s (%lu)\n", what, (unsigned long)value);
    failures++;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    solo5_time_t wall0 = solo5_clock_wall();
    if (wall0 / 1000000000ULL < WALL_2020)
        fail("wall clock before 2020 (s)", wall0 / 1000000000ULL);

    solo5_time_t prev = solo5_clock_monotonic();
    for (int i = 0; i < 1000; i++) {
        solo5_time_t t = solo5_clock_monotonic();
        if (t < prev)
            fail("monotonic clock went backwards (ns)", prev - t);
        prev = t;
    }

    solo5_handle_set_t ready = ~0ULL;
    solo5_time_t t0 = solo5_clock_monotonic();
    solo5_yield(t0 > MS ? t0 - MS : 0, &ready);
    solo5_time_t spent = solo5_clock_monotonic() - t0;
    rt_printf("yield to a past deadline: returned after %lu us\n",
              (unsigned long)(spent / 1000));
    if (spent > 1000 * MS)
        fail("yield to a past deadline blocked (us)", spent / 1000);
    if (ready != 0)
        fail("yield without devices reported ready handles", ready);

    static const uint64_t sleeps_ms[] = { 1, 10, 100 };
    for (unsigned i = 0; i < sizeof sleeps_ms / sizeof sleeps_ms[0]; i++) {
        uint64_t want = sleeps_ms[i] * MS;
        solo5_time_t start = solo5_clock_monotonic();
        solo5_yield(start + want, &ready);
        solo5_time_t slept = solo5_clock_monotonic() - start;
        rt_printf("sleep %3lu ms: %8lu us\n", (unsigned long)sleeps_ms[i],
                  (unsigned long)(slept / 1000));
        if (slept < want)
            fail("woke before the deadline (us)", slept / 1000);
        if (slept > want + 1000 * MS)
            fail("woke more than 1 s after the deadline (us)", slept / 1000);
    }

    solo5_time_t wall1 = solo5_clock_wall();
    if (wall1 <= wall0)
        fail("wall clock did not advance (ns)", wall0 - wall1);
    else
        rt_printf("wall clock advanced by %lu us\n",
                  (unsigned long)((wall1 - wall0) / 1000));

    if (failures != 0)
        return SOLO5_EXIT_FAILURE;
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
