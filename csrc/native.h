/*
 * pyvmm's native helpers: the C side of every per-exit and per-packet path.
 * Declarations here are read by cffi (same rules as hvt_abi.h: plain types,
 * integer-literal #defines only), so Python sees exactly what C compiles.
 */
#ifndef PYVMM_NATIVE_H
#define PYVMM_NATIVE_H

#include <stdint.h>

/*
 * One VM exit, decoded from the mapped kvm_run in C so that Python never
 * needs kvm_run's unions or offsets.  Fields not used by a reason are 0.
 */
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
    uint32_t debug_pad;
};

/* KVM_EXIT_MEMORY_FAULT (Linux 6.8+), defined here for older headers. */
#define PYVMM_EXIT_MEMORY_FAULT 39

/* ioctl with an argument pointer or value; returns the result or -errno. */
long pyvmm_ioctl_ptr(int fd, unsigned long request, void *arg);
long pyvmm_ioctl_val(int fd, unsigned long request, unsigned long arg);

/*
 * KVM_RUN once and decode the exit.  Returns 0, or -errno when the ioctl
 * failed (-EINTR when a signal arrived: the caller checks for it).  Called
 * with the GIL released, like every cffi call.
 */
int pyvmm_vcpu_run(int vcpu_fd, void *kvm_run, struct pyvmm_exit *exit);

/*
 * Wait until one of fds (at most 64) is readable or timeout_ns passes
 * (nanosecond resolution, unlike epoll).  *ready gets a bit per readable
 * fd, by index.  Returns how many are readable (0 on timeout) or -errno
 * (-EINTR on a signal).
 */
int pyvmm_wait_readable(const int *fds, int nfds, int64_t timeout_ns, uint64_t *ready);

/* mmap/mprotect/munmap of guest memory; return 0 / address or -errno. */
int64_t pyvmm_map_anonymous(uint64_t size);
int pyvmm_protect(uint64_t addr, uint64_t size, int prot);
/* Map [offset, offset + size) of fd privately (copy-on-write) over the
 * guest memory at addr: 0, or -errno with the range anonymous (zero)
 * memory again, or PYVMM_MAP_LOST when even that failed (a hole). */
int pyvmm_map_file(uint64_t addr, uint64_t size, int fd, uint64_t offset);
#define PYVMM_MAP_LOST 1
/* Drop the anonymous pages at [addr, addr + size): they read as zero again
 * without being resident. */
int pyvmm_discard(uint64_t addr, uint64_t size);
int pyvmm_unmap(uint64_t addr, uint64_t size);

#define PYVMM_PROT_READ 1
#define PYVMM_PROT_WRITE 2
#define PYVMM_PROT_EXEC 4


/*
 * Stop signals (SIGINT, SIGTERM, SIGHUP) are caught in C, not by Python:
 * the handler records the signal, sets immediate_exit in the registered
 * kvm_run (so a KVM_RUN entered just after the signal returns at once
 * instead of running the guest until its next exit) and signals stop_fd,
 * an eventfd the poll hypercall waits on.  No race window, no Python
 * exception raised at an arbitrary point.
 */
int pyvmm_signals_install(int stop_fd, void *kvm_run);
void pyvmm_signals_restore(void);
int pyvmm_stop_signal(void);

/*
 * The console: write all of buf to fd (stdout), in a way a stop signal can
 * always interrupt: the fd is non-blocking during the call and a full pipe
 * is waited for with poll on fd and the stop eventfd.  Returns len, or
 * -EINTR when a stop signal arrived (the output is abandoned), or -errno.
 */
long pyvmm_console_write(int fd, const void *buf, uint64_t len);

/* setns(2) for the calling thread; 0 or -errno. */
int pyvmm_setns(int fd, int nstype);

/* unshare(2) for the calling process; 0 or -errno. */
int pyvmm_unshare(int flags);
#endif
