/* x86_64's part of the data plane (arch.h): port-I/O hypercalls. */
#include <linux/kvm.h>

#include "arch.h"
#include "hctransport.h"

unsigned pyvmm_arch_hypercall(const struct pyvmm_exit *exit, uint64_t *gpa)
{
    uint32_t n;

    if (exit->reason != KVM_EXIT_IO || exit->io_direction != KVM_EXIT_IO_OUT)
        return 0;
    n = pyvmm_hypercall_pio(exit->io_size, exit->io_count, exit->io_port);
    if (n)
        *gpa = exit->io_value;
    return n;
}

uint32_t pyvmm_arch_doorbell(const struct pyvmm_exit *exit)
{
    if (exit->reason != KVM_EXIT_IO || exit->io_direction != KVM_EXIT_IO_OUT)
        return 0;
    return pyvmm_doorbell_pio(exit->io_size, exit->io_count, exit->io_port);
}

void pyvmm_arch_decode_exit(const struct kvm_run *run, struct pyvmm_exit *exit)
{
    /* A debug exit (KVM_SET_GUEST_DEBUG: a single step or a hardware
     * breakpoint): the exception and where, for the GDB stub. */
    if (run->exit_reason == KVM_EXIT_DEBUG) {
        exit->debug_exception = run->debug.arch.exception;
        exit->debug_pc = run->debug.arch.pc;
        exit->debug_dr6 = run->debug.arch.dr6;
        exit->debug_dr7 = run->debug.arch.dr7;
    }
}
