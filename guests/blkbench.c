/*
 * blkbench: what a block request costs.
 *
 *     blkbench.hvt [N [SIZE]]      default N = 2000, SIZE = 4096
 *
 * Writes N requests of SIZE bytes (a multiple of the block size) at
 * consecutive offsets, wrapping around the disk, then reads them back in the
 * same order and checks the data, timing each phase with the TSC clock.
 * Output:
 *   cpl: N
 *   write_ns: <average ns per block_write>
 *   read_ns: <average ns per block_read>
 *   SUCCESS
 * Bad arguments, a failed request or wrong data: a FAILURE: line, exit 1.
 * Needs block device "storage" of at least SIZE bytes.
 */
#include "rt.h"

GUEST_MANIFEST(MFT_BLOCK("storage"));

#define MAX_SIZE (1024 * 1024)

static uint8_t buf[MAX_SIZE] __attribute__((aligned(4096)));

/* The byte at disk offset `at` after the write phase (request `i`). */
static uint8_t pattern(uint64_t i, uint64_t at)
{
    return (uint8_t)(i * 31 + at * 7 + (at >> 9));
}

int solo5_app_main(const struct solo5_start_info *si)
{
    uint64_t n = 2000, size = 4096, i, j, slots, off;
    const char *p = rt_skip_spaces(si->cmdline);
    struct solo5_block_info info;
    solo5_handle_t h;

    if (*p != '\0' && (!rt_parse_u64(&p, &n) || n == 0)) {
        rt_puts("FAILURE: usage: blkbench [N [SIZE]]\n");
        return SOLO5_EXIT_FAILURE;
    }
    p = rt_skip_spaces(p);
    if (*p != '\0' && (!rt_parse_u64(&p, &size) || size == 0 || size > MAX_SIZE)) {
        rt_puts("FAILURE: SIZE must be 1..1048576\n");
        return SOLO5_EXIT_FAILURE;
    }
    if (solo5_block_acquire("storage", &h, &info) != SOLO5_R_OK) {
        rt_puts("FAILURE: no block device storage\n");
        return SOLO5_EXIT_FAILURE;
    }
    if (size % info.block_size || size > info.capacity) {
        rt_printf("FAILURE: SIZE must be a multiple of %lu and at most %lu\n",
                  (unsigned long)info.block_size, (unsigned long)info.capacity);
        return SOLO5_EXIT_FAILURE;
    }
    slots = info.capacity / size;
    rt_printf("cpl: %d\n", rt_cpl());

    solo5_time_t t0 = solo5_clock_monotonic();
    for (i = 0; i < n; i++) {
        off = (i % slots) * size;
        for (j = 0; j < size; j++)
            buf[j] = pattern(i, off + j);
        if (solo5_block_write(h, off, buf, size) != SOLO5_R_OK) {
            rt_puts("FAILURE: block_write failed\n");
            return SOLO5_EXIT_FAILURE;
        }
    }
    solo5_time_t t1 = solo5_clock_monotonic();
    for (i = 0; i < n; i++) {
        /* The last write to each slot is the one to find there. */
        uint64_t last = i % slots + ((n - 1 - i % slots) / slots) * slots;
        off = (i % slots) * size;
        if (solo5_block_read(h, off, buf, size) != SOLO5_R_OK) {
            rt_puts("FAILURE: block_read failed\n");
            return SOLO5_EXIT_FAILURE;
        }
        if (buf[0] != pattern(last, off) || buf[size - 1] != pattern(last, off + size - 1)) {
            rt_printf("FAILURE: wrong data at offset %lu\n", (unsigned long)off);
            return SOLO5_EXIT_FAILURE;
        }
    }
    solo5_time_t t2 = solo5_clock_monotonic();
    rt_printf("write_ns: %lu\n", (unsigned long)((t1 - t0) / n));
    rt_printf("read_ns: %lu\n", (unsigned long)((t2 - t1) / n));
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
