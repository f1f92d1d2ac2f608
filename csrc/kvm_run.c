/* See kvm_run.h: KVM_RUN and the decoding of the exit it returns. */
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/kvm.h>

#include "arch.h"
#include "kvm_run.h"

static uint64_t load_le(const uint8_t *p, uint32_t len)
{
    uint64_t v = 0;
    if (len > 8)
        len = 8;
    memcpy(&v, p, len);
    return v;
}

int pyvmm_vcpu_run(int vcpu_fd, void *kvm_run, struct pyvmm_exit *exit)
{
    struct kvm_run *run = kvm_run;

    memset(exit, 0, sizeof(*exit));
    if (ioctl(vcpu_fd, KVM_RUN, 0) < 0) {
        int err = errno;
        /*
         * Newer kernels describe an -EFAULT (e.g. a guest write to memory
         * the host mapped read-only) as a memory fault exit; the headers
         * this builds against may predate it, hence the literal layout:
         * flags, gpa, size at the start of the exit union.
         */
        if (err == EFAULT && run->exit_reason == PYVMM_EXIT_MEMORY_FAULT) {
            const uint64_t *mf = (const uint64_t *)&run->hw;
            exit->reason = PYVMM_EXIT_MEMORY_FAULT;
            exit->fault_flags = mf[0];
            exit->fault_gpa = mf[1];
        }
        return -err;
    }
    exit->reason = run->exit_reason;
    switch (run->exit_reason) {
    case KVM_EXIT_IO:
        exit->io_direction = run->io.direction;
        exit->io_size = run->io.size;
        exit->io_port = run->io.port;
        exit->io_count = run->io.count;
        if (run->io.size <= 8)
            exit->io_value = load_le((uint8_t *)run + run->io.data_offset,
                                     run->io.size);
        break;
    case KVM_EXIT_MMIO:
        exit->mmio_addr = run->mmio.phys_addr;
        exit->mmio_len = run->mmio.len;
        exit->mmio_is_write = run->mmio.is_write;
        if (run->mmio.is_write)
            exit->mmio_value = load_le(run->mmio.data, run->mmio.len);
        break;
    case KVM_EXIT_INTERNAL_ERROR:
        exit->suberror = run->internal.suberror;
        break;
    case KVM_EXIT_FAIL_ENTRY:
        exit->hw_reason = run->fail_entry.hardware_entry_failure_reason;
        break;
    case KVM_EXIT_UNKNOWN:
        exit->hw_reason = run->hw.hardware_exit_reason;
        break;
    default:
        pyvmm_arch_decode_exit(run, exit);
        break;
    }
    return 0;
}
