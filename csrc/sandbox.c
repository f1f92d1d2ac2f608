/* See sandbox.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/kvm.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "sandbox.h"

/*
 * Values a rule needs that only the filtered process knows: its pid (for
 * tgkill) and the fds of its VM and vCPU (for ioctl).  The warm launcher
 * compiles the program once and forks, so each VM's child has its own;
 * the program is compiled with these placeholders in their place and
 * pyvmm_sandbox_bind writes the process's values over them.  They are
 * 31-bit values no other rule compares with (syscall numbers, ioctl
 * requests, fcntl commands, the audit architecture are all different).
 */
enum placeholder {
    PLACEHOLDER_PID = 0x7e5a0001,
    PLACEHOLDER_VM_FD = 0x7e5a0002,
    PLACEHOLDER_VCPU_FD = 0x7e5a0003,
};
#define PLACEHOLDERS 3

/* The low 32 bits of an argument: every argument compared here is an int
 * or an unsigned int to the kernel, whatever the register's upper half. */
#define LOW32 0xffffffffULL

/* Allow `name` only when (arg & mask) == value. */
static int allow_masked(scmp_filter_ctx ctx, const char *name, unsigned arg,
                        uint64_t mask, uint64_t value)
{
    int nr = seccomp_syscall_resolve_name(name);
    struct scmp_arg_cmp cmp = SCMP_CMP(arg, SCMP_CMP_MASKED_EQ, mask, value);

    if (nr == __NR_SCMP_ERROR)
        return 0;
    return seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 1, &cmp);
}

/* Allow `name` only when both comparisons hold. */
static int allow_both(scmp_filter_ctx ctx, const char *name,
                      struct scmp_arg_cmp a, struct scmp_arg_cmp b)
{
    int nr = seccomp_syscall_resolve_name(name);
    struct scmp_arg_cmp cmp[2] = {a, b};

    if (nr == __NR_SCMP_ERROR)
        return 0;
    return seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 2, cmp);
}

/*
 * ioctl, by fd value (seccomp sees numbers, not files: see sandbox.h):
 * on the vCPU fd any of KVM's requests (type KVMIO: KVM_RUN, the register
 * ioctls of the run loop, the trap emulator and the fault report, on both
 * architectures); on the VM fd only KVM_IOEVENTFD (the null-kick doorbell,
 * registered at the guest's first kick); on /dev/kvm none, so no
 * KVM_CREATE_VM, and no KVM_CREATE_VCPU on the VM.  On any fd the two
 * terminal queries of Python's output (isatty, and the width --stats=live
 * asks for).  No tap, socket or block-device request: all made during
 * set-up.
 */
static int allow_ioctls(scmp_filter_ctx ctx)
{
    const uint64_t type = (uint64_t)_IOC_TYPEMASK << _IOC_TYPESHIFT;
    struct scmp_arg_cmp vcpu = SCMP_A0(SCMP_CMP_MASKED_EQ, LOW32, PLACEHOLDER_VCPU_FD);
    struct scmp_arg_cmp vm = SCMP_A0(SCMP_CMP_MASKED_EQ, LOW32, PLACEHOLDER_VM_FD);
    int err;

    if ((err = allow_both(ctx, "ioctl", vcpu,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, type,
                                  (uint64_t)KVMIO << _IOC_TYPESHIFT))) < 0 ||
        (err = allow_both(ctx, "ioctl", vm,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, LOW32, KVM_IOEVENTFD))) < 0 ||
        (err = allow_masked(ctx, "ioctl", 1, LOW32, TCGETS)) < 0)
        return err;
    return allow_masked(ctx, "ioctl", 1, LOW32, TIOCGWINSZ);
}

/*
 * The calls allowed only for some arguments: each what pyvmm and Python's
 * runtime use while the guest runs (found with strace over every mode,
 * device and exit path; docs/security.md), nothing that reaches another
 * process.
 */
