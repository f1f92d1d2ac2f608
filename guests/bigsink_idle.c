/*
 * bigsink_idle: bigsink's 4 MiB of read-only data without its net device,
 * a template to snapshot (a guest with net devices is not snapshotted)
 * for bench/snapshot.py and tests/test_snapshot_serve.py.
 *
 *   bigsink_idle.hvt [KIB [WAIT_MS [HOLD_MS]]]   defaults 256 KiB, 1 ms, 0
 *
 * At boot it reads one byte of each page of the table and writes KIB KiB
 * of heap (its initialisation, done before the first wait, where
 * --snapshot-at=first-wait takes a template), then waits until WAIT_MS
 * after that wait began. After it, it writes every heap page again (each
 * clone's own copies), waits HOLD_MS more from then (so a test can read
 * its memory while it holds them) and ends. Output:
 *   table: 1024 pages read
 *   heap: KIB KiB written
 *   rewritten: KIB KiB
 *   SUCCESS
 */
#include "rt.h"

GUEST_MANIFEST();

#define TABLE_BYTES (4 * 1024 * 1024)
#define PAGE 4096
#define MS 1000000ULL

static const uint8_t table[TABLE_BYTES] = { [0 ... TABLE_BYTES - 1] = 0x3c };

static void wait_until(solo5_time_t deadline)
{
    solo5_handle_set_t ready;
    while (solo5_clock_monotonic() < deadline)
        solo5_yield(deadline, &ready);
}

static bool number(const char **p, uint64_t *value, uint64_t max)
{
    *p = rt_skip_spaces(*p);
    if (**p == '\0')
        return true;
    return rt_parse_u64(p, value) && *value <= max;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    uint64_t kib = 256, wait_ms = 1, hold_ms = 0;
    const char *p = si->cmdline;
    if (!number(&p, &kib, 1 << 20) || !number(&p, &wait_ms, 86400000) ||
        !number(&p, &hold_ms, 86400000) || *rt_skip_spaces(p) != '\0' || kib == 0) {
        rt_puts("FAILURE: bad arguments (usage: bigsink_idle [KIB [WAIT_MS [HOLD_MS]]])\n");
        return SOLO5_EXIT_FAILURE;
    }
    unsigned pages = 0;
    for (unsigned i = 0; i < TABLE_BYTES; i += PAGE)
        pages += ((const volatile uint8_t *)table)[i] == 0x3c;
    rt_printf("table: %u pages read\n", pages);
    size_t size = (size_t)kib * 1024;
    uint8_t *heap = rt_alloc(size, PAGE);
    if (heap == NULL) {
        rt_puts("FAILURE: cannot allocate the heap\n");
        return SOLO5_EXIT_FAILURE;
    }
    for (size_t i = 0; i < size; i += PAGE)
        heap[i] = 1;
    rt_printf("heap: %llu KiB written\n", (unsigned long long)kib);

    wait_until(solo5_clock_monotonic() + wait_ms * MS);
    for (size_t i = 0; i < size; i += PAGE)
        heap[i]++;
    rt_printf("rewritten: %llu KiB\n", (unsigned long long)kib);
    wait_until(solo5_clock_monotonic() + hold_ms * MS);
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
