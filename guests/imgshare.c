/*
 * imgshare: an image with whole pages of read-only data and of initialised
 * data, for the image-sharing tests (pyvmm maps such pages from the file,
 * copy-on-write).
 *  - sums its 64 KiB table (read-only data: every page becomes resident,
 *    shared with the page cache and every other guest of the file);
 *  - checks its 12 KiB of initialised data, then writes every byte of it
 *    (each page becomes a private copy; the file must not change);
 *  - prints "idle" and waits for ever in solo5_yield (no CPU), or exits
 *    with status 0 when its argument is "exit";
 *  - with the argument "watch", instead: prints "watching", then every
 *    20 ms sums its table and its first page of text again, prints
 *    "tick N" every fifth time, and "CHANGED" (exit status 1) if either
 *    sum differs from the first (the image rewritten under it).
 */
#include "rt.h"

GUEST_MANIFEST();

#define TABLE_BYTES (64 * 1024)
#define DATA_BYTES (12 * 1024)

static const uint8_t table[TABLE_BYTES] = { [0 ... TABLE_BYTES - 1] = 0xa5 };
static uint8_t data[DATA_BYTES] = { [0 ... DATA_BYTES - 1] = 0x5a };
extern const uint8_t _stext[];

static uint64_t sum_of(const uint8_t *p, unsigned n)
{
    uint64_t sum = 0;
    for (unsigned i = 0; i < n; i++)
        sum += ((const volatile uint8_t *)p)[i];
    return sum;
}

static int watch(void)
{
    uint64_t table_sum = sum_of(table, TABLE_BYTES), text_sum = sum_of(_stext, 4096);
    rt_puts("watching\n");
    for (unsigned tick = 1;; tick++) {
        solo5_handle_set_t ready;
        solo5_yield(solo5_clock_monotonic() + 20000000ULL, &ready);
        if (sum_of(table, TABLE_BYTES) != table_sum || sum_of(_stext, 4096) != text_sum) {
            rt_puts("CHANGED\n");
            return SOLO5_EXIT_FAILURE;
        }
        if (tick % 5 == 0)
            rt_printf("tick %u\n", tick / 5);
    }
}

int solo5_app_main(const struct solo5_start_info *si)
{
    uint64_t sum = 0;
    for (unsigned i = 0; i < TABLE_BYTES; i++)
        sum += ((const volatile uint8_t *)table)[i];
    rt_printf("table sum: %lu\n", (unsigned long)sum);

    unsigned wrong = 0;
    for (unsigned i = 0; i < DATA_BYTES; i++) {
        if (((volatile uint8_t *)data)[i] != 0x5a)
            wrong++;
        ((volatile uint8_t *)data)[i] = (uint8_t)i;
    }
    for (unsigned i = 0; i < DATA_BYTES; i++)
        if (((volatile uint8_t *)data)[i] != (uint8_t)i)
            wrong++;
    rt_printf("data: %u wrong bytes, %u written\n", wrong, DATA_BYTES);
    if (wrong)
        return SOLO5_EXIT_FAILURE;

    const char *arg = rt_skip_spaces(si->cmdline);
    if (arg[0] == 'e' && arg[1] == 'x' && arg[2] == 'i' && arg[3] == 't')
        return SOLO5_EXIT_SUCCESS;
    if (arg[0] == 'w' && arg[1] == 'a' && arg[2] == 't' && arg[3] == 'c' && arg[4] == 'h')
        return watch();
    rt_puts("idle\n");
    for (;;) {
        solo5_handle_set_t ready;
        solo5_yield(solo5_clock_monotonic() + 3600ULL * 1000000000ULL, &ready);
    }
}
