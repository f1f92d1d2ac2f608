/*
 * The IO thread's insides, shared by its three files (not read by cffi;
 * the public API is iothread.h):
 *   iothread.c        the thread: modes (poll, event, hybrid), sleep and
 *                     wake-up, start and stop, counters, and the table of
 *                     services it runs (it names none of them);
 *   iothread_shm.c    the service of the shmstream links: a tap and its RX
 *                     and TX rings each;
 *   iothread_solo5.c  the service of Solo5's ring: submissions and commits.
 * Services call the thread (io_add_service, io_watch_fd, io_wake_guest),
 * never the other way round.  A "link" is the IO thread's endpoint for one
 * device; an x86 I/O port is always called a port.
 */
#ifndef PYVMM_IOTHREAD_INTERNAL_H
#define PYVMM_IOTHREAD_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "guestmem.h"
#include "hvt_abi.h"
#include "iothread.h"
#include "shmstream.h"
#include "solo5_ring.h"

/* One shmstream device: its tap and its rings. */
struct io_link {
    int fd;
    struct shm_ring *rx;
    struct shm_ring *tx;
    uint32_t slots;
    uint32_t rx_prod;   /* trusted copies of the indices the host owns */
    uint32_t tx_cons;
    struct shm_counters c;
};

/* The shmstream service: every link of the thread. */
struct shm_links {
    struct iothread *io;
    int n;
    struct io_link link[SHM_MAX_DEVICES];
    /* Where frames that cannot be delivered are read to be dropped. */
    uint8_t scratch[65536];
    /* The taps' batched reads (tap_io.h), or NULL: one readv per frame. */
    struct tap_uring *uring;
    uint32_t readv_only;    /* links whose tap refused a batched read */
};

/* Solo5's ring and the taps behind its handles. */
struct solo5_link {
    struct solo5_ring *ring;
    struct pyvmm_guestmem mem;      /* a copy of the view; size: usable memory */
    int fd[MFT_MAX_ENTRIES];
    uint32_t max_frame[MFT_MAX_ENTRIES];
    uint32_t ent_head;   /* trusted copies of the host-owned indices */
    uint32_t com_tail;
    int busy;            /* 1 while one thread serves the ring (take/give_back) */
    int kicks_at_exit;   /* the vCPU thread serves kicks: always ask for one */
    int stalled;         /* a read waits for commit room: sleep till a kick */
    uint64_t read_ns;    /* CLOCK_MONOTONIC of the last read committed */
    uint64_t linger_ns;  /* how long the thread stays awake after one */
    struct solo5_ring_counters c;
};

/* One entry of the thread's table. */
struct io_service {
    const struct io_service_ops *ops;
    void *ctx;
};

struct iothread {
    int mode;
    uint32_t budget_us;
    int cpu;
    int kick_fd;
    int wake_fd;
    int stop_fd;
    int epfd;
    int started;
    int tid;            /* the thread's kernel id, once it runs */
    volatile int stop;
    int wake_armed;     /* 1: the vCPU waits for (or will check) wake_fd */
    int hand_off;       /* after this pass, give the CPU to the vCPU (own) */
    int vcpu_cpu;       /* where the vCPU last armed its wake-up, or -1 */
    int pause_req;      /* io_pause asked the thread to hold between passes */
    int paused;         /* the thread holds (io_pause waits for it) */
    pthread_t thread;
    uint64_t final_cpu_ns;
    struct io_stats stats;
    int nservices;
    struct io_service service[IO_MAX_SERVICES];
    /* The services' own state, allocated with the thread; only their own
     * files touch it. */
    struct shm_links shm;
    struct solo5_link s5;
};

/* iothread.c, for the services: signal an eventfd; wake the vCPU through
 * wake_fd if it is armed for a wake-up (1: woken, 0: suppressed). */
void io_notify(int fd);
int io_wake_guest(struct iothread *io);
/* A service's request: the guest is behind (its RX ring nearly full), so
 * let it run before the next pass reads frames it has no room for. */
void io_want_hand_off(struct iothread *io);

#endif
