/*
 * The sandbox: a seccomp filter on every thread of the process, installed
 * once set-up is over (pyvmm/sandbox.py has the allow list and says why
 * each call is there; docs/security.md).  Built with libseccomp.
 */
#ifndef PYVMM_SANDBOX_H
#define PYVMM_SANDBOX_H

/* What a call outside the list gets: EPERM (the default), or the process
 * is killed (SIGSYS). */
#define PYVMM_SANDBOX_ERRNO 0
#define PYVMM_SANDBOX_KILL 1

/*
 * Install the filter: the calls named in names[0..n) are allowed, plus
 * openat/open only without write or create flags and mprotect/mmap only
 * without PROT_EXEC; everything else gets `action`.  no_new_privs is set
 * and the filter is synchronised to every thread (SECCOMP_FILTER_FLAG_TSYNC).
 * Names this architecture does not have are skipped.  Returns 0 or -errno
 * (-ESRCH: a thread could not be synchronised).
 */
int pyvmm_sandbox_install(const char *const *names, int n, int action);

/* How many names of the last install this architecture did not know. */
int pyvmm_sandbox_unknown(void);
#endif
