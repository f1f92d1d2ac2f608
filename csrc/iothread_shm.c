/* The IO thread's shmstream links: tap <-> RX/TX rings (iothread_internal.h,
 * shmstream.h, docs/modes.md). */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "iothread_internal.h"
#include "shmstream_ring.h"
#include "static_check.h"
#include "tap_io.h"

/* shmstream.h sizes its arrays and pads with literals, for cffi. */
PYVMM_ARRAY_LEN_IS(struct shm_slot, data, SHM_SLOT_DATA);
_Static_assert(sizeof(struct shm_slot) == SHM_SLOT_SIZE &&
               offsetof(struct shm_slot, data) == SHM_SLOT_HEADER, "shm_slot layout");
_Static_assert(offsetof(struct shm_ring, cons) == SHM_CACHE_LINE &&
               offsetof(struct shm_ring, slots) == 2 * SHM_CACHE_LINE &&
               offsetof(struct shm_ring, slot) == 3 * SHM_CACHE_LINE,
               "shm_ring: one cache line per writer, then the slots");
PYVMM_ARRAY_LEN_IS(struct shm_region, dev, SHM_MAX_DEVICES);
_Static_assert(sizeof(struct shm_region) <= SHM_REGION_HEADER_SIZE, "region header fits its page");
PYVMM_ARRAY_LEN_IS(struct pyvmm_shm_poll, rx, SHM_MAX_DEVICES);
PYVMM_ARRAY_LEN_IS(struct pyvmm_shm_poll, handle, SHM_MAX_DEVICES);

/* Guest -> tap: drain up to IO_BATCH frames of the TX ring.  Every frame
 * the tap does not take is a backend drop (nobody to report a failure to). */
static int service_tx(struct io_link *l)
{
    const struct tap_io_tally tx = {
        .frames = &l->c.tx_frames,
        .bytes = &l->c.tx_bytes,
        .failed = &l->c.tx_drops_backend,
        .errors = &l->c.tx_drops_backend,
    };
    uint32_t avail = shm_cons_avail(l->tx, l->tx_cons, l->slots);
    uint32_t i;

    if (avail == SHM_BAD) {
        l->c.tx_bad_index++;
        return 0;
    }
    if (avail > IO_BATCH)
        avail = IO_BATCH;
    for (i = 0; i < avail; i++) {
        struct shm_slot *s = shm_slot_at(l->tx, l->tx_cons + i, l->slots);
        /* Read the guest's length once: it may change it under us. */
        uint32_t len = __atomic_load_n(&s->len, __ATOMIC_RELAXED);

        if (len == 0 || len > SHM_SLOT_DATA) {
            l->c.tx_drops_bad_len++;
            continue;
        }
        tap_io_write(l->fd, s->data, len, 0, &tx);
    }
    if (avail) {
        l->tx_cons += avail;
        shm_cons_release(l->tx, l->tx_cons);
    }
    return (int)avail;
}

/* Publish what was filled since the last publish; wake the guest at most
 * once per batch, only if it sleeps and no wake-up is already pending. */
static void publish_rx(struct iothread *io, struct io_link *l)
{
    shm_prod_publish(l->rx, l->rx_prod);
    if (shm_prod_needs_notify(l->rx) && io_wake_guest(io)) {
        l->c.notify_sent++;
    } else {
        l->c.notify_suppressed++;
    }
}

/*
 * A frame is waiting but the ring looked full (or the guest's index is
 * impossible).  Read it first, then look again: the guest may have freed a
 * slot meanwhile, and only a frame that still finds no room is dropped.
 * Returns 1 if a frame was consumed from the backend, 0 if none waited.
 */
static int rx_when_full(struct shm_links *all, struct io_link *l,
                        const struct tap_io_tally *rx)
{
    uint32_t space, n = 0;
    /* Staged: what becomes of the frame is counted once the ring is seen. */
    int r = tap_io_read_one(l->fd, all->scratch, sizeof(all->scratch), &n, NULL);

    if (r == TAP_IO_OVERSIZE)
        n = sizeof(all->scratch) + 1u;
    else if (r != TAP_IO_FRAME || n == 0)
        return 0;
    space = shm_prod_space(l->rx, l->rx_prod, l->slots);
    if (space == SHM_BAD) {
        l->c.rx_bad_index++;
    } else if (space == 0) {
        l->c.rx_drops_full++;
    } else if (n > SHM_SLOT_DATA) {
        l->c.rx_drops_oversize++;
    } else {
        struct shm_slot *s = shm_slot_at(l->rx, l->rx_prod, l->slots);
        memcpy(s->data, all->scratch, n);
        __atomic_store_n(&s->len, n, __ATOMIC_RELAXED);
        l->rx_prod++;
        tap_io_count_frame(rx, n);
        return 2;
    }
    return 1;
}

/* Tap -> guest: fill up to IO_BATCH RX slots, publish once, notify once. */
/* Tap -> guest: fill up to IO_BATCH RX slots, publish once, notify once.
 * Each frame dropped counts against the batch: the other links get their
 * turn.  A slot cannot hold 0 bytes: an empty datagram, or a backend at
 * end of file, is no frame for the guest. */
