/*
 * shmstream: pyvmm's shared-memory ring network device, layout version 1.
 *
 * The one definition of the guest/host ring layout: the host (cffi reads
 * this file's declarations; the IO thread includes it) and the guests'
 * driver include it.  Same rules as hvt_abi.h (plain types, integer
 * #defines only).  The ring operations shared by both sides are in
 * shmstream_ring.h.
 *
 * Region (at the top of guest memory, outside boot_info.mem_size):
 *
 *   struct shm_region          header, one 4 KiB page
 *   per net device i (in manifest order of the shm devices):
 *     struct shm_ring rx       host produces, guest consumes
 *     struct shm_ring tx       guest produces, host consumes
 *
 * Each ring is a header of three cache lines followed by `slots` fixed-size
 * slots.  Indices are free-running uint32_t counters; slot = index & (slots
 * - 1).  A side only ever writes its own cache line: the producer line
 * holds `prod`, the consumer line holds `cons` and `cons_sleeping`, so the
 * two never share a line.  Notification suppression:
 *   - a consumer about to sleep sets cons_sleeping = 1, issues a full
 *     barrier and re-checks prod before sleeping;
 *   - a producer, after publishing prod, issues a full barrier and notifies
 *     only if cons_sleeping is set.
 * RX (host -> guest): the notification wakes the vCPU blocked in the poll
 * hypercall.  TX (guest -> host): the notification is a 4-byte write to
 * SHM_KICK_PIO, absorbed by a KVM ioeventfd that wakes the IO thread.
 *
 * The host never trusts anything in the region: it keeps its own copy of
 * the indices it owns, validates the guest's index and every length before
 * use, and never re-reads this header after set-up.
 */
#ifndef PYVMM_SHMSTREAM_H
#define PYVMM_SHMSTREAM_H

#include <stdint.h>

#define SHM_MAGIC 0x314d4853
#define SHM_VERSION 1

/* x86_64 kick port (4-byte outl of any value); aarch64: MMIO store. */
#define SHM_KICK_PIO 0x610
#define SHM_KICK_MMIO 0x100000200

#define SHM_CACHE_LINE 64
#define SHM_SLOT_SIZE 2048
#define SHM_SLOT_HEADER 8
#define SHM_SLOT_DATA 2040
/* The most slots per ring pyvmm offers (--shm-slots; a power of two). */
#define SHM_MAX_SLOTS 32768
#define SHM_MAX_DEVICES 16
#define SHM_REGION_HEADER_SIZE 4096

struct shm_slot {
    uint32_t len;          /* frame length in bytes, <= SHM_SLOT_DATA */
    uint32_t reserved;
    uint8_t data[2040];
};

struct shm_ring {
    /* cache line 0: written by the producer only */
    uint32_t prod;
    uint32_t prod_pad[15];
    /* cache line 1: written by the consumer only */
    uint32_t cons;
    uint32_t cons_sleeping;
    uint32_t cons_pad[14];
    /* cache line 2: set by the host at start, read-only afterwards */
    uint32_t slots;        /* power of two */
    uint32_t slot_size;    /* SHM_SLOT_SIZE */
    uint32_t info_pad[14];
    struct shm_slot slot[];
};

struct shm_device {
    uint32_t handle;       /* manifest index of the net device */
    uint32_t reserved;
    uint64_t rx;           /* GPA of its RX struct shm_ring */
    uint64_t tx;           /* GPA of its TX struct shm_ring */
};

/* The region header, at pyvmm_boot_ext.shm_region (see pyvmm_abi.h). */
struct shm_region {
    uint32_t magic;        /* SHM_MAGIC, "SHM1" */
    uint32_t version;      /* SHM_VERSION */
    uint32_t ndevices;
    uint32_t slots;        /* per ring */
    uint64_t size;         /* whole region, bytes */
    struct shm_device dev[16];
};

#endif /* PYVMM_SHMSTREAM_H */
