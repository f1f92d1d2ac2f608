/*
 * shmstream net back end: frames through pyvmm's shared-memory rings
 * (../csrc/shmstream.h), no VM exit per frame.
 *
 * The ring protocol is not re-implemented here: every index, barrier and
 * sleep-flag operation is a call into ../csrc/shmstream_ring.h, the same
 * code the host's IO thread runs.  This file only adds what is the guest's
 * own business: finding and validating the region, the private indices
 * (RX cons, TX prod), copying frames, kicks, counters, and the solo5_yield
 * hooks (rt_yield_ops).
 *
 * Per device:
 *   RX (host produces, we consume): read = if shm_cons_avail() > 0, copy the
 *     slot out, cons++, shm_cons_release().  No exit; SOLO5_R_AGAIN if empty.
 *     pyvmm_net_read_zc lends the slot instead of copying it; cons moves on
 *     (and the host gets the slot back) at pyvmm_net_read_done.
 *   TX (we produce, host consumes): queue = copy into the slot at prod,
 *     prod++, shm_prod_publish(); flush = if frames were published since the
 *     last flush and shm_prod_needs_notify() (the IO thread announced it
 *     sleeps): one outl to SHM_KICK_PIO, which KVM turns into an eventfd
 *     signal (ioeventfd) without leaving the kernel.
 *   solo5_net_write = queue + flush; with the ring full it flushes and waits
 *     (bounded) for the host to free a slot.  solo5_exit waits (bounded) for
 *     the host to take every queued frame, so that frames written just
 *     before exiting are sent, as they are on the synchronous hypercall path.
 *   solo5_yield (yield.c) asks shm_ready() before any exit and announces
 *     sleep on the RX rings (shm_cons_prepare_sleep) around the poll
 *     hypercall.
 *
 * Trust: the host is the more privileged side, but a broken region must not
 * make the guest scribble over its own memory, so the region is validated
 * once, before first use (magic, version, counts, every ring inside the
 * region, above mem_size, not overlapping another ring, slots a power of two
 * and the same in every ring header); if anything is off the device keeps
 * the hypercall back end.  At run time the host's index goes through
 * shm_cons_avail / shm_prod_space (impossible distances are SHM_BAD, an
 * error), and each RX length is read once and checked before the copy.
 */
#include "hypercall.h"
#include "pyvmm_abi.h"
#include "rt_internal.h"
#include "shmstream_ring.h"

/* How long solo5_net_write waits for TX space before SOLO5_R_AGAIN. */
#define TX_WAIT_NS (100ULL * 1000 * 1000)
/* How long pyvmm_net_tx_wait waits for the host to empty the TX ring. */
#define TX_DRAIN_NS (1000ULL * 1000 * 1000)
/* The largest ring this driver accepts (the host's default is 256). */
#define MAX_SLOTS 65536u
/* The identity map covers at most 4 GiB of guest memory. */
#define GUEST_MEM_LIMIT (1ULL << 32)

struct shm_dev {
    struct shm_ring *rx;     /* NULL: not a shmstream device */
    struct shm_ring *tx;
    uint32_t slots;
    uint32_t rx_cons;        /* ours: next RX slot to consume */
    uint32_t rx_known;       /* frames past rx_cons the host published, as
                              * last read: re-read only once they are used */
    uint32_t tx_prod;        /* ours: next TX slot to fill */
    uint32_t tx_unflushed;   /* frames published since the last flush */
    int rx_lent;             /* the slot at rx_cons is lent (read_zc) */
    int tx_full;             /* the last queue found the ring full */
    struct pyvmm_net_stats st;
};

static struct shm_dev devs[MFT_MAX_ENTRIES];

/* The validated region: a private copy of its header, read exactly once. */
static enum { REGION_UNKNOWN, REGION_OK, REGION_NONE } region_state;
static struct shm_region region;

static struct rt_yield_ops yield_ops;

static void rejected(const char *why)
{
    rt_printf("pyvmm-rt: shmstream region rejected (%s): using hypercalls\n",
              why);
}