static int service_rx(struct shm_links *all, struct io_link *l)
{
    /* A read counts its drops; a frame is counted once it is delivered. */
    const struct tap_io_tally read = { .oversize = &l->c.rx_drops_oversize };
    const struct tap_io_tally rx = { .frames = &l->c.rx_frames, .bytes = &l->c.rx_bytes };
    int moved = 0, seen = 0;

    while (seen < IO_BATCH) {
        uint32_t space = shm_prod_space(l->rx, l->rx_prod, l->slots);
        struct shm_slot *s;
        uint32_t n = 0;
        int r;

        if (space == SHM_BAD || space == 0) {
            r = rx_when_full(all, l, &rx);
            if (!r)
                break;
            seen++;
            moved += r == 2;
            continue;
        }
        s = shm_slot_at(l->rx, l->rx_prod, l->slots);
        r = tap_io_read_one(l->fd, s->data, SHM_SLOT_DATA, &n, &read);
        if (r == TAP_IO_OVERSIZE) {
            seen++;
            continue;
        }
        if (r != TAP_IO_FRAME || n == 0)
            break;
        seen++;
        __atomic_store_n(&s->len, n, __ATOMIC_RELAXED);
        l->rx_prod++;
        tap_io_count_frame(&rx, n);
        moved++;
    }
    if (moved)
        publish_rx(all->io, l);
    return seen;
}

static int links_service(void *ctx)
{
    struct shm_links *all = ctx;
    int i, work = 0;

    for (i = 0; i < all->n; i++) {
        struct io_link *l = &all->link[i];
        work += service_tx(l);   /* TX first, as before the split */
        work += service_rx(all, l);
    }
    return work;
}

/* Announce sleep on every TX ring; 0 if frames arrived meanwhile. */
static int links_prepare_sleep(void *ctx)
{
    struct shm_links *all = ctx;
    int i, ok = 1;

    for (i = 0; i < all->n; i++) {
        struct io_link *l = &all->link[i];
        if (!shm_cons_prepare_sleep(l->tx, l->tx_cons, l->slots))
            ok = 0;
    }
    return ok;
}

static void links_awake(void *ctx)
{
    struct shm_links *all = ctx;
    int i;

    for (i = 0; i < all->n; i++)
        shm_cons_awake(all->link[i].tx);
}

/* Frames the guest queued before it halted still go out. */
static void links_finish(void *ctx)
{
    struct shm_links *all = ctx;
    int i, rounds;

    for (i = 0; i < all->n; i++)
        for (rounds = 0; rounds < 64 && service_tx(&all->link[i]); rounds++)
            ;
}

static const struct io_service_ops links_ops = {
    .name = "shmstream",
    .service = links_service,
    .prepare_sleep = links_prepare_sleep,
    .awake = links_awake,
    .finish = links_finish,
};

int io_add_link(struct iothread *io, int backend_fd, void *rx, void *tx, uint32_t slots)
{
    struct shm_links *all = &io->shm;
    struct io_link *l;
    int err;

    if (io->started || all->n >= SHM_MAX_DEVICES)
        return -EBUSY;
    if (slots == 0 || (slots & (slots - 1)) != 0)
        return -EINVAL;
    if (all->n == 0 && !all->io) {
        if ((err = io_add_service(io, &links_ops, all)) < 0)
            return err;
        all->io = io;
    }
    if ((err = io_watch_fd(io, backend_fd)) < 0)
        return err;
    l = &all->link[all->n];
    memset(l, 0, sizeof(*l));
    l->fd = backend_fd;
    l->rx = rx;
    l->tx = tx;
    l->slots = slots;
    /* Start from whatever the ring says, so a restart does not rewind. */
    l->rx_prod = l->rx->prod;
    l->tx_cons = l->tx->cons;
    return all->n++;
}

struct shm_counters *io_link_counters(struct iothread *io, int link)
{
    return link >= 0 && link < io->shm.n ? &io->shm.link[link].c : NULL;
}

void shm_poll_drain_wake(const struct pyvmm_shm_poll *p)
{
    uint64_t stale;

    io_arm_wake(p->io);
    if (read(p->wake_fd, &stale, sizeof(stale)) < 0) {
        /* EAGAIN: no wake-up was pending. */
    }
}

uint64_t shm_poll_ready_set(const struct pyvmm_shm_poll *p)
{
    uint64_t ready = 0;
    uint32_t i, n = p->n < SHM_MAX_DEVICES ? p->n : SHM_MAX_DEVICES;

    /* Both indices are read as published; any difference, an impossible
     * one included, makes the guest look (it validates its own ring). */
    for (i = 0; i < n; i++)
        if (p->handle[i] < MFT_MAX_ENTRIES &&
            shm_load_acquire(&p->rx[i]->prod) != shm_load_acquire(&p->rx[i]->cons))
            ready |= (uint64_t)1 << p->handle[i];
    return ready;
}
