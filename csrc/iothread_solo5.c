/* The IO thread's Solo5-ring service (iothread_internal.h, solo5_ring.h,
 * docs/abi.md "Solo5's ring I/O"). */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include <sched.h>
#include <setjmp.h>

#include "guard.h"
#include "iothread_internal.h"
#include "shmstream_ring.h"
#include "spin.h"
#include "static_check.h"
#include "tap_io.h"

/* solo5_ring.h sizes its arrays and pads with literals, for cffi. */
PYVMM_ARRAY_LEN_IS(struct solo5_ring, ent, SOLO5_RING_ENTRIES);
PYVMM_ARRAY_LEN_IS(struct solo5_ring, com, SOLO5_RING_ENTRIES);
_Static_assert(offsetof(struct solo5_ring, ent_head) == 64 &&
               offsetof(struct solo5_ring, ent) == 128 &&
               sizeof(struct solo5_ring_entry) == 32 && sizeof(struct solo5_ring_commit) == 16,
               "solo5_ring layout (docs/abi.md)");

/* What a read's commit says of tap_io_read's result: as the net_read
 * hypercall (hcfast.c), a frame, or AGAIN (none waiting, or a turn given
 * after oversize frames were dropped), never a frame cut short. */
static int32_t read_result(int r)
{
    switch (r) {
    case TAP_IO_FRAME:
        return HVT_RET_OK;
    case TAP_IO_AGAIN:
        return HVT_RET_AGAIN;
    default:
        return HVT_RET_EUNSPEC;
    }
}

/*
 * Take submissions in order; writes go to the tap, reads are answered at
 * once with a commit (a frame or AGAIN), as the guest spins for it.
 * Everything in an entry is copied once before it is checked; every
 * buffer goes through the guest-memory view (guestmem.h): a read (the
 * host writes) into the low area or a read-only range is a bad entry,
 * committed EINVAL, like one outside memory.
 */
static int ring_service(void *ctx)
{
    struct solo5_link *s = ctx;
    /* Every frame the tap does not take is a failed write (nobody to
     * report it to); a read's frame, AGAIN or drops as tap_io_read's. */
    const struct tap_io_tally tx = {
        .frames = &s->c.writes,
        .bytes = &s->c.write_bytes,
        .failed = &s->c.write_failures,
        .errors = &s->c.write_failures,
    };
    const struct tap_io_tally rx = {
        .frames = &s->c.reads,
        .bytes = &s->c.read_bytes,
        .again = &s->c.reads_again,
        .oversize = &s->c.read_drops_oversize,
    };
    struct solo5_ring *r = s->ring;
    uint32_t avail = shm_load_acquire(&r->ent_tail) - s->ent_head;
    uint32_t committed = 0;
    int done = 0;

    if (avail > SOLO5_RING_ENTRIES) {
        s->c.bad_index++;
        s->read_ns = 0;   /* no lingering on a broken ring */
        return 0;
    }
    while (avail-- && done < IO_BATCH) {
        struct solo5_ring_entry e;
        uint8_t *buf;
        int fd;

        memcpy(&e, (const void *)&r->ent[s->ent_head % SOLO5_RING_ENTRIES], sizeof(e));
        if (e.operation == SOLO5_RING_OP_READ) {
            uint32_t used = s->com_tail - shm_load_acquire(&r->com_head);
            if (used > SOLO5_RING_ENTRIES) {
                s->c.bad_index++;
                s->stalled = 1;
                break;
            }
            if (used == SOLO5_RING_ENTRIES) {
                s->c.commit_stalls++;
                s->stalled = 1;
                break;
            }
        }
        fd = e.handle < MFT_MAX_ENTRIES ? s->fd[e.handle] : -1;
        if (e.operation == SOLO5_RING_OP_WRITE) {
            buf = e.len ? pyvmm_guestmem_at(&s->mem, e.data, e.len, PYVMM_GM_READ) : NULL;
            if (fd < 0 || !buf || e.len > s->max_frame[e.handle])
                s->c.bad_entries++;
            else
                tap_io_write(fd, buf, e.len, 0, &tx);
        } else if (e.operation == SOLO5_RING_OP_READ) {
            struct solo5_ring_commit *c = &r->com[s->com_tail % SOLO5_RING_ENTRIES];
            int32_t ret = HVT_RET_EINVAL;
            uint32_t len = 0;
            buf = e.len ? pyvmm_guestmem_at(&s->mem, e.data, e.len, PYVMM_GM_WRITE) : NULL;
            if (fd >= 0 && buf)
                ret = read_result(tap_io_read(fd, buf, e.len, &len, &rx));
            else
                s->c.bad_entries++;
            c->id = e.id;
            c->ret = ret;
            c->len = len;
            c->reserved = 0;
            s->com_tail++;
            committed++;
        } else {
            s->c.bad_entries++;
        }
        s->ent_head++;
        done++;
    }
    if (done)
        shm_store_release(&r->ent_head, s->ent_head);
    if (committed)
        shm_store_release(&r->com_tail, s->com_tail);
    /* Linger after reads (below), unless the ring cannot progress. */
    if (s->stalled)
        s->read_ns = 0;
    else if (committed)
        s->read_ns = clock_ns(CLOCK_MONOTONIC);
    return done;
}

