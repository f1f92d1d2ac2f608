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

#endif /* PYVMM_ABI_H */
