/*
 * The IO thread's insides, shared by its three files (not read by cffi;
 * the public API is iothread.h):
 *   iothread.c        the thread: modes (poll, event, hybrid), sleep and
 *                     wake-up, start and stop, counters;
 *   iothread_shm.c    shmstream links: a tap and its RX and TX rings;
 *   iothread_solo5.c  Solo5's ring: submissions and commits.
 * A "link" is the IO thread's endpoint for one device (the public API
 * still says "port" in io_add_port and io_port_counters); an x86 I/O port
 * is always called a port.
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

/* Solo5's ring and the taps behind its handles. */
struct solo5_link {
    struct solo5_ring *ring;
    struct pyvmm_guestmem mem;      /* a copy of the view; size: usable memory */
    int fd[MFT_MAX_ENTRIES];
    uint32_t max_frame[MFT_MAX_ENTRIES];
    uint32_t ent_head;   /* trusted copies of the host-owned indices */
    uint32_t com_tail;
    int stalled;         /* a read waits for commit room: sleep till a kick */
    struct solo5_ring_counters c;
};

struct iothread {
    int mode;
    uint32_t budget_us;
    int cpu;
    int kick_fd;
    int wake_fd;
    int stop_fd;
    int epfd;
    int nlinks;
    int started;
    volatile int stop;
    int wake_armed;     /* 1: the vCPU waits for (or will check) wake_fd */
    pthread_t thread;
    uint64_t final_cpu_ns;
    struct io_stats stats;
    struct io_link link[SHM_MAX_DEVICES];
    struct solo5_link s5;
    /* Where frames that cannot be delivered are read to be dropped. */
    uint8_t scratch[65536];
};

/* iothread.c */
void io_notify(int fd);
int io_watch(struct iothread *io, int fd);

/* iothread_shm.c: one pass over a link (frames seen), and the TX side
 * alone (the last drain at stop). */
int io_link_service(struct iothread *io, struct io_link *l);
int io_link_service_tx(struct io_link *l);

/* iothread_solo5.c: one pass over the ring (submissions taken); before
 * sleeping (0: work arrived, stay awake) and after waking. */
int io_solo5_service(struct solo5_link *s);
int io_solo5_prepare_sleep(struct solo5_link *s);
void io_solo5_awake(struct solo5_link *s);

#endif