/*
 * How long the thread stays awake after committing a read, in event and
 * hybrid mode, before it announces sleep, when it has a CPU of its own
 * (--pin).  A Solo5 guest's read is synchronous (it spins for the commit,
 * then reads again until AGAIN), so a read just answered predicts the next
 * one within microseconds; sleeping at once made every read a kick (an
 * emulated outl on a PVM host, ~1 per frame measured) and a wake-up of
 * this thread while the guest spun.  Lingering passes give the CPU away
 * (sched_yield).  Unpinned, the thread may share the guest's CPU, and
 * there sleeping is the better hand-off: the kick's wake-up lets this
 * thread preempt the spinning guest, where a lingering thread waits for
 * the guest's time slice to end.  A broken index or a full commit ring
 * ends the lingering (ring_service), so that no guest makes this thread
 * spin on what cannot progress.
 */
#define RING_LINGER_NS (100u * 1000u)

static int own_cpu(const struct solo5_link *s)
{
    const struct iothread *io =
        (const struct iothread *)((const char *)s - offsetof(struct iothread, s5));
    return io->cpu >= 0;
}

static int lingering(const struct solo5_link *s)
{
    return own_cpu(s) && s->read_ns != 0 &&
           clock_ns(CLOCK_MONOTONIC) - s->read_ns < s->linger_ns;
}

/*
 * Hybrid mode's idle polling, for the same reason: unpinned, the passes
 * after a commit (each a sched_yield) share a CPU with a guest that spins
 * for its next commit, and the guest's spin then holds the CPU until its
 * time slice ends, once per read (docs/solo5-bindings.md, "hybrid
 * unpinned").  There hybrid sleeps at once, as event mode does (with
 * --net-ring-kicks=exit the vCPU thread serves the kicks itself:
 * io_solo5_kick); pinned, the
 * lingering above keeps it awake while reads follow each other.
 */
static int ring_idle_poll(void *ctx)
{
    return own_cpu(ctx);
}

/*
 * The ring's state (the host's indices, stalled, read_ns, the counters)
 * belongs to one thread at a time: the IO thread's pass, or the vCPU
 * thread serving a kick inline (io_solo5_kick).  Neither waits for the
 * other: the IO thread that finds the ring taken looks again on its next
 * pass, the vCPU thread hands its kick to the IO thread.
 */
static int take(struct solo5_link *s)
{
    return !__atomic_exchange_n(&s->busy, 1, __ATOMIC_ACQUIRE);
}

static void give_back(struct solo5_link *s)
{
    __atomic_store_n(&s->busy, 0, __ATOMIC_RELEASE);
}

/* The IO thread's pass: a ring taken by a kick being served is work to
 * look at again, not a reason to sleep. */
static int ring_pass(void *ctx)
{
    struct solo5_link *s = ctx;
    int done;

    /* Asked from the first pass on, also over a restored ring's flag. */
    if (s->kicks_at_exit)
        __atomic_store_n(&s->ring->needs_kick, 1, __ATOMIC_RELAXED);
    if (!take(s))
        return 1;
    done = ring_service(s);
    give_back(s);
    return done;
}

static int may_sleep(struct solo5_link *s)
{
    struct solo5_ring *r = s->ring;
    uint32_t pending;

    __atomic_store_n(&r->needs_kick, 1, __ATOMIC_RELAXED);
    shm_full_fence();
    /* Only work that can progress keeps us awake: an impossible ent_tail,
     * or reads waiting for commit room (the guest kicks again once it has
     * consumed commits), must not make this thread spin. */
    pending = shm_load_acquire(&r->ent_tail) - s->ent_head;
    return !(pending != 0 && pending <= SOLO5_RING_ENTRIES && !s->stalled);
}

