/* The IO thread's shmstream links: tap <-> RX/TX rings (iothread_internal.h,
 * shmstream.h, docs/modes.md). */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "iothread_internal.h"
#include "shmstream_ring.h"
#include "static_check.h"

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

/* Guest -> tap: drain up to IO_BATCH frames of the TX ring. */
int io_link_service_tx(struct io_link *l)
{
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
        ssize_t n;

        if (len == 0 || len > SHM_SLOT_DATA) {
            l->c.tx_drops_bad_len++;
            continue;
        }
        do
            n = write(l->fd, s->data, len);
        while (n < 0 && errno == EINTR);
        if (n < 0) {
            l->c.tx_drops_backend++;
            continue;
        }
        l->c.tx_frames++;
        l->c.tx_bytes += len;
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
    if (shm_prod_needs_notify(l->rx) && __atomic_exchange_n(&io->wake_armed, 0, __ATOMIC_ACQ_REL)) {
        io_notify(io->wake_fd);
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
static int rx_when_full(struct iothread *io, struct io_link *l)
{
    ssize_t n = read(l->fd, io->scratch, sizeof(io->scratch));
    uint32_t space;

    if (n <= 0)
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
        memcpy(s->data, io->scratch, (size_t)n);
        __atomic_store_n(&s->len, (uint32_t)n, __ATOMIC_RELAXED);
        l->rx_prod++;
        l->c.rx_frames++;
        l->c.rx_bytes += (uint64_t)n;
        return 2;
    }
    return 1;
}

/* Tap -> guest: fill up to IO_BATCH RX slots, publish once, notify once. */
static int service_rx(struct iothread *io, struct io_link *l)
{
    int moved = 0, seen = 0;

    while (seen < IO_BATCH) {
        uint32_t space = shm_prod_space(l->rx, l->rx_prod, l->slots);
        struct shm_slot *s;
        struct iovec iov[2];
        ssize_t n;

        if (space == SHM_BAD || space == 0) {
            int r = rx_when_full(io, l);
            if (!r)
                break;
            seen++;
            moved += r == 2;
            continue;
        }
        s = shm_slot_at(l->rx, l->rx_prod, l->slots);
        /* The second buffer only catches frames too large for a slot. */
        iov[0].iov_base = s->data;
        iov[0].iov_len = SHM_SLOT_DATA;
        iov[1].iov_base = io->scratch;
        iov[1].iov_len = sizeof(io->scratch);
        n = readv(l->fd, iov, 2);
        if (n < 0 && errno == EINTR)
            continue;
        /* Nothing waiting, an error, or 0 bytes (an empty datagram or a
         * backend at end of file): no frame for the guest. */
        if (n <= 0)
            break;
        seen++;
        if (n > SHM_SLOT_DATA) {
            l->c.rx_drops_oversize++;
            continue;
        }
        __atomic_store_n(&s->len, (uint32_t)n, __ATOMIC_RELAXED);
        l->rx_prod++;
        l->c.rx_frames++;
        l->c.rx_bytes += (uint64_t)n;
        moved++;
    }
    if (moved)
        publish_rx(io, l);
    return seen;
}

int io_link_service(struct iothread *io, struct io_link *l)
{
    int work = io_link_service_tx(l);   /* TX first, as before the split */
    return work + service_rx(io, l);
}

int io_add_port(struct iothread *io, int backend_fd, void *rx, void *tx, uint32_t slots)
{
    struct io_link *l;
    int err;

    if (io->started || io->nlinks >= SHM_MAX_DEVICES)
        return -EBUSY;
    if (slots == 0 || (slots & (slots - 1)) != 0)
        return -EINVAL;
    if ((err = io_watch(io, backend_fd)) < 0)
        return err;
    l = &io->link[io->nlinks];
    memset(l, 0, sizeof(*l));
    l->fd = backend_fd;
    l->rx = rx;
    l->tx = tx;
    l->slots = slots;
    /* Start from whatever the ring says, so a restart does not rewind. */
    l->rx_prod = l->rx->prod;
    l->tx_cons = l->tx->cons;
    return io->nlinks++;
}

struct shm_counters *io_port_counters(struct iothread *io, int link)
{
    return link >= 0 && link < io->nlinks ? &io->link[link].c : NULL;
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
