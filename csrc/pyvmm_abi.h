/*
 * pyvmm's own additions to the hvt ABI, shared by host (cffi) and guests.
 * Same rules as hvt_abi.h.  A guest carrying these still runs on a stock
 * solo5-hvt, which ignores notes it does not know.
 */
#ifndef PYVMM_ABI_H
#define PYVMM_ABI_H

#include <stdint.h>

/*
 * The capability note: owner "pyvmm" (namesz 6, padded to 8), type "CAP1",
 * descriptor struct pyvmm_caps (4-byte aligned, right after the 20-byte
 * header).  Absent note = no capabilities: the guest is run as solo5-hvt
 * would run it.
 */
#define PYVMM_NOTE_CAPS 0x31504143
#define PYVMM_CAPS_VERSION 1

/* The guest runs correctly at privilege level 3 (user mode). */
#define PYVMM_CAP_USER_MODE 1
/* The guest has a shmstream driver (shmstream.h) and wants the region. */
#define PYVMM_CAP_SHMSTREAM 2

struct pyvmm_caps {
    uint32_t version;
    uint32_t flags;
};

/*
 * The user-mode (CPL 3) boot profile: GDT selectors the vCPU starts with,
 * and where the TSS (with an I/O permission bitmap allowing every port, so
 * hypercall port writes work at CPL 3) lives.  The low area 0x10000-0xfffff
 * stays read-only to the guest.
 */
#define PYVMM_USER_CS 0x23
#define PYVMM_USER_DS 0x1b
#define PYVMM_TSS_BASE 0x1c000

/*
 * boot_info.host_features bit: pyvmm offers its boot extension, a struct
 * pyvmm_boot_ext at PYVMM_BOOT_EXT_GPA (read-only low memory, between the
 * boot info and the manifest copy).  Set only for guests whose CAP1 note
 * asks for something the extension carries; a stock solo5-hvt never sets
 * it, so such a guest falls back to plain hvt there.
 */
#define PYVMM_FEATURE_BOOT_EXT 65536
#define PYVMM_BOOT_EXT_GPA 0x10040
#define PYVMM_BOOT_EXT_MAGIC 0x31585650
/* The extension's layout below; a guest uses it only at this version. */
#define PYVMM_BOOT_EXT_VERSION 1

struct pyvmm_boot_ext {
    uint32_t magic;        /* PYVMM_BOOT_EXT_MAGIC, "PVX1" */
    uint32_t version;      /* PYVMM_BOOT_EXT_VERSION */
    uint64_t shm_region;   /* GPA of struct shm_region, 0 if not offered */
    uint64_t shm_size;     /* bytes, a 2 MiB multiple above mem_size */
    uint32_t shm_mode;     /* host IO thread mode: 1 poll, 2 event, 3 hybrid */
    uint32_t reserved0;
    uint64_t reserved[4];
};

/*
 * A port that KVM absorbs through an ioeventfd (KVM_IOEVENTFD) without
 * exiting to pyvmm: a 4-byte write costs what a shmstream kick costs and
 * does nothing else.  Guests use it to measure that cost (bench/cpl.py).
 */
#define PYVMM_NULL_KICK_PIO 0x6ff
/* aarch64: a 32-bit store to this address. */
#define PYVMM_NULL_KICK_MMIO 0x100000300

#endif /* PYVMM_ABI_H */
