/*
 * Small helpers for C code that spins and measures time (the IO thread's
 * poll and hybrid modes, the walltime hypercall).  Not read by cffi.
 */
#ifndef PYVMM_SPIN_H
#define PYVMM_SPIN_H

#include <stdint.h>
#include <time.h>

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* clock_gettime(clock) in nanoseconds. */
static inline uint64_t clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