static int allow_some(scmp_filter_ctx ctx)
{
    static const int fcntl_queries[] = {F_GETFD, F_SETFD, F_GETFL};
    static const char *const affinity[] = {"sched_getaffinity", "sched_setaffinity"};
    unsigned i;
    int err;

    /* Signals only to this process's own threads (the vCPU kick, the stop
     * signal passed on, pthread_kill); kill and tkill not at all. */
    if ((err = allow_masked(ctx, "tgkill", 0, LOW32, PLACEHOLDER_PID)) < 0)
        return err;
    /* Affinity of the calling thread only (pid 0). */
    for (i = 0; i < sizeof(affinity) / sizeof(affinity[0]); i++)
        if ((err = allow_masked(ctx, affinity[i], 0, LOW32, 0)) < 0)
            return err;
    /* fcntl: the console's O_NONBLOCK toggle and fd flags; never F_SETOWN,
     * F_SETSIG or O_ASYNC (signals to another process), F_DUPFD (a new fd
     * could take the number of one the ioctl rules name), locks or leases. */
    for (i = 0; i < sizeof(fcntl_queries) / sizeof(fcntl_queries[0]); i++)
        if ((err = allow_masked(ctx, "fcntl", 1, LOW32, fcntl_queries[i])) < 0)
            return err;
    if ((err = allow_both(ctx, "fcntl", SCMP_A1(SCMP_CMP_MASKED_EQ, LOW32, F_SETFL),
                          SCMP_A2(SCMP_CMP_MASKED_EQ, O_ASYNC, 0))) < 0)
        return err;
    /* madvise: MADV_DONTNEED only (glibc's thread-stack release and heap
     * trim, Python's allocator); no MADV_HWPOISON and the like. */
    if ((err = allow_masked(ctx, "madvise", 2, LOW32, MADV_DONTNEED)) < 0)
        return err;
    /* No new executable memory on the host. */
    if ((err = allow_masked(ctx, "mprotect", 2, PROT_EXEC, 0)) < 0 ||
        (err = allow_masked(ctx, "mmap", 2, PROT_EXEC, 0)) < 0)
        return err;
    return allow_ioctls(ctx);
}

/* The rules, as libseccomp takes them (see sandbox.h). */
static int add_rules(scmp_filter_ctx ctx, const char *const *names, int n)
{
    int i, err;

    for (i = 0; i < n; i++) {
        int nr = seccomp_syscall_resolve_name(names[i]);
        if (nr == __NR_SCMP_ERROR)
            continue;   /* not on this architecture: nothing to allow */
        if ((err = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0)) < 0)
            return err;
    }
    return allow_some(ctx);
}

/* Whether insn compares the accumulator with a constant (a rule's value). */
static int compares_constant(const struct sock_filter *insn)
{
    return BPF_CLASS(insn->code) == BPF_JMP && BPF_OP(insn->code) == BPF_JEQ &&
           BPF_SRC(insn->code) == BPF_K;
}

/* How many times each placeholder is compared with in prog. */
static void count_placeholders(const struct sock_filter *prog, int n,
                               int counts[PLACEHOLDERS])
{
    int i;

    memset(counts, 0, PLACEHOLDERS * sizeof(counts[0]));
    for (i = 0; i < n; i++) {
        uint32_t k = prog[i].k;
        if (compares_constant(&prog[i]) && k >= PLACEHOLDER_PID &&
            k < PLACEHOLDER_PID + PLACEHOLDERS)
            counts[k - PLACEHOLDER_PID]++;
    }
}

int pyvmm_sandbox_bind(void *prog, int len, int pid, int vm_fd, int vcpu_fd)
{
    struct sock_filter *insns = prog;
    const uint32_t values[PLACEHOLDERS] = {(uint32_t)pid, (uint32_t)vm_fd,
                                           (uint32_t)vcpu_fd};
    int counts[PLACEHOLDERS];
    int n, i;

    if (len <= 0 || len % sizeof(struct sock_filter))
        return -EINVAL;
    if (pid <= 0 || vm_fd < 0 || vcpu_fd < 0)
        return -EBADF;
    n = len / sizeof(struct sock_filter);
    count_placeholders(insns, n, counts);
    for (i = 0; i < PLACEHOLDERS; i++)
        if (counts[i] == 0)
            return -EINVAL; /* not a program of pyvmm_sandbox_build, or bound already */
    for (i = 0; i < n; i++) {
        uint32_t k = insns[i].k;
        if (compares_constant(&insns[i]) && k >= PLACEHOLDER_PID &&
            k < PLACEHOLDER_PID + PLACEHOLDERS)
            insns[i].k = values[k - PLACEHOLDER_PID];
    }
    return 0;
}

