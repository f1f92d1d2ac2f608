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
    uint32_t space;

    shm_prod_publish(l->rx, l->rx_prod);
    if (shm_prod_needs_notify(l->rx) && io_wake_guest(io)) {
        l->c.notify_sent++;
    } else {
        l->c.notify_suppressed++;
    }
    /* Three quarters full: the guest is behind, let it run (a broken
     * index is no reason to: a guest must not steer the thread). */
    space = shm_prod_space(l->rx, l->rx_prod, l->slots);
    if (space != SHM_BAD && space < l->slots / 4)
        io_want_hand_off(io);
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

/*
 * Tap -> guest through io_uring (tap_io.h's batched reads): a chain of
 * reads in flight per link, straight into its free RX slots; completions
 * reaped in one pass, published once per link.  The drop policy is
 * service_rx's: an oversize frame is counted and leaves its slot to the
 * next frame; with the ring full, service_rx reads and drops (no read is
 * in flight then, so the tap's order is kept).
 */

/* A frame a chain read into the slot tagged `tag`: delivered in place, or
 * moved down over the slots oversize or empty reads left (every read
 * before it has completed: a tap's reads run in order). */
static void uring_deliver(struct io_link *l, uint32_t tag, uint32_t n,
                          const struct tap_io_tally *rx)
{
    struct shm_slot *s = shm_slot_at(l->rx, l->rx_prod, l->slots);

    if (tag != l->rx_prod)
        memcpy(s->data, shm_slot_at(l->rx, tag, l->slots)->data, n);
    __atomic_store_n(&s->len, n, __ATOMIC_RELAXED);
    l->rx_prod++;
    tap_io_count_frame(rx, n);
}

/* A link with no read in flight: a chain over its free slots, or, with no
 * free slot (or a tap that refused a batched read), service_rx's pass. */
static int uring_arm(struct shm_links *all, int i)
{
    struct io_link *l = &all->link[i];
    uint32_t space = shm_prod_space(l->rx, l->rx_prod, l->slots), k, n;
    void *bufs[TAP_URING_CHAIN];
    uint32_t tags[TAP_URING_CHAIN];

    if (space == SHM_BAD || space == 0 || (all->readv_only & (1u << i)))
        return service_rx(all, l);
    n = space < TAP_URING_CHAIN ? space : TAP_URING_CHAIN;
    for (k = 0; k < n; k++) {
        tags[k] = l->rx_prod + k;
        bufs[k] = shm_slot_at(l->rx, tags[k], l->slots)->data;
    }
    tap_uring_read_chain(all->uring, (uint32_t)i, bufs, tags, n, SHM_SLOT_DATA);
    return 0;
}

static int service_rx_uring(struct shm_links *all)
{
    struct tap_uring *u = all->uring;
    uint32_t moved = 0, link, tag;
    int32_t res;
    int i, work = 0;

    for (i = 0; i < all->n; i++)
        if (!tap_uring_inflight(u, (uint32_t)i))
            work += uring_arm(all, i);
    /* A failed kick is tried again next pass; reads in flight stay. */
    tap_uring_kick(u);
    while (tap_uring_reap(u, &link, &tag, &res)) {
        struct io_link *l;

        if (link >= (uint32_t)all->n)
            continue;
        l = &all->link[link];
        if (res > SHM_SLOT_DATA) {
            l->c.rx_drops_oversize++;
            work++;
        } else if (res > 0) {
            const struct tap_io_tally counted = { .frames = &l->c.rx_frames,
                                                  .bytes = &l->c.rx_bytes };
            uring_deliver(l, tag, (uint32_t)res, &counted);
            moved |= 1u << link;
            work++;
        } else if (res == 0 || (res != -EAGAIN && res != -EINTR && res != -ECANCELED)) {
            /* No tap reads 0 bytes: a backend at end of file, or one that
             * refuses reads (gone, detached), goes back to readv's path,
             * which finds no frame there and whose epoll stops watching a
             * backend that hung up (so it is no work, and no spin). */
            all->readv_only |= 1u << link;
        }
    }
    for (i = 0; i < all->n; i++)
        if (moved & (1u << i))
            publish_rx(all->io, &all->link[i]);
    return work;
}

static int links_service(void *ctx)
{
    struct shm_links *all = ctx;
    int i, work = 0;

    if (all->uring) {
        for (i = 0; i < all->n; i++)
            work += service_tx(&all->link[i]);
        return work + service_rx_uring(all);
    }
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
    /* Reads completed, or ready to run at the next system call. */
    if (all->uring && tap_uring_ready(all->uring))
        ok = 0;
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
    /* No read may still write into the rings once the thread is gone. */
    if (all->uring)
        tap_uring_cancel(all->uring);
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

int io_shm_use_uring(struct iothread *io)
{
    struct shm_links *all = &io->shm;
    int fds[SHM_MAX_DEVICES], i, err;

    if (io->started || all->uring)
        return -EBUSY;
    if (all->n == 0)
        return -EINVAL;
    for (i = 0; i < all->n; i++)
        fds[i] = all->link[i].fd;
    if ((err = tap_uring_open(fds, (uint32_t)all->n, &all->uring)) < 0)
        return err;
    /* Completions wake the thread too (a read may take a frame between
     * its last pass and its sleep, leaving the tap empty). */
    if ((err = io_watch_fd(io, tap_uring_fd(all->uring))) < 0) {
        tap_uring_close(all->uring);
        all->uring = NULL;
    }
    return err;
}

void io_shm_release_uring(struct iothread *io)
{
    if (io->started || !io->shm.uring)
        return;
    tap_uring_close(io->shm.uring);
    io->shm.uring = NULL;
}

int io_link_indices(struct iothread *io, int link, uint32_t *rx_prod, uint32_t *tx_cons)
{
    if (link < 0 || link >= io->shm.n)
        return -EINVAL;
    *rx_prod = io->shm.link[link].rx_prod;
    *tx_cons = io->shm.link[link].tx_cons;
    return 0;
}

int io_link_set_indices(struct iothread *io, int link, uint32_t rx_prod, uint32_t tx_cons)
{
    if (link < 0 || link >= io->shm.n)
        return -EINVAL;
    if (io->started)
        return -EBUSY;
    io->shm.link[link].rx_prod = rx_prod;
    io->shm.link[link].tx_cons = tx_cons;
    return 0;
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