static inline void kick(void)
{
#if defined(__aarch64__)
    rt_mmio_kick(SHM_KICK_MMIO, 0);
#else
    __asm__ __volatile__("outl %0, %1"
                         :
                         : "a"((uint32_t)0), "d"((uint16_t)SHM_KICK_PIO)
                         : "memory");
#endif
}

static inline void cpu_relax(void)
{
#if defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("pause" ::: "memory");
#endif
}

/* Bytes of one ring (header and slots) with (slots) slots. */
static uint64_t ring_bytes(uint32_t slots)
{
    return sizeof(struct shm_ring) + (uint64_t)slots * sizeof(struct shm_slot);
}

/* Check one ring's place and its read-only info line. */
static const char *check_ring(uint64_t gpa, uint64_t base, uint64_t end,
        uint32_t slots)
{
    if (gpa % SHM_CACHE_LINE != 0)
        return "ring not cache-line aligned";
    if (gpa < base + SHM_REGION_HEADER_SIZE || gpa > end ||
            ring_bytes(slots) > end - gpa)
        return "ring outside the region";
    const volatile struct shm_ring *r =
        (const volatile struct shm_ring *)(uintptr_t)gpa;
    if (r->slots != slots || r->slot_size != SHM_SLOT_SIZE)
        return "ring header disagrees with the region header";
    return NULL;
}

static bool overlap(uint64_t a, uint64_t b, uint64_t len)
{
    return a < b + len && b < a + len;
}

/* Validate everything about the region before the first use; NULL if good. */
static const char *check_region(const struct pyvmm_boot_ext *ext)
{
    const struct hvt_boot_info *bi = rt_boot_info();
    const struct mft *m = rt_manifest();
    uint64_t base = ext->shm_region, size = ext->shm_size;

    if (ext->version != PYVMM_BOOT_EXT_VERSION)
        return "boot extension version is not 1";
    if (base % 4096 != 0 || size < SHM_REGION_HEADER_SIZE ||
            size > GUEST_MEM_LIMIT || base > GUEST_MEM_LIMIT - size)
        return "bad region address or size";
    if (base < bi->mem_size)
        return "region overlaps usable memory";

    memcpy(&region, (const void *)(uintptr_t)base, sizeof(region));
    if (region.magic != SHM_MAGIC)
        return "bad magic";
    if (region.version != SHM_VERSION)
        return "unknown version";
    if (region.ndevices < 1 || region.ndevices > SHM_MAX_DEVICES)
        return "bad device count";
    if (region.slots < 1 || region.slots > MAX_SLOTS ||
            (region.slots & (region.slots - 1)) != 0)
        return "slots is not a power of two";
    if (region.size != size)
        return "region size differs from the boot extension";

    uint64_t end = base + size, len = ring_bytes(region.slots);
    for (uint32_t i = 0; i < region.ndevices; i++) {
        const struct shm_device *d = &region.dev[i];
        const char *why;
        if (d->handle == 0 || d->handle >= m->entries ||
                m->e[d->handle].type != MFT_DEV_NET_BASIC)
            return "device handle is not a net device";
        if ((why = check_ring(d->rx, base, end, region.slots)) != NULL ||
                (why = check_ring(d->tx, base, end, region.slots)) != NULL)
            return why;
        if (overlap(d->rx, d->tx, len))
            return "rings overlap";
        for (uint32_t j = 0; j < i; j++) {
            const struct shm_device *o = &region.dev[j];
            if (o->handle == d->handle)
                return "device listed twice";
            if (overlap(d->rx, o->rx, len) || overlap(d->rx, o->tx, len) ||
                    overlap(d->tx, o->rx, len) || overlap(d->tx, o->tx, len))
                return "rings overlap";
        }
    }
    return NULL;
}

