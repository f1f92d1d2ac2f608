/*
 * The per-architecture part of the data plane: csrc/arch_<machine>.c, one
 * of them compiled into the extension (csrc/build_native.py picks it by
 * the machine it builds on).  Not read by cffi: only kvm_run.c and
 * hcfast.c use it.
 *
 *   x86_64   hypercall = a KVM_EXIT_IO, the port write hctransport.h decodes
 *   aarch64  hypercall = a KVM_EXIT_MMIO, the store hctransport.h decodes
 */
#ifndef PYVMM_ARCH_H
#define PYVMM_ARCH_H

#include <stdint.h>

#include "kvm_run.h"

struct kvm_run;

/*
 * The hvt hypercall this exit carries: its number (1..HVT_HYPERCALL_MAX),
 * the GPA of its argument struct in *gpa; 0 when the exit is not one.
 * hcfast.c answers by it; the transport's decode is hctransport.h's, which
 * Python's Arch.hypercall() calls too.
 */
unsigned pyvmm_arch_hypercall(const struct pyvmm_exit *exit, uint64_t *gpa);

/* The doorbell this exit rings (hctransport.h's pyvmm_doorbell_*), or 0. */
uint32_t pyvmm_arch_doorbell(const struct pyvmm_exit *exit);

/*
 * Exit reasons only this architecture has, decoded into *exit (kvm_run.c
 * calls it for every reason its common decoding does not know).
 */
void pyvmm_arch_decode_exit(const struct kvm_run *run, struct pyvmm_exit *exit);

#if defined(__aarch64__)
/* CNTFRQ_EL0, the generic timer's frequency (the guest reads the same). */
uint64_t pyvmm_arm64_cntfrq(void);
#endif

#endif
