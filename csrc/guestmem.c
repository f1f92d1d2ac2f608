/* See guestmem.h: the one checked accessor of guest memory, and the copy
 * that survives a page gone from under it. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>

#include "guard.h"
#include "guestmem.h"
#include "hvt_abi.h"

_Static_assert(PYVMM_LOW_AREA_END == HVT_GUEST_MIN_BASE,
               "the low area ends where the guest image may start");

void *pyvmm_guestmem_at(const struct pyvmm_guestmem *m, uint64_t gpa, uint64_t len,
                        int access)
{
    uint64_t i;

    if (!m->host || gpa > m->size || len > m->size - gpa)
        return NULL;
    if (access == PYVMM_GM_READ || len == 0)
        return (void *)(uintptr_t)(m->host + gpa);
    /* Any access but the host's own set-up is a write on the guest's behalf. */
    if (access != PYVMM_GM_SETUP && gpa < m->low_end)
        return NULL;
    for (i = 0; i < m->n_ro; i++)
        if (gpa < m->ro[2 * i + 1] && m->ro[2 * i] < gpa + len)
            return NULL;
    return (void *)(uintptr_t)(m->host + gpa);
}

/*
 * The guard (guard.h). Why a SIGBUS handler and not process_vm_readv or a
 * pread of /proc/self/mem, which answer EFAULT by themselves: those are a
 * system call per copy (0.5 to 1.5 us here, on paths that copy a few
 * bytes; the hypercall fast path would pay it per frame), /proc/self/mem
 * is a file to keep open (and one the sandbox would have to let through),
 * and the sandbox has no process_vm_readv. A guard costs a sigsetjmp that
 * saves no signal mask (SA_NODEFER: the handler leaves the mask as it
 * found it; about 12 ns here) and two stores of this thread's guard.
 */

/* This thread's innermost guard. initial-exec: read in a signal handler,
 * where a lazily allocated TLS block (dlopen'ed code's default) could
 * call malloc. */
static __thread struct pyvmm_guard *volatile current
    __attribute__((tls_model("initial-exec")));
static struct sigaction previous;

static int inside(const struct pyvmm_guard *g, uintptr_t a)
{
    return (a >= g->lo[0] && a < g->hi[0]) || (a >= g->lo[1] && a < g->hi[1]);
}

static void on_sigbus(int sig, siginfo_t *si, void *context)
{
    struct pyvmm_guard *g = current;

    (void)context;
    if (g && si->si_code > 0 && inside(g, (uintptr_t)si->si_addr)) {
        current = g->outer;
        siglongjmp(g->env, 1);
    }
    /* Not a guarded access's: what would have happened without this
     * handler (a fault runs its instruction again and faults again; a
     * signal that was sent is sent again). */
    sigaction(SIGBUS, &previous, NULL);
    if (si->si_code <= 0)
        raise(sig);
}

/* The handler goes in at the first guard, not at load: what it falls back
 * to (``previous``) is then the handler in place by that time (Python's
 * faulthandler's, when enabled). Once per process, by libc's pthread_once:
 * a thread that comes while another installs it waits for that. */
static pthread_once_t installed = PTHREAD_ONCE_INIT;

static void install(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous);
}

void pyvmm_guard_enter(struct pyvmm_guard *g, const void *a, uint64_t alen, const void *b,
                       uint64_t blen)
{
    pthread_once(&installed, install);
    g->lo[0] = (uintptr_t)a;
    g->lo[1] = (uintptr_t)b;
    g->hi[0] = g->lo[0] + alen;
    g->hi[1] = g->lo[1] + blen;
    /* A guard interrupted by a signal whose handler guards too (the image
     * lease's) is back in force once that one leaves. */
    g->outer = current;
    __asm__ volatile("" ::: "memory");
    current = g;
    __asm__ volatile("" ::: "memory");
}

void pyvmm_guard_leave(struct pyvmm_guard *g)
{
    __asm__ volatile("" ::: "memory");
    current = g->outer;
}

int pyvmm_guard_in_force(void)
{
    return current != NULL;
}

int pyvmm_copy_guarded(void *dst, const void *src, uint64_t len)
{
    struct pyvmm_guard g;

    if (len == 0)
        return 0;
    if (sigsetjmp(g.env, 0))
        return -EFAULT;
    pyvmm_guard_enter(&g, src, len, dst, len);
    memcpy(dst, src, len);
    pyvmm_guard_leave(&g);
    return 0;
}

int pyvmm_guestmem_read(const struct pyvmm_guestmem *m, void *dst, uint64_t gpa,
                        uint64_t len)
{
    const void *src = pyvmm_guestmem_at(m, gpa, len, PYVMM_GM_READ);

    if (!src)
        return -EINVAL;
    return pyvmm_copy_guarded(dst, src, len);
}