/* The compiled program, read back from the memfd libseccomp wrote it to
 * (libseccomp 2.5 exports to a file descriptor only). */
static int export_program(scmp_filter_ctx ctx, void *prog, int size)
{
    int fd = memfd_create("pyvmm-seccomp", MFD_CLOEXEC);
    off_t len;
    int err;

    if (fd < 0)
        return -errno;
    if ((err = seccomp_export_bpf(ctx, fd)) < 0)
        goto out;
    len = lseek(fd, 0, SEEK_END);
    if (len < 0) {
        err = -errno;
    } else if (len > size || len % sizeof(struct sock_filter)) {
        err = -ENOSPC;
    } else if (pread(fd, prog, len, 0) != len) {
        err = -EIO;
    } else {
        err = (int)len;
    }
out:
    close(fd);
    return err;
}

int pyvmm_sandbox_build(const char *const *names, int n, int action,
                        void *prog, int size)
{
    uint32_t deny = action == PYVMM_SANDBOX_KILL ? SCMP_ACT_KILL_PROCESS
                                                 : SCMP_ACT_ERRNO(EPERM);
    scmp_filter_ctx ctx;
    int err;

    ctx = seccomp_init(deny);
    if (ctx == NULL)
        return -ENOMEM;
    /* A binary tree instead of a list of comparisons. */
    seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
    err = add_rules(ctx, names, n);
    if (err >= 0)
        err = export_program(ctx, prog, size);
    seccomp_release(ctx);
    return err;
}

int pyvmm_sandbox_load(const void *prog, int len)
{
    struct sock_fprog fprog = {
        .len = (unsigned short)(len / sizeof(struct sock_filter)),
        .filter = (struct sock_filter *)prog,
    };
    int counts[PLACEHOLDERS];
    int persona, i;
    long ret;

    if (len <= 0 || len % sizeof(struct sock_filter) ||
        len / sizeof(struct sock_filter) > BPF_MAXINSNS)
        return -EINVAL;
    /* Unbound, its rules would name fds and a pid nobody has. */
    count_placeholders(fprog.filter, fprog.len, counts);
    for (i = 0; i < PLACEHOLDERS; i++)
        if (counts[i])
            return -EINVAL;
    /* The mmap and mprotect rules refuse PROT_EXEC; with READ_IMPLIES_EXEC
     * a readable mapping would be executable anyway (solo5-hvt refuses to
     * run so): the flag goes. */
    persona = personality(0xffffffff);
    if (persona >= 0 && (persona & READ_IMPLIES_EXEC) &&
        personality(persona & ~READ_IMPLIES_EXEC) < 0)
        return -errno;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -errno;
    /*
     * SECCOMP_FILTER_FLAG_SPEC_ALLOW: a seccomp filter otherwise forces the
     * speculative store bypass mitigation (SSBD) on every thread, which
     * measured here cost a third to a half of the frame rate.  It guards a
     * process against untrusted code in its own address space; pyvmm has
     * none (the guest runs in a VM, under KVM's own mitigations).  A kernel
     * without the flag (EINVAL) keeps the default.
     */
    ret = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                  SECCOMP_FILTER_FLAG_TSYNC | SECCOMP_FILTER_FLAG_SPEC_ALLOW,
                  &fprog);
    if (ret < 0 && errno == EINVAL)
        ret = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                      SECCOMP_FILTER_FLAG_TSYNC, &fprog);
    if (ret > 0) /* TSYNC: the id of a thread that could not be synchronised */
        return -ESRCH;
    return ret < 0 ? -errno : 0;
}

int pyvmm_sandbox_forget(uint64_t addr, uint64_t len, int mapping)
{
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t first = (addr + page - 1) / page * page;
    uint64_t last = (addr + len) / page * page;

    if (len == 0)
        return 0;
    if (mapping) {
        if (addr % page)
            return -EINVAL;
        if (mmap((void *)(uintptr_t)addr, len, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
                 0) == MAP_FAILED)
            return -errno;
        return 0;
    }
    if (last <= first) { /* within one or two pages */
        memset((void *)(uintptr_t)addr, 0, len);
        return 0;
    }
    memset((void *)(uintptr_t)addr, 0, first - addr);
    memset((void *)(uintptr_t)last, 0, addr + len - last);
    return madvise((void *)(uintptr_t)first, last - first, MADV_DONTNEED) < 0 ? -errno : 0;
}