static bool region_ok(void)
{
    if (region_state != REGION_UNKNOWN)
        return region_state == REGION_OK;
    region_state = REGION_NONE;

    const struct hvt_boot_info *bi = rt_boot_info();
    if (!(bi->host_features & PYVMM_FEATURE_BOOT_EXT))
        return false;     /* stock solo5-hvt */
    struct pyvmm_boot_ext ext;
    memcpy(&ext, (const void *)(uintptr_t)PYVMM_BOOT_EXT_GPA, sizeof(ext));
    if (ext.magic != PYVMM_BOOT_EXT_MAGIC) {
        rejected("bad boot extension magic");
        return false;
    }
    if (ext.shm_region == 0)
        return false;     /* pyvmm --shm=off */
    const char *why = check_region(&ext);
    if (why != NULL) {
        rejected(why);
        return false;
    }
    region_state = REGION_OK;
    return true;
}

/* ---- the yield hooks ---------------------------------------------------- */

static solo5_handle_set_t shm_ready(void)
{
    solo5_handle_set_t ready = 0, left = yield_ops.served;
    while (left != 0) {
        solo5_handle_t h = (solo5_handle_t)__builtin_ctzll(left);
        struct shm_dev *d = &devs[h];
        left &= left - 1;
        /* SHM_BAD counts as ready too: the read reports the error.  A
         * lent slot (read_zc) is not news. */
        if (shm_cons_avail(d->rx, d->rx_cons, d->slots) > (uint32_t)d->rx_lent)
            ready |= 1ULL << h;
    }
    return ready;
}

static void shm_awake(void)
{
    solo5_handle_set_t left = yield_ops.served;
    while (left != 0) {
        shm_cons_awake(devs[__builtin_ctzll(left)].rx);
        left &= left - 1;
    }
}

static int shm_prepare_sleep(void)
{
    solo5_handle_set_t left = yield_ops.served;
    while (left != 0) {
        struct shm_dev *d = &devs[__builtin_ctzll(left)];
        left &= left - 1;
        if (!shm_cons_prepare_sleep(d->rx, d->rx_cons, d->slots)) {
            shm_awake();
            return 0;
        }
    }
    return 1;
}

/* ---- the driver ---------------------------------------------------------- */

/* The slot is the host's again. */
static void shm_consume(struct shm_dev *d)
{
    d->rx_cons++;
    d->rx_known--;
    shm_cons_release(d->rx, d->rx_cons);
}

/* The next slot holding a frame of at most `size` bytes, left in place for
 * the caller to consume; bad ones on the way are skipped and counted.
 * The host's index is read (and checked) once per run of frames, not per
 * frame: its cache line is the one the host writes while it produces, and
 * slots it published stay published. */
static solo5_result_t shm_next_frame(struct shm_dev *d, size_t size,
        struct shm_slot **slot, uint32_t *len)
{
    for (;;) {
        if (d->rx_known == 0) {
            uint32_t avail = shm_cons_avail(d->rx, d->rx_cons, d->slots);
            if (avail == 0)
                return SOLO5_R_AGAIN;
            if (avail == SHM_BAD) {
                d->st.bad_index++;
                return SOLO5_R_EUNSPEC;
            }
            d->rx_known = avail;
        }
        struct shm_slot *s = shm_slot_at(d->rx, d->rx_cons, d->slots);
        /* Read the length once; the host could change it under us. */
        uint32_t n = __atomic_load_n(&s->len, __ATOMIC_RELAXED);
        if (n != 0 && n <= SHM_SLOT_DATA && n <= size) {
            d->st.rx_frames++;
            *slot = s;
            *len = n;
            return SOLO5_R_OK;
        }
        shm_consume(d);
        d->st.rx_dropped++;   /* a bad slot: skip it, look at the next */
    }
}

/* pyvmm_net_read_done: give the lent slot back to the host. */
static void shm_read_done(solo5_handle_t h)
{
    struct shm_dev *d = &devs[h];

    if (!d->rx_lent)
        return;
    d->rx_lent = 0;
    shm_consume(d);
}

/* pyvmm_net_read_zc: lend the next good slot (until shm_read_done). */
static solo5_result_t shm_read_zc(solo5_handle_t h, uint8_t **frame,
        size_t *len)
{
    struct shm_dev *d = &devs[h];
    struct shm_slot *s;
    uint32_t n;

    shm_read_done(h);
    solo5_result_t r = shm_next_frame(d, SHM_SLOT_DATA, &s, &n);
    if (r == SOLO5_R_OK) {
        d->rx_lent = 1;
        *frame = s->data;
        *len = n;
    }
    return r;
}

