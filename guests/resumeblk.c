/*
 * resumeblk: a block device across a snapshot at the first wait.
 *
 * Writes block 0 of "storage" with a pattern, waits 1 ms (solo5_yield:
 * where --snapshot-at=first-wait takes the snapshot), then reads block 0
 * back (it must hold the pattern: the same disk, attached anew), writes
 * block 1 and reads it back.  Output, the same with or without a snapshot
 * and restore in the middle:
 *   storage: CAPACITY bytes, blocks of BLOCK_SIZE
 *   block 0 written
 *   blocks 0 and 1: <checksum>
 *   SUCCESS
 */
#include "rt.h"

GUEST_MANIFEST(MFT_BLOCK("storage"));

#define MS 1000000ULL
#define MAX_BLOCK 4096

static uint8_t buf[MAX_BLOCK];

static void pattern(uint8_t *b, uint64_t n, uint64_t block)
{
    for (uint64_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * 7 + block * 131 + 1);
}

static uint64_t fold(const uint8_t *b, uint64_t n, uint64_t h)
{
    for (uint64_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static int fail(const char *what)
{
    rt_printf("FAILURE: %s\n", what);
    return SOLO5_EXIT_FAILURE;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    solo5_handle_t h;
    struct solo5_block_info info;
    if (solo5_block_acquire("storage", &h, &info) != SOLO5_R_OK)
        return fail("cannot acquire block device \"storage\"");
    uint64_t bs = info.block_size;
    if (bs > MAX_BLOCK || info.capacity < 2 * bs)
        return fail("the disk is too small or its blocks too large");
    rt_printf("storage: %lu bytes, blocks of %lu\n", (unsigned long)info.capacity,
              (unsigned long)bs);

    pattern(buf, bs, 0);
    if (solo5_block_write(h, 0, buf, bs) != SOLO5_R_OK)
        return fail("write of block 0");
    rt_puts("block 0 written\n");

    solo5_handle_set_t ready;
    solo5_yield(solo5_clock_monotonic() + MS, &ready);

    uint64_t sum = 0xcbf29ce484222325ULL;
    if (solo5_block_read(h, 0, buf, bs) != SOLO5_R_OK)
        return fail("read of block 0");
    sum = fold(buf, bs, sum);
    static uint8_t want[MAX_BLOCK];
    pattern(want, bs, 0);
    for (uint64_t i = 0; i < bs; i++)
        if (buf[i] != want[i])
            return fail("block 0 does not hold what was written before the wait");
    pattern(buf, bs, 1);
    if (solo5_block_write(h, bs, buf, bs) != SOLO5_R_OK)
        return fail("write of block 1");
    if (solo5_block_read(h, bs, buf, bs) != SOLO5_R_OK)
        return fail("read of block 1");
    sum = fold(buf, bs, sum);
    rt_printf("blocks 0 and 1: 0x%016llx\n", (unsigned long long)sum);
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
