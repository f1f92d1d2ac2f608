/* Ending the guest: the halt hypercall. */
#include "hypercall.h"
#include "rt_internal.h"

static void (*exit_hook)(void);

void rt_set_exit_hook(void (*fn)(void))
{
    exit_hook = fn;
}

void rt_halt(int status, void *cookie)
{
    volatile struct hvt_hc_halt h = {
        .cookie = (uint64_t)(uintptr_t)cookie,
        .exit_status = status,
    };
    hvt_hypercall(HVT_HYPERCALL_HALT, &h);
    /* A tender never resumes a halted guest; if one does, fault so the run
     * ends instead of executing whatever follows (ud2 / udf: unprivileged). */
    for (;;)
        __builtin_trap();
}

void solo5_exit(int status)
{
    if (exit_hook != NULL)
        exit_hook();
    rt_halt(status, NULL);
}

void solo5_abort(void)
{
    rt_puts("pyvmm-rt: solo5_abort() called\n");
    rt_halt(SOLO5_EXIT_ABORT, NULL);
}
