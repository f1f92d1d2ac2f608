/*
 * Solo5's own ring I/O extension (Solo5 v0.11+, hvt on Linux), which
 * pyvmm's IO thread serves so that unmodified ring-capable Solo5
 * unikernels get it too.  Layout from docs/abi.md ("Solo5 ring I/O"); cffi
 * reads these declarations (same rules as hvt_abi.h).
 *
 * One ring at the top of guest memory (boot_info.net_ring, host_features
 * HVT_FEATURE_RING_IO); guest kicks with a 4-byte write of the ring id to
 * HVT_RING_KICK_PIO.  Indices are free-running uint32_t counters, slot =
 * index % SOLO5_RING_ENTRIES.
 */
#ifndef PYVMM_SOLO5_RING_H
#define PYVMM_SOLO5_RING_H

#include <stdint.h>

#define SOLO5_RING_ENTRIES 1024
#define SOLO5_RING_OP_WRITE 1
#define SOLO5_RING_OP_READ 2

struct solo5_ring_entry {
    uint32_t operation;
    uint32_t handle;
    uint64_t data;         /* GPA of the frame buffer */
    uint32_t len;
    uint32_t id;
    uint64_t reserved;
};

struct solo5_ring_commit {
    uint32_t id;
    int32_t ret;
    uint32_t len;
    uint32_t reserved;
};

struct solo5_ring {
    /* cache line 0: written by the guest only */
    uint32_t ent_tail;
    uint32_t com_head;
    uint32_t guest_pad[14];
    /* cache line 1: written by the host only */
    uint32_t ent_head;
    uint32_t com_tail;
    uint32_t needs_kick;
    uint32_t host_pad[13];
    struct solo5_ring_entry ent[1024];
    struct solo5_ring_commit com[1024];
};

#endif /* PYVMM_SOLO5_RING_H */
