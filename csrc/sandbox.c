/* See sandbox.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <seccomp.h>
#include <stddef.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/kvm.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "sandbox.h"

static int unknown;

int pyvmm_sandbox_unknown(void)
{
    return unknown;
}

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

/*
 * ioctl: KVM's requests (type KVMIO: KVM_RUN, the register and event
 * ioctls of the run loop and the trap emulator, on both architectures)
 * and the two terminal queries of Python's output (isatty, and the width
 * that --stats=live asks for). No tap, socket or block-device request
 * once the guest runs: those are all made during set-up.
 */
static int allow_ioctls(scmp_filter_ctx ctx)
{
    const uint64_t type = (uint64_t)_IOC_TYPEMASK << _IOC_TYPESHIFT;
    int err;

    if ((err = allow_masked(ctx, "ioctl", 1, type,
                            (uint64_t)KVMIO << _IOC_TYPESHIFT)) < 0 ||
        (err = allow_masked(ctx, "ioctl", 1, 0xffffffff, TCGETS)) < 0)
        return err;
    return allow_masked(ctx, "ioctl", 1, 0xffffffff, TIOCGWINSZ);
}

/* The rules, as libseccomp takes them (see sandbox.h). */
static int add_rules(scmp_filter_ctx ctx, const char *const *names, int n)
{
    const uint64_t writing = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND;
    int i, err;

    for (i = 0; i < n; i++) {
        int nr = seccomp_syscall_resolve_name(names[i]);
        if (nr == __NR_SCMP_ERROR) {
            unknown++;
            continue;
        }
        if ((err = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0)) < 0)
            return err;
    }
    /* Files only for reading (Python's lazy imports, /proc). */
    if ((err = allow_masked(ctx, "openat", 2, writing, 0)) < 0 ||
        (err = allow_masked(ctx, "open", 1, writing, 0)) < 0)
        return err;
    /* No new executable memory on the host. */
    if ((err = allow_masked(ctx, "mprotect", 2, PROT_EXEC, 0)) < 0 ||
        (err = allow_masked(ctx, "mmap", 2, PROT_EXEC, 0)) < 0)
        return err;
    return allow_ioctls(ctx);
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

    unknown = 0;
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
    long ret;

    if (len <= 0 || len % sizeof(struct sock_filter) ||
        len / sizeof(struct sock_filter) > BPF_MAXINSNS)
        return -EINVAL;
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
