/* See guestmap.h: mapping, protecting and dropping guest memory's pages. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/types.h>

#include "guestmap.h"

int64_t pyvmm_map_anonymous(uint64_t size)
{
    /* No PROT_EXEC: only segments the ELF marks executable get it. */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    return (int64_t)(uintptr_t)p;
}

int pyvmm_protect(uint64_t addr, uint64_t size, int prot)
{
    int p = 0;
    if (prot & PYVMM_PROT_READ)
        p |= PROT_READ;
    if (prot & PYVMM_PROT_WRITE)
        p |= PROT_WRITE;
    if (prot & PYVMM_PROT_EXEC)
        p |= PROT_EXEC;
    return mprotect((void *)(uintptr_t)addr, size, p) < 0 ? -errno : 0;
}

int pyvmm_map_file(uint64_t addr, uint64_t size, int fd, uint64_t offset)
{
    /* MAP_FIXED replaces part of pyvmm's own guest mapping (the caller
     * checked the range); the pages stay those of the page cache, shared
     * with every other process mapping the file, until someone writes one.
     * Same rights as the anonymous mapping: protections come later. */
    void *want = (void *)(uintptr_t)addr;
    int err;

    if (mmap(want, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd,
             (off_t)offset) != MAP_FAILED)
        return 0;
    err = -errno;
    /* A failed MAP_FIXED may have unmapped the range: never leave a hole. */
    if (mmap(want, size, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
        return PYVMM_MAP_LOST;
    return err;
}

int pyvmm_discard(uint64_t addr, uint64_t size)
{
    return madvise((void *)(uintptr_t)addr, size, MADV_DONTNEED) < 0 ? -errno : 0;
}

int pyvmm_unmap(uint64_t addr, uint64_t size)
{
    return munmap((void *)(uintptr_t)addr, size) < 0 ? -errno : 0;
}
