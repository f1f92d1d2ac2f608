/* See sandbox.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <seccomp.h>
#include <stddef.h>
#include <sys/mman.h>

#include "sandbox.h"

static int unknown;

int pyvmm_sandbox_unknown(void)
{
    return unknown;
}

/* Allow `name` only when (arg & mask) == 0. */
static int allow_without(scmp_filter_ctx ctx, const char *name, unsigned arg,
                         uint64_t mask)
{
    int nr = seccomp_syscall_resolve_name(name);
    struct scmp_arg_cmp cmp = SCMP_CMP(arg, SCMP_CMP_MASKED_EQ, mask, 0);

    if (nr == __NR_SCMP_ERROR)
        return 0;
    return seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 1, &cmp);
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
    if ((err = allow_without(ctx, "openat", 2, writing)) < 0 ||
        (err = allow_without(ctx, "open", 1, writing)) < 0)
        goto out;
    /* No new executable memory on the host. */
    if ((err = allow_without(ctx, "mprotect", 2, PROT_EXEC)) < 0 ||
        (err = allow_without(ctx, "mmap", 2, PROT_EXEC)) < 0)
        goto out;
    err = seccomp_load(ctx);
out:
    seccomp_release(ctx);
    return err < 0 ? err : 0;
}
