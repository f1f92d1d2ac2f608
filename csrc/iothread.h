/*
 * The IO thread: a native pthread that owns the host side of every
 * shmstream net device (its tap and its two rings) and of Solo5's ring, so
 * that moving a frame never needs Python, the GIL or a VM exit.
 * Declarations are read by cffi (plain types, integer #defines only); the
 * thread's insides are in iothread_internal.h.  Each device the thread
 * serves is a "link"; what the thread runs are services (io_add_service):
 * the shmstream links and Solo5's ring register themselves as two.
 */
#ifndef PYVMM_IOTHREAD_H
#define PYVMM_IOTHREAD_H

#include <stdint.h>

#include "guestmem.h"
#include "shmstream.h"

#define IO_MODE_POLL 1
#define IO_MODE_EVENT 2
#define IO_MODE_HYBRID 3

/* Frames moved per ring per pass before the other rings get a turn. */
#define IO_BATCH 64

/* Per device; written by the IO thread only, read by anyone. */
struct shm_counters {
    uint64_t rx_frames;          /* tap -> guest, delivered into the RX ring */
    uint64_t rx_bytes;
    uint64_t rx_drops_full;      /* RX ring full: frame read and dropped */
    uint64_t rx_drops_oversize;  /* frame larger than a slot */
    uint64_t rx_bad_index;       /* guest's RX cons impossible: ring treated as full */
    uint64_t tx_frames;          /* guest -> tap */
    uint64_t tx_bytes;
    uint64_t tx_drops_bad_len;   /* slot length 0 or larger than a slot */
    uint64_t tx_drops_backend;   /* tap refused the frame */
    uint64_t tx_bad_index;       /* guest's TX prod impossible: ring ignored */
    uint64_t notify_sent;        /* guest woken (its RX consumer slept) */
    uint64_t notify_suppressed;  /* RX batches published without a wake-up */
};

/* Solo5's ring (solo5_ring.h); written by the IO thread only. */
struct solo5_ring_counters {
    uint64_t writes;             /* frames sent to a tap */
    uint64_t write_bytes;
    uint64_t reads;              /* frames read into guest buffers */
    uint64_t read_bytes;
    uint64_t reads_again;        /* read submitted, no frame waiting */
    uint64_t read_drops_oversize; /* frame longer than the read's buffer: dropped */
    uint64_t bad_entries;        /* bad operation, handle, address or length
                                  * (a write longer than the tap's largest
                                  * frame, a read into memory the host may
                                  * not write for the guest) */
    uint64_t bad_index;          /* guest's ent_tail or com_head impossible */
    uint64_t commit_stalls;      /* commit ring full: submissions wait */
    uint64_t write_failures;     /* frames the tap refused: dropped */
    uint64_t kicks_inline;       /* kicks served by the vCPU thread (io_solo5_kick) */
    uint64_t kicks_passed;       /* kicks it handed to the IO thread, busy on the ring */
};

/* Per thread. */
struct io_stats {
    uint64_t wakeups;            /* returns from epoll_wait */
    uint64_t kicks;              /* guest TX notifications (ioeventfd count) */
    uint64_t sleeps;             /* times the thread went to sleep */
    uint64_t busy_passes;        /* passes over the rings that moved frames */
    uint64_t idle_spins;         /* passes that found nothing (poll, hybrid) */
    uint64_t handoffs;           /* yields to a guest behind on its RX ring */
};

struct iothread;

/* Services one thread runs at most. */
#define IO_MAX_SERVICES 8

/*
 * What the thread runs, one pass after another: each service is a table of
 * these and its own context.  service is required, the others may be NULL.
 * The thread sleeps only once every service's prepare_sleep agreed.
 */
struct io_service_ops {
    const char *name;
    int  (*service)(void *ctx);        /* one pass: frames/work done */
    int  (*prepare_sleep)(void *ctx);  /* announce sleep; 0 if work arrived */
    void (*awake)(void *ctx);          /* the thread is awake: no kicks needed */
    void (*drain)(void *ctx);          /* after a wake-up: consume its eventfds */
    void (*finish)(void *ctx);         /* the thread is stopping: last work */
    /* hybrid mode: 0 if polling while idle would only hold off this
     * service's guest, so the thread sleeps at once (NULL: polling helps) */
    int  (*idle_poll)(void *ctx);
};

/*
 * mode: IO_MODE_*; budget_us: hybrid only, how long to keep polling
 * without work before sleeping again; cpu: pin to this CPU, or -1;
 * kick_fd: eventfd signalled by guest TX kicks (KVM ioeventfd), or -1;
 * wake_fd: eventfd to signal when a sleeping guest has new RX frames.
 * Returns NULL on allocation failure.
 */
struct iothread *io_create(int mode, uint32_t budget_us, int cpu, int kick_fd, int wake_fd);

/* Only before io_start; at most IO_MAX_SERVICES; 0 or -errno. The fds a
 * service waits on are added with io_watch_fd (epoll, level-triggered). */
int io_add_service(struct iothread *io, const struct io_service_ops *ops, void *ctx);
int io_watch_fd(struct iothread *io, int fd);

/*
 * A shmstream device (a link): backend_fd is a non-blocking tap (any fd
 * that reads and writes one frame per call will do); rx and tx are the
 * rings' host addresses; slots a power of two.  Returns the link index or
 * -errno.  Only before io_start.
 */
