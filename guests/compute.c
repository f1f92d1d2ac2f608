/*
 * compute: a CPU-bound workload to compare privilege levels (on kvm_pvm,
 * CPL 0 code is emulated and CPL 3 code runs natively).
 *
 *   compute.hvt [KIB [ROUNDS]]      defaults: 512 KiB, 1 round
 *
 * Allocates KIB KiB from the heap, fills it with a pattern derived from the
 * word index, then folds every 64-bit word into a running checksum with a
 * multiply-xorshift mix, ROUNDS times over the buffer.  The checksum depends
 * only on KIB and ROUNDS.  The time of fill + checksum is measured with the
 * monotonic clock.  Output:
 *   cpl: N
 *   checksum: 0x<16 hex digits>
 *   bytes: <KIB * 1024 * ROUNDS>
 *   elapsed_us: <microseconds>
 *   SUCCESS
 * Bad arguments or too little memory: a FAILURE: line and exit status 1.
 */
#include "rt.h"

GUEST_MANIFEST();

/* 512 KiB: about 1.3 s where CPL 0 code is emulated (kvm_pvm), a few ms
 * natively. */
#define DEFAULT_KIB 512
#define DEFAULT_ROUNDS 1

/* Stays well below 2^64 for bytes = KIB * 1024 * ROUNDS. */
#define MAX_KIB (4ULL * 1024 * 1024) /* 4 GiB */
#define MAX_ROUNDS (1ULL << 20)

static void fill(uint64_t *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] = (i + 1) * 0x9e3779b97f4a7c15ULL ^ 0x0123456789abcdefULL;
}

static uint64_t checksum(const uint64_t *w, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
    }
    return h;
}

static int usage(const char *why)
{
    rt_printf("FAILURE: %s (usage: compute [KIB [ROUNDS]], KIB 1-%llu, "
              "ROUNDS 1-%llu)\n", why, MAX_KIB, MAX_ROUNDS);
    return SOLO5_EXIT_FAILURE;
}

/* The next number on the command line into *value; true if there was one.
 * Sets *bad if what follows is not a number. */
static bool next_number(const char **p, uint64_t *value, bool *bad)
{
    *p = rt_skip_spaces(*p);
    if (**p == '\0')
        return false;
    if (!rt_parse_u64(p, value) || (**p != '\0' && **p != ' ' && **p != '\t')) {
        *bad = true;
        return false;
    }
    return true;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    uint64_t kib = DEFAULT_KIB, rounds = DEFAULT_ROUNDS;
    bool bad = false;
    const char *p = si->cmdline;

    if (next_number(&p, &kib, &bad))
        next_number(&p, &rounds, &bad);
    if (bad || *rt_skip_spaces(p) != '\0')
        return usage("bad arguments");
    if (kib < 1 || kib > MAX_KIB || rounds < 1 || rounds > MAX_ROUNDS)
        return usage("argument out of range");

    size_t size = (size_t)kib * 1024;
    size_t words = size / sizeof(uint64_t);
    uint64_t *buf = rt_alloc(size, 4096);
    if (buf == NULL) {
        rt_printf("FAILURE: cannot allocate %llu KiB from the heap\n",
                  (unsigned long long)kib);
        return SOLO5_EXIT_FAILURE;
    }

    solo5_time_t t0 = solo5_clock_monotonic();
    fill(buf, words);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (uint64_t r = 0; r < rounds; r++)
        h = checksum(buf, words, h ^ r);
    solo5_time_t t1 = solo5_clock_monotonic();

    rt_printf("cpl: %d\n", rt_cpl());
    rt_printf("checksum: 0x%016llx\n", (unsigned long long)h);
    rt_printf("bytes: %llu\n", (unsigned long long)(kib * 1024 * rounds));
    rt_printf("elapsed_us: %llu\n", (unsigned long long)((t1 - t0) / 1000));
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
