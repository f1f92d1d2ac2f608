/*
 * The sandbox: a seccomp filter on every thread of the process, installed
 * once set-up is over (pyvmm/host/sandbox.py has the allow list and says why
 * each call is there; docs/security.md).  Built with libseccomp.
 *
 * Three steps, so that the costly one is done once: building compiles the
 * rules into a BPF program (about 2 ms of libseccomp here); binding writes
 * the process's own pid and fds into a copy of it; loading puts it on the
 * process.  The warm launcher (pyvmm serve) builds before it forks and
 * each VM's child only binds and loads; the command does all three.
 */
#ifndef PYVMM_SANDBOX_H
#define PYVMM_SANDBOX_H

#include <stdint.h>

/* What a call outside the list gets: EPERM (the default), or the process
 * is killed (SIGSYS). */
#define PYVMM_SANDBOX_ERRNO 0
#define PYVMM_SANDBOX_KILL 1
/* Room for a compiled program (struct sock_filter, 8 bytes each; the
 * kernel takes at most 4096 instructions). */
#define PYVMM_SANDBOX_PROG_MAX 32768

/*
 * Compile the filter into prog[0..size): the calls named in names[0..n)
 * are allowed, plus some only with certain arguments (sandbox.c: tgkill to
 * this process, the affinity of the calling thread, a few fcntl commands,
 * MADV_DONTNEED, mmap/mprotect without PROT_EXEC, ioctl: KVM's requests
 * on the vCPU fd, KVM_IOEVENTFD on the VM fd, two terminal queries);
 * everything else gets `action`.  Names this architecture does not have
 * are skipped.  Returns the program's length in bytes, or -errno
 * (-ENOSPC: size is too small).
 *
 * The program names the pid and the fds by placeholders: bind it before
 * loading it.
 */
int pyvmm_sandbox_build(const char *const *names, int n, int action,
                        void *prog, int size);

/*
 * Write this process's values over a built program's placeholders, in
 * place: its pid (getpid()), its VM's fd and its vCPU's fd.  seccomp
 * compares numbers, not files: the rules hold for whatever those numbers
 * are, which is why the filter also keeps the process from making new
 * fds (no open, dup, socket or KVM_CREATE_*: nothing can take a number the
 * rules name once the VM's or vCPU's is closed).  Returns 0, -EINVAL (a
 * placeholder is missing: not a program of pyvmm_sandbox_build, or bound
 * already) or -EBADF (a negative fd, a pid <= 0).
 */
int pyvmm_sandbox_bind(void *prog, int len, int pid, int vm_fd, int vcpu_fd);

/*
 * Load a bound program: READ_IMPLIES_EXEC is cleared from the process's
 * personality and no_new_privs set, then the filter goes on every
 * thread (SECCOMP_FILTER_FLAG_TSYNC), without forcing the speculative
 * store bypass mitigation (SECCOMP_FILTER_FLAG_SPEC_ALLOW, where the kernel
 * has it).  Returns 0 or -errno (-EINVAL: not a whole program, or one
 * still unbound; -ESRCH: a thread could not be synchronised).
 */
int pyvmm_sandbox_load(const void *prog, int len);

/*
 * Leave nothing of [addr, addr + len) readable in this process: a forked
 * VM's child forgets another VM's image the launcher holds (serve/warm.py).
 * `mapping`: the range is a file mapping (page-aligned start), replaced
 * by inaccessible anonymous pages, so the address range stays taken and
 * the file is no longer mapped here; otherwise it is a part of the heap
 * (an image read into memory): its whole pages are dropped (MADV_DONTNEED:
 * they read as zeros, and a page still shared with the launcher is not
 * copied) and the partial pages' bytes in the range are zeroed.  Returns
 * 0 or -errno.
 */
int pyvmm_sandbox_forget(uint64_t addr, uint64_t len, int mapping);
#endif
