/* Console output: the puts hypercall. */
#include "hypercall.h"
#include "rt_internal.h"

void solo5_console_write(const char *buf, size_t size)
{
    volatile struct hvt_hc_puts p = {
        .data = (uint64_t)(uintptr_t)buf,
        .len = size,
    };
    hvt_hypercall(HVT_HYPERCALL_PUTS, &p);
}

void rt_puts(const char *s)
{
    solo5_console_write(s, strlen(s));
}
