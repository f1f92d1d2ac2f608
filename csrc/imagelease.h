/*
 * Image files this process maps, held still by a read lease.
 *
 * A page of a private file mapping that nobody wrote is the page cache's:
 * a write into the file shows in it, and a truncation takes it away (and,
 * Linux being POSIX here, every private copy made of it too), so a guest
 * whose text is mapped from its image would see its text change, or fault.
 * pyvmm maps an image only under a read lease (fcntl F_SETLEASE F_RDLCK),
 * which cannot be taken while anyone has the file open for writing; and
 * when someone later opens it for writing or truncates it, the kernel
 * holds that writer back (up to /proc/sys/fs/lease-break-time) and tells
 * the holder. The holder here then copies every range it mapped from the
 * file into anonymous memory (a new mapping moved over the old one with
 * mremap: one step, the guest sees the same bytes before and after), and
 * only then releases the lease, so the writer goes on only once nothing
 * here depends on the file.
 *
 * Only read-only ranges are mapped (text, read-only data, the loader's
 * view of the file): nobody writes them meanwhile, so a copy taken
 * while the guest runs loses nothing and needs no pause.
 *
 * The notice is a signal (PYVMM_LEASE_SIGNAL, or SIGIO when the kernel's
 * queue of real-time signals is full), taken by whichever thread of the
 * process does not block it; the copying happens in its handler, with
 * system calls the sandbox allows (mmap without PROT_EXEC, mprotect to
 * PROT_READ, mremap, munmap, close). A copy of text is thus no longer
 * executable on the host: KVM runs guest code whatever the host mapping
 * says (docs/architecture.md), the guest's own page tables still say what
 * it may execute.
 *
 * Read by cffi: plain types, integer-literal #defines only.
 */
#ifndef PYVMM_IMAGELEASE_H
#define PYVMM_IMAGELEASE_H

#include <stdint.h>

/* Leases one process holds at once, and the mapped ranges under them. */
#define PYVMM_LEASE_MAX 64
#define PYVMM_LEASE_RANGES 4096

/* pyvmm_lease_state(): no writer came; a writer came, every range was
 * copied, then it was let through; a writer came and a range could not
 * be copied (already gone, no memory); released by pyvmm (or no slot). */
#define PYVMM_LEASE_HELD 0
#define PYVMM_LEASE_COPIED 1
#define PYVMM_LEASE_LOST 2
#define PYVMM_LEASE_CLOSED 3

/* A mapping's answer when the lease broke before it was made (ESTALE). */
#define PYVMM_LEASE_BROKEN 116

struct pyvmm_lease_counters {
    uint64_t breaks;          /* notices taken */
    uint64_t ranges_copied;
    uint64_t bytes_copied;
    uint64_t ranges_lost;     /* could not be copied (already gone, no memory) */
};

/* Take a read lease on ``fd`` (a descriptor of its own, opened read-only,
 * that nothing maps: closing it must end the lease). The slot, or -errno:
 * EAGAIN (someone has the file open for writing), EACCES (neither its
 * owner nor CAP_LEASE), EINVAL (a file system without leases), ENOSPC.
 * The slot owns ``fd`` from then on; on failure the caller still does. */
int pyvmm_lease_take(int fd);

/* The whole file (``len`` bytes of ``fd``) mapped read-only and private
 * anywhere, under lease ``slot`` (the loader's view of it): the address,
 * -PYVMM_LEASE_BROKEN when a writer came first (nothing mapped), or
 * another -errno. */
int64_t pyvmm_lease_map_view(int slot, uint64_t len, int fd);

/* ``len`` bytes of ``fd`` at ``offset`` over guest memory at ``addr``
 * under lease ``slot``: pyvmm_map_file's answers (0, -errno with the
 * range anonymous again, PYVMM_MAP_LOST), or -PYVMM_LEASE_BROKEN when a
 * writer came first (nothing mapped). */
int pyvmm_lease_map_fixed(int slot, uint64_t addr, uint64_t len, int fd, uint64_t offset);

/* Stop watching the ranges inside [addr, addr + len): before unmapping. */
void pyvmm_lease_forget(uint64_t addr, uint64_t len);

/* End lease ``slot`` without copying (its ranges are forgotten). */
void pyvmm_lease_release(int slot);

int pyvmm_lease_state(int slot);
const struct pyvmm_lease_counters *pyvmm_lease_counters(void);

/* statfs(2)'s f_type of the file system holding ``fd``, or 0. */
uint64_t pyvmm_fs_magic(int fd);

#endif
