/*
 * One view of guest memory for every piece of C that touches it on a
 * guest's behalf (the hypercall fast path, the IO thread's Solo5-ring
 * service) and for Python's GuestMemory, which builds the view (it owns
 * the mapping) and checks every guest address through the same accessor.
 *
 * The rule, written once (guestmem.c):
 *   - every access: [gpa, gpa + len) lies inside guest memory;
 *   - a write on the guest's behalf (PYVMM_GM_WRITE: a hypercall result,
 *     a frame read into a guest buffer): also nowhere in the low area
 *     [0, low_end) (boot info, command line, manifest copy, GDT, page
 *     tables, TSS: the guest could rewrite its own page tables through the
 *     host) and nowhere in a read-only range (the ELF's text and rodata,
 *     mapped read-only on the host too);
 *   - the host's own set-up write (PYVMM_GM_SETUP: page tables, boot
 *     info, segments, at addresses pyvmm chose): nowhere in a read-only
 *     range (the host mapping is read-only there: the write would kill
 *     pyvmm), but the low area is the host's to fill;
 *   - reads (PYVMM_GM_READ: a frame to send, a string to print) may come
 *     from anywhere in guest memory, the low area included: the guest can
 *     read it anyway.
 * An empty range is checked against the bounds only.
 *
 * Guest memory may be mapped from a file: an image's read-only pages
 * (loader/sharing.py, imagelease.h), a restored snapshot's whole memory.
 * Such a page can be gone (the file truncated: an image's after its lease
 * broke and the page could not be copied first), and a CPU load or store
 * on it raises SIGBUS. So host code that touches guest memory directly
 * does so under a guard (guard.h): pyvmm_copy_guarded and
 * pyvmm_guestmem_read for single copies (Python's GuestMemory), one guard
 * around each answer of the hypercall fast path (hcfast.c); guest bytes
 * handed to a system call need none (it answers EFAULT instead). The IO
 * thread's ring accesses are not guarded: its rings lie in anonymous
 * memory at the top of guest memory, and a restored snapshot has no net
 * device today.
 *
 * Read by cffi: plain types, integer-literal #defines only.
 */
#ifndef PYVMM_GUESTMEM_H
#define PYVMM_GUESTMEM_H

#include <stdint.h>

/* End of the low area (hvt's boot info and pyvmm's tables): the guest
 * image starts here (HVT_GUEST_MIN_BASE). */
#define PYVMM_LOW_AREA_END 0x100000

#define PYVMM_GM_READ 0
#define PYVMM_GM_WRITE 1
#define PYVMM_GM_SETUP 2

struct pyvmm_guestmem {
    uint64_t host;          /* host address of GPA 0; 0 once unmapped */
    uint64_t size;          /* bytes of guest memory */
    uint64_t low_end;       /* writes on the guest's behalf refused below */
    /* Sorted, non-overlapping [ro[2i], ro[2i+1]) GPA ranges mapped
     * read-only (never written by the host); owned by GuestMemory. */
    uint64_t n_ro;
    const uint64_t *ro;
};

/* The host address of [gpa, gpa + len) for access PYVMM_GM_*, or NULL
 * when the rule above refuses it. */
void *pyvmm_guestmem_at(const struct pyvmm_guestmem *m, uint64_t gpa, uint64_t len,
                        int access);

/* Copy ``len`` bytes from ``src`` to ``dst`` where a page of either may
 * be gone: 0, or -EFAULT when one was (the SIGBUS it raised is taken
 * here; one outside the two ranges, or outside such a copy, still ends
 * the process as it would have). About 12 ns beside memcpy (guard.h). */
int pyvmm_copy_guarded(void *dst, const void *src, uint64_t len);

/* 1 while a guard is in force on the calling thread, else 0: outside a
 * guarded stretch it is 0, or a SIGBUS there would jump back into a
 * finished one (tests/unit/test_kills_hcfast.py checks it after a run). */
int pyvmm_guard_in_force(void);

/* [gpa, gpa + len) of guest memory into ``dst`` (a PYVMM_GM_READ): 0,
 * -EINVAL when the accessor refuses the range, -EFAULT when a page of it
 * is gone. */
int pyvmm_guestmem_read(const struct pyvmm_guestmem *m, void *dst, uint64_t gpa,
                        uint64_t len);

#endif
