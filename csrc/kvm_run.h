/*
 * One KVM_RUN and the exit it ends with, decoded in C so that Python never
 * needs kvm_run's unions or offsets.  Read by cffi (plain types,
 * integer-literal #defines only), so Python sees exactly what C compiles.
 */
#ifndef PYVMM_KVM_RUN_H
#define PYVMM_KVM_RUN_H

#include <stdint.h>

/* One VM exit.  Fields not used by a reason are 0. */
struct pyvmm_exit {
    uint32_t reason;          /* KVM_EXIT_* */
    uint32_t io_direction;    /* KVM_EXIT_IO_IN / _OUT */
    uint32_t io_size;         /* 1, 2 or 4 */
    uint32_t io_port;
    uint32_t io_count;
    uint32_t mmio_len;
    uint32_t mmio_is_write;
    uint32_t suberror;        /* KVM_EXIT_INTERNAL_ERROR */
    uint64_t io_value;        /* first element of an OUT, zero-extended */
    uint64_t mmio_addr;
    uint64_t mmio_value;      /* MMIO write data, zero-extended */
    uint64_t hw_reason;       /* KVM_EXIT_FAIL_ENTRY / UNKNOWN */
    uint64_t fault_gpa;       /* KVM_EXIT_MEMORY_FAULT */
    uint64_t fault_flags;
    uint64_t debug_pc;        /* KVM_EXIT_DEBUG (x86_64: arch.debug) */
    uint64_t debug_dr6;
    uint64_t debug_dr7;
    uint32_t debug_exception; /* 1 (#DB) or 3 (#BP) */
    uint32_t debug_hsr;       /* arm64: ESR_EL2[31:0], the exception class in 31:26 */
    uint64_t debug_far;       /* arm64: the address a watchpoint caught */
};

/* KVM_EXIT_MEMORY_FAULT (Linux 6.8+), defined here for older headers. */
#define PYVMM_EXIT_MEMORY_FAULT 39

/*
 * KVM_RUN once and decode the exit.  Returns 0, or -errno when the ioctl
 * failed (-EINTR when a signal arrived: the caller checks for it).  Called
 * with the GIL released, like every cffi call.
 */
int pyvmm_vcpu_run(int vcpu_fd, void *kvm_run, struct pyvmm_exit *exit);

#endif