int io_add_link(struct iothread *io, int backend_fd, void *rx, void *tx, uint32_t slots);

struct shm_counters *io_link_counters(struct iothread *io, int link);

/*
 * Read the links' taps through io_uring (tap_io.h's batched reads) instead
 * of one readv per frame: after the last io_add_link, before io_start; 0
 * or -errno (io_uring absent, refused or too old: the links keep readv).
 * io_shm_release_uring closes the ring; the thread must be stopped.
 */
int io_shm_use_uring(struct iothread *io);
void io_shm_release_uring(struct iothread *io);

/*
 * Serve Solo5's ring at host address `ring` too.  Guest addresses in its
 * entries go through a copy of the guest-memory view `mem` (guestmem.h)
 * limited to [0, usable): a write buffer must be readable, a read buffer
 * writable on the guest's behalf.  Only before io_start; 0 or -errno.
 */
int io_set_solo5_ring_view(struct iothread *io, void *ring, const struct pyvmm_guestmem *mem,
                           uint64_t usable);
/* The tap for manifest handle `handle` (< MFT_MAX_ENTRIES) of the Solo5
 * ring, and the largest frame a write may send through it (MTU +
 * HVT_ETH_HLEN; longer ones are bad entries, as the net_write hypercall
 * refuses them). */
int io_solo5_attach_tap(struct iothread *io, uint32_t handle, int backend_fd, uint32_t max_frame);
/*
 * A kick of Solo5's ring served by the caller (the vCPU thread, at the
 * kick's exit) instead of the IO thread: the submissions waiting are
 * served at once, so the guest finds its commit when it resumes.  If the
 * IO thread is serving the ring right then, the kick is handed to it
 * through kick_fd.  1: served here, 0: handed over, -EINVAL: no ring.
 * For an IO thread without a CPU of its own, where a kick's wake-up of
 * the thread costs more than the exit (docs/solo5-bindings.md).
 */
int io_solo5_kick(struct iothread *io);
/* The kicks will be served by io_solo5_kick (no ioeventfd): the guest is
 * asked to kick after every submission, in every mode, whether the thread
 * sleeps or not, so that it never spins for a thread that may share its
 * CPU.  Before io_start; 0, -EINVAL (no ring) or -EBUSY. */
int io_solo5_kicks_at_exit(struct iothread *io);
struct solo5_ring_counters *io_solo5_counters(struct iothread *io);
struct io_stats *io_thread_stats(struct iothread *io);

/*
 * A snapshot's quiescence: io_pause returns once the thread is between two
 * passes (every batch published, no frame half-written into a slot) and
 * holds it there until io_resume; 0 at once for a thread not started.
 * While paused, the host-owned indices below are the thread's own copies.
 */
int io_pause(struct iothread *io);
void io_resume(struct iothread *io);

/* A link's host-owned ring indices (its trusted copies): read while the
 * thread is paused or stopped; set before io_start (a restored snapshot's).
 * 0 or -EINVAL (no such link) / -EBUSY (set while running). */
int io_link_indices(struct iothread *io, int link, uint32_t *rx_prod, uint32_t *tx_cons);
int io_link_set_indices(struct iothread *io, int link, uint32_t rx_prod, uint32_t tx_cons);
/* The same for Solo5's ring: its entry head and commit tail. */
int io_solo5_indices(struct iothread *io, uint32_t *ent_head, uint32_t *com_tail);
int io_solo5_set_indices(struct iothread *io, uint32_t ent_head, uint32_t com_tail);

/* Start the thread (stop signals blocked in it); 0 or -errno. */
int io_start(struct iothread *io);
/* The running thread's kernel id (gettid), 0 before io_start. */
int io_thread_tid(struct iothread *io);
/* Stop and join; safe to call twice or without a start. */
void io_stop(struct iothread *io);
/* CPU time the thread has used, in ns (its total once stopped). */
uint64_t io_cpu_ns(struct iothread *io);
void io_destroy(struct iothread *io);

/*
 * The vCPU thread is about to look at the RX rings and then wait on
 * wake_fd: allow one more wake-up.  The IO thread writes wake_fd at most
 * once per arming, so a guest that sleeps through many RX batches costs
 * one eventfd write, not one per batch.
 */
void io_arm_wake(struct iothread *io);

/*
 * What the poll hypercall needs of a shmstream region, for the C fast
 * path (hcfast.c) and Python's Hypercalls.poll (through ShmStream) alike:
 * the IO thread, its wake eventfd and each device's RX ring.
 */
struct pyvmm_shm_poll {
    struct iothread *io;
    int32_t wake_fd;
    uint32_t n;                  /* devices, <= SHM_MAX_DEVICES */
    struct shm_ring *rx[16];
    uint32_t handle[16];         /* manifest handle of each */
};

/* Re-arm the IO thread's wake-up (io_arm_wake) and clear a stale one; the
 * caller looks at the rings afterwards, so nothing published after the
 * re-arm can be missed. */
void shm_poll_drain_wake(const struct pyvmm_shm_poll *p);
/* Bit h set when handle h's RX ring holds frames the guest has not
 * consumed.  Only reads the ring; an impossible index also counts as
 * ready, so the guest looks (and finds its ring broken). */
uint64_t shm_poll_ready_set(const struct pyvmm_shm_poll *p);

#endif
