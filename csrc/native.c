/* See native.h: exit decoding, ioctls and waits, compiled through cffi. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <linux/kvm.h>

#include "arch.h"
#include "native.h"

long pyvmm_ioctl_ptr(int fd, unsigned long request, void *arg)
{
    long r = ioctl(fd, request, arg);
    return r < 0 ? -errno : r;
}

long pyvmm_ioctl_val(int fd, unsigned long request, unsigned long arg)
{
    long r = ioctl(fd, request, arg);
    return r < 0 ? -errno : r;
}

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

int pyvmm_wait_readable(const int *fds, int nfds, int64_t timeout_ns, uint64_t *ready)
{
    struct pollfd pfds[64];
    struct timespec ts;
    uint64_t mask = 0;
    int i, r, n = 0;

    *ready = 0;
    if (nfds < 0 || nfds > 64)
        return -EINVAL;
    for (i = 0; i < nfds; i++) {
        pfds[i].fd = fds[i];
        pfds[i].events = POLLIN;
        pfds[i].revents = 0;
    }
    if (timeout_ns < 0)
        timeout_ns = 0;
    ts.tv_sec = timeout_ns / 1000000000;
    ts.tv_nsec = timeout_ns % 1000000000;
    r = ppoll(pfds, (nfds_t)nfds, &ts, NULL);
    if (r < 0)
        return -errno;
    for (i = 0; i < nfds; i++)
        if (pfds[i].revents & (POLLIN | POLLERR | POLLHUP)) {
            mask |= (uint64_t)1 << i;
            n++;
        }
    *ready = mask;
    return n;
}

int64_t pyvmm_map_anonymous(uint64_t size)
{
    /* No PROT_EXEC: only segments the ELF marks executable get it. */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return -errno;
    return (int64_t)(uintptr_t)p;
}

int pyvmm_protect(uint64_t addr, uint64_t size, int prot)
{
    int p = 0;
    if (prot & PYVMM_PROT_READ)
        p |= PROT_READ;
    if (prot & PYVMM_PROT_WRITE)
        p |= PROT_WRITE;
    if (prot & PYVMM_PROT_EXEC)
        p |= PROT_EXEC;
    return mprotect((void *)(uintptr_t)addr, size, p) < 0 ? -errno : 0;
}

int pyvmm_map_file(uint64_t addr, uint64_t size, int fd, uint64_t offset)
{
    /* MAP_FIXED replaces part of pyvmm's own guest mapping (the caller
     * checked the range); the pages stay those of the page cache, shared
     * with every other process mapping the file, until someone writes one.
     * Same rights as the anonymous mapping: protections come later. */
    void *want = (void *)(uintptr_t)addr;
    int err;

    if (mmap(want, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd,
             (off_t)offset) != MAP_FAILED)
        return 0;
    err = -errno;
    /* A failed MAP_FIXED may have unmapped the range: never leave a hole. */
    if (mmap(want, size, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) == MAP_FAILED)
        return PYVMM_MAP_LOST;
    return err;
}

int pyvmm_discard(uint64_t addr, uint64_t size)
{
    return madvise((void *)(uintptr_t)addr, size, MADV_DONTNEED) < 0 ? -errno : 0;
}

int pyvmm_unmap(uint64_t addr, uint64_t size)
{
    return munmap((void *)(uintptr_t)addr, size) < 0 ? -errno : 0;
}

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;
static struct kvm_run *volatile stop_run;
static volatile int stop_fd = -1;
/* The vCPU thread (the one that installed the handlers): a process-directed
 * signal taken by another thread must still kick it out of KVM_RUN. */
static volatile pid_t stop_vcpu_tid;
static const int stop_signals[] = { SIGINT, SIGTERM, SIGHUP };
#define N_STOP_SIGNALS (sizeof(stop_signals) / sizeof(stop_signals[0]))
static struct sigaction saved_actions[N_STOP_SIGNALS];
static int signals_installed;

static void on_stop_signal(int sig)
{
    int saved_errno = errno;
    uint64_t one = 1;
    struct kvm_run *run = stop_run;

    if (!stop_signal)
        stop_signal = sig;
    if (run)
        run->immediate_exit = 1;
    if (stop_fd >= 0 && write(stop_fd, &one, sizeof(one)) < 0) {
        /* Nothing to do: the flag alone still stops the run loop. */
    }
    /*
     * Taken on another thread (pyvmm.api runs the vCPU off the main
     * thread): send the same signal to the vCPU thread, whose KVM_RUN (or
     * blocking call) it interrupts; this handler runs again there and finds
     * the flag set. tgkill is async-signal-safe; pthread_kill is not listed.
     */
    if (stop_vcpu_tid > 0 && syscall(SYS_gettid) != stop_vcpu_tid)
        syscall(SYS_tgkill, getpid(), stop_vcpu_tid, sig);
    errno = saved_errno;
}

int pyvmm_signals_install(int fd, void *kvm_run)
{
    struct sigaction sa;
    size_t i;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    stop_signal = 0;
    stop_fd = fd;
    stop_run = kvm_run;
    stop_vcpu_tid = (pid_t)syscall(SYS_gettid);
    for (i = 0; i < N_STOP_SIGNALS; i++)
        if (sigaction(stop_signals[i], &sa, &saved_actions[i]) < 0)
            return -errno;
    signals_installed = 1;
    return 0;
}

void pyvmm_signals_restore(void)
{
    size_t i;

    if (!signals_installed)
        return;
    for (i = 0; i < N_STOP_SIGNALS; i++)
        sigaction(stop_signals[i], &saved_actions[i], NULL);
    signals_installed = 0;
    stop_run = NULL;
    stop_fd = -1;
    stop_vcpu_tid = 0;
}

int pyvmm_stop_signal(void)
{
    return stop_signal;
}

long pyvmm_console_write(int fd, const void *buf, uint64_t len)
{
    const uint8_t *p = buf;
    uint64_t done = 0;
    long result = 0;
    int flags = fcntl(fd, F_GETFL);
    int set = flags >= 0 && !(flags & O_NONBLOCK);

    /*
     * Non-blocking only while this call writes, so that a full pipe or a
     * stopped terminal leaves us in poll, with the stop eventfd, and never
     * asleep in write() where a stop signal that arrived just before would
     * be lost (Python's os.write retries after EINTR on its own).
     */
    if (set && fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        set = 0;
    while (done < len) {
        ssize_t n;

        if (stop_signal) {
            result = -EINTR;
            break;
        }
        n = write(fd, p + done, len - done);
        if (n > 0) {
            done += (uint64_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfds[2] = {
                { .fd = fd, .events = POLLOUT },
                { .fd = stop_fd, .events = POLLIN },
            };
            /* stop_fd < 0 (no run): poll ignores it. */
            if (poll(pfds, 2, -1) < 0 && errno != EINTR) {
                result = -errno;
                break;
            }
            continue;
        }
        result = n < 0 ? -errno : -EIO;
        break;
    }
    if (set)
        fcntl(fd, F_SETFL, flags);
    return result < 0 ? result : (long)done;
}

int pyvmm_setns(int fd, int nstype)
{
    return setns(fd, nstype) < 0 ? -errno : 0;
}

int pyvmm_unshare(int flags)
{
    return unshare(flags) < 0 ? -errno : 0;
}
