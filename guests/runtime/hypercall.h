/*
 * The hvt hypercall instruction.  x86_64: outl of the 32-bit GPA of the
 * argument struct to port HVT_HYPERCALL_PIO_BASE + n; aarch64: a 32-bit
 * store of it to HVT_HYPERCALL_MMIO_BASE + (n << 3).  Guest memory is
 * identity mapped and at most 4 GiB, so a pointer is its own GPA and fits.
 * "memory" because the tender reads and writes *arg behind the compiler's
 * back.
 */
#ifndef RT_HYPERCALL_H
#define RT_HYPERCALL_H

#include <stdint.h>
#include "hvt_abi.h"

#if defined(__aarch64__)
/* aarch64: a 32-bit store (str w) of the GPA to HVT_HYPERCALL_MMIO_BASE +
 * (n << 3), in the MMIO window above RAM (device memory). */
static inline void hvt_hypercall(enum hvt_hypercall n, volatile void *arg)
{
    volatile uint32_t *at =
        (volatile uint32_t *)(uintptr_t)(HVT_HYPERCALL_MMIO_BASE + ((uint64_t)n << 3));
    __asm__ __volatile__("str %w0, [%1]"
                         :
                         : "r"((uint32_t)(uintptr_t)arg), "r"(at)
                         : "memory");
}

/* A 32-bit store to a doorbell in the MMIO window (KVM ioeventfd). */
static inline void rt_mmio_kick(uint64_t addr, uint32_t value)
{
    __asm__ __volatile__("str %w0, [%1]"
                         :
                         : "r"(value), "r"((volatile uint32_t *)(uintptr_t)addr)
                         : "memory");
}
#else
static inline void hvt_hypercall(enum hvt_hypercall n, volatile void *arg)
{
    __asm__ __volatile__("outl %0, %1"
                         :
                         : "a"((uint32_t)(uintptr_t)arg),
                           "d"((uint16_t)(HVT_HYPERCALL_PIO_BASE + n))
                         : "memory");
}
#endif

#endif