/* solo5_net_read: copy the next good frame that fits `size`. */
static solo5_result_t shm_read(solo5_handle_t h, uint8_t *buf, size_t size,
        size_t *read_size)
{
    struct shm_dev *d = &devs[h];
    struct shm_slot *s;
    uint32_t n;

    shm_read_done(h);
    solo5_result_t r = shm_next_frame(d, size, &s, &n);
    if (r == SOLO5_R_OK) {
        memcpy(buf, s->data, n);   /* before the slot is the host's again */
        shm_consume(d);
        *read_size = n;
    }
    return r;
}

static solo5_result_t shm_queue(solo5_handle_t h, const uint8_t *buf,
        size_t size)
{
    struct shm_dev *d = &devs[h];
    uint32_t space = shm_prod_space(d->tx, d->tx_prod, d->slots);

    if (space == SHM_BAD) {
        d->st.bad_index++;
        return SOLO5_R_EUNSPEC;
    }
    if (space == 0) {
        if (!d->tx_full)
            d->st.tx_ring_full++;
        d->tx_full = 1;
        return SOLO5_R_AGAIN;
    }
    d->tx_full = 0;
    struct shm_slot *s = shm_slot_at(d->tx, d->tx_prod, d->slots);
    memcpy(s->data, buf, size);
    __atomic_store_n(&s->len, (uint32_t)size, __ATOMIC_RELAXED);
    d->tx_prod++;
    shm_prod_publish(d->tx, d->tx_prod);   /* release: data and len first */
    d->tx_unflushed++;
    d->st.tx_frames++;
    return SOLO5_R_OK;
}

static void shm_flush(solo5_handle_t h)
{
    struct shm_dev *d = &devs[h];

    /* Nothing new since the last flush: that one already woke the host or
     * found it awake, and an awake host looks at the ring before sleeping. */
    if (d->tx_unflushed == 0)
        return;
    d->tx_unflushed = 0;
    if (shm_prod_needs_notify(d->tx)) {
        kick();
        d->st.kicks++;
    } else {
        d->st.kicks_suppressed++;
    }
}

/*
 * Waiting for the host to take TX slots: poll the ring for up to
 * WAIT_SPIN_NS (the IO thread, running on another CPU, drains a ring in
 * microseconds), then alternate with a poll hypercall of WAIT_SLEEP_NS: if
 * the IO thread shares this CPU (no --pin), spinning would keep it off the
 * CPU for a whole scheduler time slice, while a blocked vCPU thread lets it
 * run.  (The hypercall returns at once when RX frames are waiting; then it
 * is just a slower spin.)  True once (done) holds, false after (limit) ns.
 */
#define WAIT_SPIN_NS (20ULL * 1000)
#define WAIT_SLEEP_NS (50ULL * 1000)

static bool tx_wait_until(struct shm_dev *d, bool (*done)(struct shm_dev *),
        solo5_time_t limit)
{
    solo5_time_t start = solo5_clock_monotonic();

    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (done(d))
                return true;
            cpu_relax();
        }
        solo5_time_t waited = solo5_clock_monotonic() - start;
        if (waited > limit)
            return done(d);
        if (waited > WAIT_SPIN_NS) {
            volatile struct hvt_hc_poll p = {
                .timeout_nsecs = WAIT_SLEEP_NS,
                .ready_set = 0,
                .ret = 0,
            };
            hvt_hypercall(HVT_HYPERCALL_POLL, &p);
        }
    }
}

/* A free TX slot, or a broken index (which the caller then reports). */
static bool tx_has_space(struct shm_dev *d)
{
    return shm_prod_space(d->tx, d->tx_prod, d->slots) != 0;
}

/* The host took every TX slot (or the index is broken). */
static bool tx_empty(struct shm_dev *d)
{
    uint32_t space = shm_prod_space(d->tx, d->tx_prod, d->slots);
    return space == d->slots || space == SHM_BAD;
}

