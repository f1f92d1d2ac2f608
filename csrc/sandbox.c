/* See sandbox.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <seccomp.h>
#include <stddef.h>
#include <linux/kvm.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

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

int pyvmm_sandbox_install(const char *const *names, int n, int action)
{
    uint32_t deny = action == PYVMM_SANDBOX_KILL ? SCMP_ACT_KILL_PROCESS
                                                 : SCMP_ACT_ERRNO(EPERM);
    const uint64_t writing = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND;
    scmp_filter_ctx ctx;
    int i, err = 0;

    unknown = 0;
    ctx = seccomp_init(deny);
    if (ctx == NULL)
        return -ENOMEM;
    if ((err = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 1)) < 0 ||
        (err = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1)) < 0)
        goto out;
    /*
     * SECCOMP_FILTER_FLAG_SPEC_ALLOW: a seccomp filter otherwise forces the
     * speculative store bypass mitigation (SSBD) on every thread, which
     * measured here cost a third to a half of the frame rate.  It guards a
     * process against untrusted code in its own address space; pyvmm has
     * none (the guest runs in a VM, under KVM's own mitigations).  A
     * libseccomp or kernel without the flag keeps the default.
     */
    if (seccomp_api_get() >= 4)
        seccomp_attr_set(ctx, SCMP_FLTATR_CTL_SSB, 1);
    /* A binary tree instead of a list of comparisons. */
    seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
    for (i = 0; i < n; i++) {
        int nr = seccomp_syscall_resolve_name(names[i]);
        if (nr == __NR_SCMP_ERROR) {
            unknown++;
            continue;
        }
        if ((err = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0)) < 0)
            goto out;
    }
    /* Files only for reading (Python's lazy imports, /proc). */
    if ((err = allow_masked(ctx, "openat", 2, writing, 0)) < 0 ||
        (err = allow_masked(ctx, "open", 1, writing, 0)) < 0)
        goto out;
    /* No new executable memory on the host. */
    if ((err = allow_masked(ctx, "mprotect", 2, PROT_EXEC, 0)) < 0 ||
        (err = allow_masked(ctx, "mmap", 2, PROT_EXEC, 0)) < 0)
        goto out;
    if ((err = allow_ioctls(ctx)) < 0)
        goto out;
    err = seccomp_load(ctx);
out:
    seccomp_release(ctx);
    return err < 0 ? err : 0;
}
