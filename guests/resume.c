/*
 * resume: a guest to snapshot at its first wait and restore.
 *
 *   resume.hvt [WORDS [MS]]   default 8192 words (64 KiB) of heap, 1 ms
 *
 * Before its first wait it fills a heap buffer with a pattern and folds it
 * into checksum A; then it waits MS milliseconds (solo5_yield, again after
 * an early return: the first poll hypercall is where
 * --snapshot-at=first-wait takes the snapshot; a SIGUSR2 snapshot may
 * come during the wait).  After
 * the wait it checks that the monotonic clock did not go back (nor jump
 * by a day), that the wall clock did not go back, folds the
 * same buffer again (it must still give A: the memory came back whole),
 * changes every word and folds it into B.  Output, the same with or
 * without a snapshot and restore in the middle:
 *   before: A
 *   after: A B
 *   args: <the command line>
 *   SUCCESS
 */
#include "rt.h"

GUEST_MANIFEST();

#define MS 1000000ULL

static uint64_t fold(const uint64_t *w, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0x100000001b3ULL;
        h ^= h >> 31;
    }
    return h;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    uint64_t words = 8192, ms = 1;
    const char *p = rt_skip_spaces(si->cmdline);
    if (*p != '\0' && (!rt_parse_u64(&p, &words) || words == 0 || words > (1 << 24))) {
        rt_puts("FAILURE: bad arguments (usage: resume [WORDS [MS]])\n");
        return SOLO5_EXIT_FAILURE;
    }
    p = rt_skip_spaces(p);
    if (*p != '\0' && (!rt_parse_u64(&p, &ms) || ms > 3600000 || *rt_skip_spaces(p) != '\0')) {
        rt_puts("FAILURE: bad arguments (usage: resume [WORDS [MS]])\n");
        return SOLO5_EXIT_FAILURE;
    }
    uint64_t *buf = rt_alloc(words * sizeof(uint64_t), 4096);
    if (buf == NULL) {
        rt_puts("FAILURE: cannot allocate the buffer\n");
        return SOLO5_EXIT_FAILURE;
    }
    for (uint64_t i = 0; i < words; i++)
        buf[i] = (i + 1) * 0x9e3779b97f4a7c15ULL;
    uint64_t a = fold(buf, words);
    rt_printf("before: 0x%016llx\n", (unsigned long long)a);

    solo5_time_t wall0 = solo5_clock_wall();
    solo5_time_t t0 = solo5_clock_monotonic();
    solo5_handle_set_t ready;
    solo5_time_t t1 = t0;
    int failures = 0;
    while (t1 < t0 + ms * MS) {
        solo5_yield(t0 + ms * MS, &ready);
        solo5_time_t now = solo5_clock_monotonic();
        if (now < t1) {
            rt_puts("FAILURE: the monotonic clock went back\n");
            failures++;
            break;
        }
        t1 = now;
    }
    /* A day: far more than a snapshot's restore waits in the tests, far
     * less than a TSC that started again from 0 wraps the clock to. */
    if (t1 - t0 > 86400ULL * 1000 * MS) {
        rt_puts("FAILURE: the monotonic clock jumped by more than a day\n");
        failures++;
    }
    solo5_time_t wall1 = solo5_clock_wall();

    if (wall1 < wall0) {
        rt_puts("FAILURE: the wall clock went back\n");
        failures++;
    }
    uint64_t again = fold(buf, words);
    for (uint64_t i = 0; i < words; i++)
        buf[i] ^= i * 0xff51afd7ed558ccdULL;
    uint64_t b = fold(buf, words);
    rt_printf("after: 0x%016llx 0x%016llx\n", (unsigned long long)again,
              (unsigned long long)b);
    rt_printf("args: %s\n", si->cmdline);
    if (again != a) {
        rt_puts("FAILURE: the buffer changed across the wait\n");
        failures++;
    }
    if (failures)
        return SOLO5_EXIT_FAILURE;
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
