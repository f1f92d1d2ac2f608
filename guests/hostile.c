/*
 * hostile: a guest that attacks the host through its own network rings.
 *
 *     hostile.hvt [ROUNDS]          (default 20000)
 *
 * With a shmstream region it scribbles pseudo-random values over every
 * field it can write: RX cons and sleep flag, TX prod and sleep flag, TX
 * slot lengths, the rings' info lines and the region header, kicking the
 * host and sleeping in the poll hypercall now and then.  With Solo5's ring
 * (hostile_s5.hvt, whose capability note does not ask for shmstream) it
 * submits garbage entries: unknown operations, handles past the manifest,
 * addresses outside guest memory or in read-only pages, huge lengths, and
 * impossible ent_tail / com_head values.
 *
 * The host must survive all of it, count it, and let the guest exit
 * normally: the guest prints what it did, then SUCCESS, exit 0.
 */
#include "netproto.h"
#include "pyvmm_abi.h"
#include "shmstream.h"
#include "solo5_ring.h"

GUEST_MANIFEST(MFT_NET("service0"));

static uint64_t rng = 0x9e3779b97f4a7c15ULL;

static uint64_t next(void)
{
    /* xorshift64*: any sequence will do, as long as it is all over the place. */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dULL;
}

/* Mostly small and edge values, sometimes anything. */
static uint32_t nasty32(void)
{
    static const uint32_t edges[] = { 0, 1, 2, 255, 256, 2040, 2041, 4096,
                                      0x7fffffff, 0x80000000, 0xfffffffe,
                                      0xffffffff };
    uint64_t r = next();
    if (r & 1)
        return edges[(r >> 1) % (sizeof(edges) / sizeof(edges[0]))];
    return (uint32_t)(r >> 32);
}

static void outl(uint16_t port, uint32_t value)
{
    __asm__ __volatile__("outl %0, %1" : : "a"(value), "Nd"(port) : "memory");
}

static void nap(void)
{
    solo5_handle_set_t ready;
    solo5_yield(solo5_clock_monotonic() + 100000, &ready);
}

static void attack_shm(const struct shm_region *region, uint64_t rounds)
{
    struct shm_ring *rx = (struct shm_ring *)(uintptr_t)region->dev[0].rx;
    struct shm_ring *tx = (struct shm_ring *)(uintptr_t)region->dev[0].tx;
    uint32_t slots = region->slots;
    uint64_t i;

    rt_printf("attacking shmstream rings (%u slots)\n", (unsigned)slots);
    for (i = 0; i < rounds; i++) {
        switch (next() % 8) {
        case 0: rx->cons = nasty32(); break;
        case 1: rx->cons_sleeping = nasty32(); break;
        case 2: tx->prod = nasty32(); break;
        case 3: tx->cons_sleeping = nasty32(); break;
        case 4: tx->slot[next() % slots].len = nasty32(); break;
        case 5: rx->slots = nasty32(); tx->slot_size = nasty32(); break;
        case 6: ((struct shm_region *)region)->slots = nasty32(); break;
        default: outl(SHM_KICK_PIO, nasty32()); break;
        }
        if (i % 512 == 0)
            nap();
    }
}

static void attack_solo5_ring(struct solo5_ring *ring, uint64_t rounds)
{
    const struct hvt_boot_info *bi = rt_boot_info();
    uint64_t i;

    rt_puts("attacking the Solo5 ring\n");
    for (i = 0; i < rounds; i++) {
        /* Mostly a plausible tail just past the host's head, so the host
         * really reads the garbage entries; sometimes an impossible one. */
        uint32_t head = __atomic_load_n(&ring->ent_head, __ATOMIC_ACQUIRE);
        uint32_t n = 1 + (uint32_t)(next() % 4), k;
        for (k = 0; k < n; k++) {
            struct solo5_ring_entry *e = &ring->ent[(head + k) % SOLO5_RING_ENTRIES];
            e->operation = nasty32() % 4;
            e->handle = next() % 2 ? 1 : nasty32() % 70;
            e->len = next() % 2 ? (uint32_t)(next() % 2048) : nasty32();
            switch (next() % 4) {
            case 0: e->data = next(); break;                          /* anywhere */
            case 1: {
                /* Across the end of memory.  Never inside it: the top of
                 * memory is this guest's own stack, and a frame read there
                 * (which the host rightly performs) would wreck us, not it. */
                uint32_t off = 1 + (uint32_t)(next() % 4096);
                e->data = bi->mem_size - off;
                if (e->len <= off)
                    e->len = off + 1 + (uint32_t)(next() % 2048);
                break;
            }
            case 2: e->data = 0x100000; break;                        /* our text */
            default: e->data = 0x10000; break;                        /* boot info */
            }
            e->id = (uint32_t)i;
        }
        if (next() % 16 == 0)
            ring->com_head = nasty32();
        else
            ring->com_head = __atomic_load_n(&ring->com_tail, __ATOMIC_ACQUIRE);
        __atomic_store_n(&ring->ent_tail, next() % 8 == 0 ? nasty32() : head + n,
                         __ATOMIC_RELEASE);
        outl(HVT_RING_KICK_PIO, 0);
        if (i % 512 == 0)
            nap();
    }
}

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *p = rt_skip_spaces(si->cmdline);
    uint64_t rounds = 20000;
    const struct hvt_boot_info *bi = rt_boot_info();

    if (*p != '\0' && !rt_parse_u64(&p, &rounds)) {
        rt_puts("FAILURE: usage: hostile.hvt [ROUNDS]\n");
        return SOLO5_EXIT_FAILURE;
    }
    rt_puts("ready\n");
    if (bi->host_features & PYVMM_FEATURE_BOOT_EXT) {
        const struct pyvmm_boot_ext *ext =
            (const struct pyvmm_boot_ext *)(uintptr_t)PYVMM_BOOT_EXT_GPA;
        const struct shm_region *region = (const struct shm_region *)(uintptr_t)ext->shm_region;
        if (ext->shm_region == 0 || region->magic != SHM_MAGIC || region->ndevices < 1) {
            rt_puts("FAILURE: no usable shmstream region\n");
            return SOLO5_EXIT_FAILURE;
        }
        attack_shm(region, rounds);
    } else if (bi->host_features & HVT_FEATURE_RING_IO) {
        attack_solo5_ring((struct solo5_ring *)(uintptr_t)bi->net_ring, rounds);
    } else {
        rt_puts("FAILURE: no ring to attack\n");
        return SOLO5_EXIT_FAILURE;
    }
    rt_printf("survived %lu rounds\n", (unsigned long)rounds);
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;
}
