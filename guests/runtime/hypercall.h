/*
 * The hvt hypercall instruction (x86_64): outl of the 32-bit GPA of the
 * argument struct to port HVT_HYPERCALL_PIO_BASE + n.  Guest memory is
 * identity mapped and at most 4 GiB, so a pointer is its own GPA and fits.
 * "memory" because the tender reads and writes *arg behind the compiler's
 * back.
 */
#ifndef RT_HYPERCALL_H
#define RT_HYPERCALL_H

#include <stdint.h>
#include "hvt_abi.h"

static inline void hvt_hypercall(enum hvt_hypercall n, volatile void *arg)
{
    __asm__ __volatile__("outl %0, %1"
                         :
                         : "a"((uint32_t)(uintptr_t)arg),
                           "d"((uint16_t)(HVT_HYPERCALL_PIO_BASE + n))
                         : "memory");
}

#endif
