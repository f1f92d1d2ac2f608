/*
 * The guard behind pyvmm_copy_guarded (guestmem.h), for C code that loads
 * and stores guest memory directly over a stretch (a hypercall's answer):
 * one sigsetjmp for all of it, a SIGBUS on a page in the guarded ranges
 * (a page its file lost) coming back there instead of ending the process.
 *
 *     struct pyvmm_guard g;
 *     if (sigsetjmp(g.env, 0))
 *         return ...;     // a page was gone: nothing after this ran
 *     pyvmm_guard_enter(&g, lo, len, NULL, 0);
 *     ... loads and stores of [lo, lo + len) ...
 *     pyvmm_guard_leave(&g);
 *
 * After the jump only return: locals changed since sigsetjmp are not
 * reliable. Not read by cffi (sigjmp_buf).
 */
#ifndef PYVMM_GUARD_H
#define PYVMM_GUARD_H

#include <setjmp.h>
#include <stdint.h>

struct pyvmm_guard {
    sigjmp_buf env;
    uintptr_t lo[2], hi[2];        /* the guarded ranges */
    struct pyvmm_guard *outer;     /* the guard this one interrupted, if any */
};

void pyvmm_guard_enter(struct pyvmm_guard *g, const void *a, uint64_t alen, const void *b,
                       uint64_t blen);
void pyvmm_guard_leave(struct pyvmm_guard *g);

#endif
