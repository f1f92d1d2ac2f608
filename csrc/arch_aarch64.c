/* aarch64's part of the data plane (arch.h): MMIO hypercalls, the exits
 * only arm64 KVM has, the generic timer's frequency. */
#include <linux/kvm.h>

#include "arch.h"
#include "hctransport.h"

unsigned pyvmm_arch_hypercall(const struct pyvmm_exit *exit, uint64_t *gpa)
{
    uint32_t n;

    if (exit->reason != KVM_EXIT_MMIO)
        return 0;
    n = pyvmm_hypercall_mmio(exit->mmio_is_write, exit->mmio_len, exit->mmio_addr);
    if (n)
        *gpa = exit->mmio_value;
    return n;
}

uint32_t pyvmm_arch_doorbell(const struct pyvmm_exit *exit)
{
    if (exit->reason != KVM_EXIT_MMIO)
        return 0;
    return pyvmm_doorbell_mmio(exit->mmio_is_write, exit->mmio_len, exit->mmio_addr);
}

void pyvmm_arch_decode_exit(const struct kvm_run *run, struct pyvmm_exit *exit)
{
    switch (run->exit_reason) {
    case KVM_EXIT_ARM_NISV:
        /* A data abort KVM could not decode (no valid syndrome): the
         * faulting IPA and what the syndrome has. */
        exit->fault_gpa = run->arm_nisv.fault_ipa;
        exit->hw_reason = run->arm_nisv.esr_iss;
        break;
    case KVM_EXIT_DEBUG:
        /* KVM_SET_GUEST_DEBUG's exit: which debug exception (the syndrome's
         * class: step, breakpoint, brk, watchpoint) and, for a watchpoint,
         * the address the guest accessed, for the GDB stub. */
        exit->debug_hsr = run->debug.arch.hsr;
        exit->debug_far = run->debug.arch.far;
        break;
    case KVM_EXIT_SYSTEM_EVENT:
        /* PSCI SYSTEM_OFF / SYSTEM_RESET from the guest. */
        exit->hw_reason = run->system_event.type;
        break;
    default:
        break;
    }
}

uint64_t pyvmm_arm64_cntfrq(void)
{
    uint64_t freq;

    __asm__ volatile("mrs %0, cntfrq_el0" : "=r"(freq));
    return freq;
}
