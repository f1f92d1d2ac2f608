/*
 * The hypercall fast path: the per-frame and per-request hvt hypercalls
 * (net_read, net_write, poll, block_read, block_write) and walltime
 * answered in C, inside the vCPU thread's KVM_RUN loop, without a trip
 * through Python.
 *
 * Only the clean case is handled here: argument struct and buffer accepted
 * by the guest-memory view's accessor (guestmem.h: inside guest memory
 * and, where the host writes, outside the low area and the read-only
 * ranges).
 * Anything else (a bad pointer, an unknown handle, every other hypercall,
 * every other exit) is returned to Python as a plain exit, so the error
 * messages and the rules stay in one place (pyvmm/hvt/hypercalls.py) and
 * this file only has to agree with them on the clean case.
 *
 * Read by cffi on its own, as every header in build_native.py's
 * SHARED_HEADERS is: plain types, literal array sizes.
 */
#ifndef PYVMM_HCFAST_H
#define PYVMM_HCFAST_H

#include <stdint.h>

#include "guestmem.h"
#include "kvm_run.h"

/* The poll set's limit: fdwait.h's PYVMM_WAIT_MAX_FDS (a literal here and
 * in the arrays below for cffi, checked against it in hcfast.c). */
#define PYVMM_FAST_MAX_POLL 66

/* What poll needs of a shmstream region (iothread.h). */
struct pyvmm_shm_poll;
/* An IO thread whose Solo5 ring this loop serves at a kick (iothread.h). */
struct iothread;

struct pyvmm_fastpath {
    const struct pyvmm_guestmem *mem;   /* GuestMemory.view */
    const struct pyvmm_shm_poll *shm;   /* the shmstream region, or NULL */
    /* The IO thread whose Solo5 ring a kick's exit is served for
     * (io_solo5_kick), or NULL: its kicks are KVM's ioeventfd. */
    struct iothread *ring_io;
    /* By manifest handle (< MFT_MAX_ENTRIES): the tap fd of a net device
     * (-1: none), its largest frame. */
    int32_t net_fd[64];
    uint32_t max_frame[64];
    /* By manifest handle: the backing file of a block device (-1: none),
     * its size in bytes and block size (a power of two). */
    int32_t blk_fd[64];
    uint64_t blk_capacity[64];
    uint32_t blk_block_size[64];
    /* What poll waits on: the stop eventfd first, the shmstream wake
     * eventfd next if there is a region (handle -1 both), then taps. */
    uint32_t n_poll;
    int32_t poll_fd[66];
    int32_t poll_handle[66];
    /* Counters: hypercalls answered here (each one a VM exit that reached
     * pyvmm's process but not Python; `answered` counts the Solo5 ring's
     * kicks served here too, which its own counters name), and frames
     * dropped the way TapBackend drops them. */
    uint64_t answered;           /* all of them */
    uint64_t walltimes;
    uint64_t net_reads;
    uint64_t net_reads_again;
    uint64_t net_writes;
    uint64_t polls;
    uint64_t block_reads;
    uint64_t block_writes;
    uint64_t rx_dropped;
    uint64_t tx_dropped;
    /* Poll's state: the last wait blocked POLL_IDLE_NS or longer. */
    uint32_t poll_idle;
};

/*
 * KVM_RUN until an exit this fast path does not answer, then decode it into
 * *exit for Python.  Returns like pyvmm_vcpu_run: 0, or -errno (-EINTR when
 * a signal is pending, also right after an answered hypercall when a stop
 * signal arrived meanwhile).  Runs with the GIL released.
 */
int pyvmm_vcpu_run_fast(int vcpu_fd, void *kvm_run, struct pyvmm_exit *exit,
                        struct pyvmm_fastpath *fp);

#endif