/* solo5_net_write: queue and flush; with the ring full, flush and wait up
 * to TX_WAIT_NS for a free slot, then give up with SOLO5_R_AGAIN. */
static solo5_result_t shm_write(solo5_handle_t h, const uint8_t *buf,
        size_t size)
{
    struct shm_dev *d = &devs[h];
    solo5_result_t r;

    if (size == 0)
        return SOLO5_R_EINVAL;
    r = shm_queue(h, buf, size);
    if (r == SOLO5_R_AGAIN) {
        shm_flush(h);
        if (!tx_wait_until(d, tx_has_space, TX_WAIT_NS))
            return SOLO5_R_AGAIN;
        r = shm_queue(h, buf, size);
    }
    if (r == SOLO5_R_OK)
        shm_flush(h);
    return r;
}

/* pyvmm_net_tx_wait: flush, then wait for the host to take every slot. */
static solo5_result_t shm_tx_wait(solo5_handle_t h)
{
    struct shm_dev *d = &devs[h];

    shm_flush(h);
    bool empty = tx_wait_until(d, tx_empty, TX_DRAIN_NS);
    if (shm_prod_space(d->tx, d->tx_prod, d->slots) == SHM_BAD) {
        d->st.bad_index++;
        return SOLO5_R_EUNSPEC;
    }
    return empty ? SOLO5_R_OK : SOLO5_R_AGAIN;
}

static void shm_stats(solo5_handle_t h, struct pyvmm_net_stats *out)
{
    *out = devs[h].st;
}

/* solo5_exit: frames still in a TX ring when the guest halts would never be
 * sent (the hypercall path sends synchronously), so wait for the host to
 * take them, as pyvmm_net_tx_wait does, up to TX_DRAIN_NS per device. */
static void shm_exit(void)
{
    solo5_handle_set_t left = yield_ops.served;
    while (left != 0) {
        (void)shm_tx_wait((solo5_handle_t)__builtin_ctzll(left));
        left &= left - 1;
    }
}

const struct rt_net_driver rt_net_shm_driver = {
    .name = "shmstream",
    .shm = 1,
    .write = shm_write,
    .read = shm_read,
    .read_zc = shm_read_zc,
    .read_done = shm_read_done,
    .queue = shm_queue,
    .flush = shm_flush,
    .tx_wait = shm_tx_wait,
    .stats = shm_stats,
};

const struct rt_net_driver *rt_net_shm_probe(solo5_handle_t h,
        const struct mft_entry *e)
{
    const struct shm_device *found = NULL;

    if (h >= MFT_MAX_ENTRIES)
        return NULL;
    if (region_ok()) {
        for (uint32_t i = 0; i < region.ndevices; i++)
            if (region.dev[i].handle == h)
                found = &region.dev[i];
    }
    /* A frame of this device must fit in a slot (pyvmm leaves out of the
     * region a device whose frames do not: this guards against a broken host). */
    if (found != NULL &&
            (uint64_t)e->u.net_basic.mtu + SOLO5_NET_HLEN > SHM_SLOT_DATA) {
        rt_printf("pyvmm-rt: net device %lu: MTU too large for shmstream "
                  "slots: using hypercalls\n", (unsigned long)h);
        found = NULL;
    }
    if (found == NULL) {
        yield_ops.others |= 1ULL << h;
        return NULL;
    }

    struct shm_dev *d = &devs[h];
    d->rx = (struct shm_ring *)(uintptr_t)found->rx;
    d->tx = (struct shm_ring *)(uintptr_t)found->tx;
    d->slots = region.slots;
    /* Start from the indices the rings hold (0 at boot), like the host. */
    d->rx_cons = shm_load_acquire(&d->rx->cons);
    d->tx_prod = shm_load_acquire(&d->tx->prod);
    shm_cons_awake(d->rx);

    yield_ops.ready = shm_ready;
    yield_ops.prepare_sleep = shm_prepare_sleep;
    yield_ops.awake = shm_awake;
    yield_ops.served |= 1ULL << h;
    rt_yield_set_ops(&yield_ops);
    rt_set_exit_hook(shm_exit);
    return &rt_net_shm_driver;
}
