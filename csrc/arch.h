/*
 * The per-architecture part of the data plane: csrc/arch_<machine>.c, one
 * of them compiled into the extension (csrc/build_native.py picks it by
 * the machine it builds on).  Not read by cffi: only native.c and
 * hcfast.c use it.
 *
 *   x86_64   hypercall = 4-byte `outl` of the argument's GPA to port
 *            HVT_HYPERCALL_PIO_BASE + n (a KVM_EXIT_IO)
 *   aarch64  hypercall = 32-bit store of the argument's GPA to
 *            HVT_HYPERCALL_MMIO_BASE + (n << 3) (a KVM_EXIT_MMIO)
 */
#ifndef PYVMM_ARCH_H
#define PYVMM_ARCH_H

#include <stdint.h>

#include "native.h"

struct kvm_run;

/*
 * The hvt hypercall this exit carries: its number (1..HVT_HYPERCALL_MAX),
 * the GPA of its argument struct in *gpa; 0 when the exit is not one.
 * hcfast.c answers by it, and Python's Arch.hypercall() agrees with it.
 */
unsigned pyvmm_arch_hypercall(const struct pyvmm_exit *exit, uint64_t *gpa);

/*
 * Exit reasons only this architecture has, decoded into *exit (native.c
 * calls it for every reason its common decoding does not know).
 */
void pyvmm_arch_decode_exit(const struct kvm_run *run, struct pyvmm_exit *exit);

#if defined(__aarch64__)
/* CNTFRQ_EL0, the generic timer's frequency (the guest reads the same). */
uint64_t pyvmm_arm64_cntfrq(void);
#endif

#endif
