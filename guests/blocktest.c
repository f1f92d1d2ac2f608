/*
 * blocktest: block device "storage".
 *  - writes a pattern that depends on the sector number to every sector of
 *    the first min(capacity, 1 MiB), reads it all back and compares;
 *  - a two-block read returns the same two sectors;
 *  - unaligned offsets, partial blocks, ranges past (or wrapping around) the
 *    end, bad handles and a second acquire return SOLO5_R_EINVAL.
 * Argument `strict` adds checks that the *tender* rejects unaligned block
 * I/O itself, sent as raw hypercalls past the runtime's own checks (pyvmm
 * does; the stock solo5-hvt leaves alignment to the guest).
 */
#include "hypercall.h"
#include "rt.h"

GUEST_MANIFEST(MFT_BLOCK("storage"));

#define TEST_SPAN (1024 * 1024)

static int failures;

static const char *result_name(solo5_result_t r)
{
    switch (r) {
    case SOLO5_R_OK: return "OK";
    case SOLO5_R_AGAIN: return "AGAIN";
    case SOLO5_R_EINVAL: return "EINVAL";
    case SOLO5_R_EUNSPEC: return "EUNSPEC";
    }
    return "unknown";
}

static void expect(const char *what, solo5_result_t got, solo5_result_t want)
{
    if (got == want) {
        rt_printf("%-44s %s\n", what, result_name(got));
    } else {
        rt_printf("FAILURE: %s: got %s (%d), want %s\n", what,
                  result_name(got), (int)got, result_name(want));
        failures++;
    }
}

/*
 * The pattern: every word of sector s is sector_word(s), except the first
 * and last, which hold s and ~s, so a transfer that lands at the wrong
 * offset or a wrong sector shows.  Fill and check use rep stos / repe scas:
 * one instruction per sector for hosts that emulate guest instructions.
 */
static uint64_t sector_word(uint64_t s)
{
    return (s * 0x9e3779b97f4a7c15ULL) ^ 0x5a5aa5a5c3c33c3cULL;
}

static void fill(uint64_t *w, uint64_t sector, uint64_t words)
{
    uint64_t *p = w + 1, n = words - 2;
#if defined(__aarch64__)
    for (uint64_t v = sector_word(sector); n > 0; n--)
        *p++ = v;
#else
    __asm__ __volatile__("cld; rep stosq"
                         : "+D"(p), "+c"(n)
                         : "a"(sector_word(sector))
                         : "memory");
#endif
    w[0] = sector;
    w[words - 1] = ~sector;
}

static bool check(const uint64_t *w, uint64_t sector, uint64_t words)
{
    const uint64_t *p = w + 1;
    uint64_t n = words - 2;
    bool differ;
#if defined(__aarch64__)
    differ = false;
    for (uint64_t v = sector_word(sector); n > 0 && !differ; n--)
        differ = *p++ != v;
#else
    __asm__ __volatile__("cld; repe scasq"
                         : "+D"(p), "+c"(n), "=@ccne"(differ)
                         : "a"(sector_word(sector))
                         : "memory");
#endif
    if (w[0] != sector || w[words - 1] != ~sector || differ) {
        uint64_t i = 0;
        while (i < words - 1 && w[i] == (i == 0 ? sector : sector_word(sector)))
            i++;
        uint64_t want = i == 0 ? sector : i == words - 1 ? ~sector
                                                          : sector_word(sector);
        rt_printf("FAILURE: sector %lu word %lu: read %lx, want %lx\n",
                  (unsigned long)sector, (unsigned long)i,
                  (unsigned long)w[i], (unsigned long)want);
        failures++;
        return false;
    }
    return true;
}