static int ring_prepare_sleep(void *ctx)
{
    struct solo5_link *s = ctx;
    int linger, ok = 0;

    if (!take(s))
        return 0;
    linger = lingering(s);
    if (!linger)
        ok = may_sleep(s);
    give_back(s);
    if (linger)
        sched_yield();
    return ok;
}

static void ring_awake(void *ctx)
{
    struct solo5_link *s = ctx;

    if (!s->kicks_at_exit)
        __atomic_store_n(&s->ring->needs_kick, 0, __ATOMIC_RELAXED);
}

/* Woken (a kick, a frame): reads that waited for commit room try again.
 * A ring taken by a kick being served needs no drain: the kick drains. */
static void ring_drain(void *ctx)
{
    struct solo5_link *s = ctx;

    if (take(s)) {
        s->stalled = 0;
        give_back(s);
    }
}

static const struct io_service_ops ring_ops = {
    .name = "solo5-ring",
    .service = ring_pass,
    .prepare_sleep = ring_prepare_sleep,
    .awake = ring_awake,
    .drain = ring_drain,
    .idle_poll = ring_idle_poll,
};

int io_set_solo5_ring_view(struct iothread *io, void *ring, const struct pyvmm_guestmem *mem,
                           uint64_t usable)
{
    int i, err;

    if (io->started)
        return -EBUSY;
    if (!io->s5.ring && (err = io_add_service(io, &ring_ops, &io->s5)) < 0)
        return err;
    io->s5.ring = ring;
    io->s5.mem = *mem;
    io->s5.linger_ns = RING_LINGER_NS;
    if (usable < io->s5.mem.size)
        io->s5.mem.size = usable;
    for (i = 0; i < MFT_MAX_ENTRIES; i++)
        io->s5.fd[i] = -1;
    io->s5.ent_head = io->s5.ring->ent_head;
    io->s5.com_tail = io->s5.ring->com_tail;
    return 0;
}

int io_solo5_attach_tap(struct iothread *io, uint32_t handle, int backend_fd, uint32_t max_frame)
{
    if (io->started || !io->s5.ring || handle >= MFT_MAX_ENTRIES)
        return -EINVAL;
    io->s5.fd[handle] = backend_fd;
    io->s5.max_frame[handle] = max_frame;
    return 0;
}

int io_solo5_indices(struct iothread *io, uint32_t *ent_head, uint32_t *com_tail)
{
    if (!io->s5.ring)
        return -EINVAL;
    *ent_head = io->s5.ent_head;
    *com_tail = io->s5.com_tail;
    return 0;
}

int io_solo5_set_indices(struct iothread *io, uint32_t ent_head, uint32_t com_tail)
{
    if (!io->s5.ring)
        return -EINVAL;
    if (io->started)
        return -EBUSY;
    io->s5.ent_head = ent_head;
    io->s5.com_tail = com_tail;
    return 0;
}

int io_solo5_kick(struct iothread *io)
{
    struct solo5_link *s = &io->s5;
    struct pyvmm_guard g;

    if (!s->ring)
        return -EINVAL;
    if (!take(s)) {
        __atomic_fetch_add(&s->c.kicks_passed, 1, __ATOMIC_RELAXED);
        io_notify(io->kick_fd);
        return 0;
    }
    /* Guest memory mapped from a file can lose a page under the ring or a
     * buffer (guard.h): the ring is given back, and the caller ends the
     * run with one line. */
    if (sigsetjmp(g.env, 0)) {
        give_back(s);
        return -EFAULT;
    }
    pyvmm_guard_enter(&g, (const void *)(uintptr_t)s->mem.host, s->mem.size, s->ring,
                      sizeof(*s->ring));
    s->stalled = 0;
    /* Everything the guest submitted, a batch at a time, until a read
     * waits for commit room (the guest kicks again after it takes some).
     * Bounded: the guest's one vCPU is in this exit, so ent_tail holds
     * still, and each full batch moves ent_head on. */
    while (ring_service(s) == IO_BATCH && !s->stalled)
        ;
    pyvmm_guard_leave(&g);
    s->c.kicks_inline++;
    give_back(s);
    return 1;
}

int io_solo5_kicks_at_exit(struct iothread *io)
{
    if (!io->s5.ring)
        return -EINVAL;
    if (io->started)
        return -EBUSY;
    io->s5.kicks_at_exit = 1;
    return 0;
}

struct solo5_ring_counters *io_solo5_counters(struct iothread *io)
{
    return &io->s5.c;
}
