/*
 * The sandbox: a seccomp filter on every thread of the process, installed
 * once set-up is over (pyvmm/sandbox.py has the allow list and says why
 * each call is there; docs/security.md).  Built with libseccomp.
 *
 * Two steps, so that the costly one is done once: building compiles the
 * rules into a BPF program (about 2 ms of libseccomp here); loading puts a
 * program on the process.  The warm launcher (pyvmm serve) builds before
 * it forks and each VM's child only loads; the command does both.
 */
#ifndef PYVMM_SANDBOX_H
#define PYVMM_SANDBOX_H

/* What a call outside the list gets: EPERM (the default), or the process
 * is killed (SIGSYS). */
#define PYVMM_SANDBOX_ERRNO 0
#define PYVMM_SANDBOX_KILL 1
/* Room for a compiled program (struct sock_filter, 8 bytes each; the
 * kernel takes at most 4096 instructions). */
#define PYVMM_SANDBOX_PROG_MAX 32768

/*
 * Compile the filter into prog[0..size): the calls named in names[0..n)
 * are allowed, plus openat/open only without write or create flags,
 * mprotect/mmap only without PROT_EXEC and ioctl only for KVM's requests
 * and two terminal queries; everything else gets `action`.  Names this
 * architecture does not have are skipped.  Returns the program's length
 * in bytes, or -errno (-ENOSPC: size is too small).
 */
int pyvmm_sandbox_build(const char *const *names, int n, int action,
                        void *prog, int size);

/*
 * Load a program pyvmm_sandbox_build made: no_new_privs is set, then the
 * filter goes on every thread (SECCOMP_FILTER_FLAG_TSYNC), without forcing
 * the speculative store bypass mitigation (SECCOMP_FILTER_FLAG_SPEC_ALLOW,
 * where the kernel has it).  Returns 0 or -errno (-ESRCH: a thread could
 * not be synchronised).
 */
int pyvmm_sandbox_load(const void *prog, int len);

/* How many names of the last build this architecture did not know. */
int pyvmm_sandbox_unknown(void);
#endif