/* A read hypercall that skips the runtime's own argument checks. */
static solo5_result_t raw_read(solo5_handle_t h, uint64_t offset, void *buf,
        uint64_t len)
{
    volatile struct hvt_hc_block_read rd = {
        .handle = h, .offset = offset,
        .data = (uint64_t)(uintptr_t)buf, .len = len, .ret = -1,
    };
    hvt_hypercall(HVT_HYPERCALL_BLOCK_READ, &rd);
    return (solo5_result_t)rd.ret;
}

static solo5_result_t raw_write(solo5_handle_t h, uint64_t offset,
        const void *buf, uint64_t len)
{
    volatile struct hvt_hc_block_write wr = {
        .handle = h, .offset = offset,
        .data = (uint64_t)(uintptr_t)buf, .len = len, .ret = -1,
    };
    hvt_hypercall(HVT_HYPERCALL_BLOCK_WRITE, &wr);
    return (solo5_result_t)wr.ret;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    bool strict = strcmp(rt_skip_spaces(si->cmdline), "strict") == 0;
    solo5_handle_t h;
    struct solo5_block_info info;

    if (solo5_block_acquire("storage", &h, &info) != SOLO5_R_OK) {
        rt_puts("FAILURE: cannot acquire block device \"storage\"\n");
        return SOLO5_EXIT_FAILURE;
    }
    uint64_t bs = info.block_size, cap = info.capacity;
    rt_printf("block device storage: handle %lu\n", (unsigned long)h);
    rt_printf("capacity: %lu bytes\n", (unsigned long)cap);
    rt_printf("block size: %lu bytes\n", (unsigned long)bs);
    if (bs < 8 || bs > 65536 || (bs & (bs - 1)) != 0 || cap < bs) {
        rt_puts("FAILURE: unusable block size or capacity\n");
        return SOLO5_EXIT_FAILURE;
    }

    uint64_t *buf = rt_alloc(2 * bs, 64);
    uint8_t *scratch = rt_alloc(2 * bs, 64);
    if (buf == NULL || scratch == NULL) {
        rt_puts("FAILURE: out of heap\n");
        return SOLO5_EXIT_FAILURE;
    }
    uint64_t words = bs / 8;
    uint64_t sectors = (cap < TEST_SPAN ? cap : TEST_SPAN) / bs;

    for (uint64_t s = 0; s < sectors; s++) {
        fill(buf, s, words);
        solo5_result_t r = solo5_block_write(h, s * bs, (uint8_t *)buf, bs);
        if (r != SOLO5_R_OK) {
            rt_printf("FAILURE: write sector %lu: %s\n", (unsigned long)s,
                      result_name(r));
            return SOLO5_EXIT_FAILURE;
        }
    }
    rt_printf("wrote %lu sectors\n", (unsigned long)sectors);

    uint64_t good = 0;
    for (uint64_t s = 0; s < sectors; s++) {
        memset(buf, 0, bs);
        solo5_result_t r = solo5_block_read(h, s * bs, (uint8_t *)buf, bs);
        if (r != SOLO5_R_OK) {
            rt_printf("FAILURE: read sector %lu: %s\n", (unsigned long)s,
                      result_name(r));
            return SOLO5_EXIT_FAILURE;
        }
        if (!check(buf, s, words))
            break;
        good++;
    }
    rt_printf("verified %lu sectors\n", (unsigned long)good);

    if (sectors >= 2) {
        memset(buf, 0, 2 * bs);
        expect("read two blocks at offset 0",
               solo5_block_read(h, 0, (uint8_t *)buf, 2 * bs), SOLO5_R_OK);
        if (check(buf, 0, words) && check(buf + words, 1, words))
            rt_printf("%-44s %s\n", "two-block read contents", "OK");
    }

    /* Bad arguments; none of these may touch the device or the buffer. */
    expect("read at offset 1", solo5_block_read(h, 1, scratch, bs),
           SOLO5_R_EINVAL);
    expect("write at offset block_size/2",
           solo5_block_write(h, bs / 2, scratch, bs), SOLO5_R_EINVAL);
    expect("read of block_size/2 bytes", solo5_block_read(h, 0, scratch, bs / 2),
           SOLO5_R_EINVAL);
    expect("read of block_size+1 bytes",
           solo5_block_read(h, 0, scratch, bs + 1), SOLO5_R_EINVAL);
    expect("read of 0 bytes", solo5_block_read(h, 0, scratch, 0),
           SOLO5_R_EINVAL);
    expect("read at capacity", solo5_block_read(h, cap, scratch, bs),
           SOLO5_R_EINVAL);
    expect("write at capacity", solo5_block_write(h, cap, scratch, bs),
           SOLO5_R_EINVAL);
    expect("read across the end",
           solo5_block_read(h, cap - bs, scratch, 2 * bs), SOLO5_R_EINVAL);
    expect("read at an offset that wraps around",
           solo5_block_read(h, 0 - bs, scratch, bs), SOLO5_R_EINVAL);
    expect("write at an offset that wraps around",
           solo5_block_write(h, 0 - bs, scratch, bs), SOLO5_R_EINVAL);
    expect("read with handle 0 (reserved entry)",
           solo5_block_read(0, 0, scratch, bs), SOLO5_R_EINVAL);
    expect("read with handle 64", solo5_block_read(64, 0, scratch, bs),
           SOLO5_R_EINVAL);
    expect("acquire storage a second time",
           solo5_block_acquire("storage", &h, &info), SOLO5_R_EINVAL);
    expect("acquire an undeclared device",
           solo5_block_acquire("nosuch", &h, &info), SOLO5_R_EINVAL);

    /* The same through raw hypercalls: the tender's own checks. */
    expect("host: read at capacity", raw_read(h, cap, scratch, bs),
           SOLO5_R_EINVAL);
    expect("host: write across the end", raw_write(h, cap - bs, scratch, 2 * bs),
           SOLO5_R_EINVAL);
    expect("host: read at an offset that wraps around",
           raw_read(h, 0 - bs, scratch, bs), SOLO5_R_EINVAL);
    expect("host: read with handle 0", raw_read(0, 0, scratch, bs),
           SOLO5_R_EINVAL);
    expect("host: write with handle 1000", raw_write(1000, 0, scratch, bs),
           SOLO5_R_EINVAL);
    if (strict) {
        expect("host: read at offset 1", raw_read(h, 1, scratch, bs),
               SOLO5_R_EINVAL);
        expect("host: write of block_size/2 bytes",
               raw_write(h, 0, scratch, bs / 2), SOLO5_R_EINVAL);

        /* A read into the very buffer that holds the request: the host
         * writes back ret only (as solo5-hvt), so every other word of the
         * sector arrives, the request's own fields included. */
        struct hvt_hc_block_read *rd = (struct hvt_hc_block_read *)buf;
        rd->handle = h;
        rd->offset = 0;
        rd->data = (uint64_t)(uintptr_t)buf;
        rd->len = bs;
        rd->ret = -1;
        hvt_hypercall(HVT_HYPERCALL_BLOCK_READ, rd);
        expect("host: read over its own request", (solo5_result_t)rd->ret, SOLO5_R_OK);
        if (buf[0] != 0 || buf[1] != sector_word(0) || buf[2] != sector_word(0) ||
                buf[3] != sector_word(0) || buf[words - 1] != ~(uint64_t)0) {
            rt_printf("FAILURE: read over its own request: fields %lx %lx %lx %lx\n",
                      (unsigned long)buf[0], (unsigned long)buf[1],
                      (unsigned long)buf[2], (unsigned long)buf[3]);
            failures++;
        }
    }

    /* The bad requests above must not have changed the data. */
    memset(buf, 0, bs);
    expect("read sector 0 again", solo5_block_read(h, 0, (uint8_t *)buf, bs),
           SOLO5_R_OK);
    check(buf, 0, words);

    if (failures != 0)
        return SOLO5_EXIT_FAILURE;
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
