/*
 * The host mapping behind guest memory: mmap, mprotect, madvise, munmap.
 * Read by cffi.  Each returns 0 (or the address) or -errno.
 */
#ifndef PYVMM_GUESTMAP_H
#define PYVMM_GUESTMAP_H

#include <stdint.h>

int64_t pyvmm_map_anonymous(uint64_t size);
int pyvmm_protect(uint64_t addr, uint64_t size, int prot);
/* Map [offset, offset + size) of fd privately (copy-on-write) over the
 * guest memory at addr: 0, or -errno with the range anonymous (zero)
 * memory again, or PYVMM_MAP_LOST when even that failed (a hole). */
int pyvmm_map_file(uint64_t addr, uint64_t size, int fd, uint64_t offset);
#define PYVMM_MAP_LOST 1
/* Drop the anonymous pages at [addr, addr + size): they read as zero again
 * without being resident. */
int pyvmm_discard(uint64_t addr, uint64_t size);
int pyvmm_unmap(uint64_t addr, uint64_t size);

/* pyvmm_protect's prot: pyvmm's own bits, not the host's PROT_*. */
#define PYVMM_PROT_READ 1
#define PYVMM_PROT_WRITE 2
#define PYVMM_PROT_EXEC 4

#endif
