/*
 * The Solo5 "hvt" ABI (version 2) as pyvmm implements it: the one place
 * where its binary layout is written down.  The host (through cffi, which
 * reads this file's declarations) and the guests in guests/ (through the C
 * compiler) both include it, so a layout can never drift between the two.
 *
 * Rules that keep this file readable by cffi's cdef parser:
 *   - only fixed-width integer types, plain structs, unions and enums;
 *   - #define only with a plain integer literal as value;
 *   - every other preprocessor line (guards, includes) is skipped by cffi.
 * Guest pointers are carried as uint64_t guest-physical addresses.
 */
#ifndef PYVMM_HVT_ABI_H
#define PYVMM_HVT_ABI_H

#include <stdint.h>

/* The ABI note: target 1 (hvt), version 2. */
#define HVT_ABI_TARGET 1
#define HVT_ABI_VERSION 2

/* ELF notes: name "Solo5", types "ABI1" and "MFT1" read as little-endian. */
#define SOLO5_NOTE_ABI 0x31494241
#define SOLO5_NOTE_MANIFEST 0x3154464d

/* Guest memory layout (x86_64 and aarch64). */
#define HVT_GUEST_MIN_BASE 0x100000
#define HVT_BOOT_INFO_BASE 0x10000
#define HVT_CMDLINE_SIZE 8192

/* x86_64: outl(GPA of argument struct) to port HVT_HYPERCALL_PIO_BASE + n. */
#define HVT_HYPERCALL_PIO_BASE 0x500
/* aarch64: 32-bit store of the GPA to HVT_HYPERCALL_MMIO_BASE + (n << 3). */
#define HVT_HYPERCALL_MMIO_BASE 0x100000000

enum hvt_hypercall {
    HVT_HYPERCALL_WALLTIME = 1,
    HVT_HYPERCALL_PUTS = 2,
    HVT_HYPERCALL_POLL = 3,
    HVT_HYPERCALL_BLOCK_WRITE = 4,
    HVT_HYPERCALL_BLOCK_READ = 5,
    HVT_HYPERCALL_NET_WRITE = 6,
    HVT_HYPERCALL_NET_READ = 7,
    HVT_HYPERCALL_HALT = 8
};
#define HVT_HYPERCALL_MAX 8
/*
 * Reserved for pyvmm's own tests (testkit/devkind: a test-only device
 * kind), outside Solo5's 1..HVT_HYPERCALL_MAX: no Solo5 guest makes it,
 * and pyvmm answers it only in a test process that registered that kind;
 * anywhere else the write is a stray port access (csrc/hctransport.h).
 */
#define HVT_HYPERCALL_PYVMM_TEST 15

/* The Ethernet header: a net device's largest frame is its MTU plus this
 * (net_write refuses longer ones, and shorter than this is no frame). */
#define HVT_ETH_HLEN 14

/* Results in the ret fields. */
enum hvt_result {
    HVT_RET_OK = 0,
    HVT_RET_AGAIN = 1,
    HVT_RET_EINVAL = 2,
    HVT_RET_EUNSPEC = 3
};

/* Solo5 ring I/O extension (v0.11+): host_features bit, kick port. */
#define HVT_FEATURE_RING_IO 1
#define HVT_RING_KICK_PIO 0x600
/* aarch64: a 32-bit store to this address. */
#define HVT_RING_KICK_MMIO 0x100000100

struct hvt_boot_info {
    uint64_t mem_size;       /* usable memory, excluding reserved areas */
    uint64_t kernel_end;     /* highest address loaded from the ELF */
    uint64_t cpu_cycle_freq; /* TSC (x86_64) or generic timer Hz */
    uint64_t cmdline;        /* GPA of a NUL-terminated string */
    uint64_t mft;            /* GPA of the filled-in manifest copy */
    uint32_t host_features;
    uint32_t guest_features;
    uint64_t net_ring;
};

struct hvt_hc_walltime {
    uint64_t nsecs;
};

struct hvt_hc_puts {
    uint64_t data;
    uint64_t len;
};

struct hvt_hc_poll {
    uint64_t timeout_nsecs;
    uint64_t ready_set;
    int32_t ret;
};

struct hvt_hc_block_write {
    uint64_t handle;
    uint64_t offset;
    uint64_t data;
    uint64_t len;
    int32_t ret;
};

struct hvt_hc_block_read {
    uint64_t handle;
    uint64_t offset;
    uint64_t data;
    uint64_t len;
    int32_t ret;
};

struct hvt_hc_net_write {
    uint64_t handle;
    uint64_t data;
    uint64_t len;
    int32_t ret;
};

struct hvt_hc_net_read {
    uint64_t handle;
    uint64_t data;
    uint64_t len;
    int32_t ret;
};

/* The abort cookie: GPA of up to HVT_HALT_COOKIE_MAX bytes, or 0. */
#define HVT_HALT_COOKIE_MAX 512

struct hvt_hc_halt {
    uint64_t cookie;
    int32_t exit_status;
};

/* HVT_HYPERCALL_PYVMM_TEST (tests only): the IO thread's answer to value. */
struct hvt_hc_pyvmm_test {
    /* IN */
    uint64_t handle;
    uint64_t value;
    /* OUT */
    uint64_t answer;
    int32_t ret;
};

/* The application manifest (MFT1 note descriptor). */
#define MFT_VERSION 1
#define MFT_MAX_ENTRIES 64
#define MFT_NAME_SIZE 68
#define MFT_NAME_MAX 67

enum mft_type {
    MFT_DEV_BLOCK_BASIC = 1,
    MFT_DEV_NET_BASIC = 2,
    /* Reserved for pyvmm's tests (the test-only device kind, testkit/devkind). */
    MFT_DEV_PYVMM_TEST = 1073741808,
    MFT_RESERVED_FIRST = 1073741824
};

struct mft_block_basic {
    uint64_t capacity;
    uint16_t block_size;
};

struct mft_net_basic {
    uint8_t mac[6];
    uint16_t mtu;
};

struct mft_entry {
    char name[68];
    uint32_t type;
    union {
        struct mft_block_basic block_basic;
        struct mft_net_basic net_basic;
    } u;
    uint64_t b;            /* host-private (fd or pointer), zeroed for the guest */
    uint8_t attached;      /* C bool */
};

struct mft {
    uint32_t version;
    uint32_t entries;
    struct mft_entry e[];
};

#endif /* PYVMM_HVT_ABI_H */
