/*
 * gdbtarget: a guest for debugger tests. It prints a global that a
 * debugger may change before it is read, calls a function a debugger can
 * step into and finish (which writes a global a watchpoint can catch), and
 * exits 0 only when the global was set to 42 (1 otherwise), so a test sees
 * the guest act on a debugger's write. It also loads known patterns into
 * xmm0 and xmm1 and 1.0 into st0 (x86_64: guests are built without SSE or
 * x87 code, so by hand),
 * stops in sse_mark() where a debugger reads them and may change xmm1,
 * and prints the xmm1 it then finds. Given the argument "fault", it then
 * reads address 0 with the patterns still in place: a core shows them.
 */
#include "rt.h"

GUEST_MANIFEST();

volatile int gdb_answer = 41;
volatile int gdb_last; /* written by twice(): a watchpoint's target */

__attribute__((noinline)) int twice(int value)
{
    gdb_last = 2 * value;
    return gdb_last;
}

#if defined(__x86_64__)
static const unsigned int sse_pattern[2][4] __attribute__((aligned(16))) = {
    {0x11223344, 0x55667788, 0x99aabbcc, 0xddeeff00},
    {0x01020304, 0x05060708, 0x090a0b0c, 0x0d0e0f10},
};

/* A place to stop with the patterns in xmm0 and xmm1 (nothing else in
 * the guest touches an SSE register). */
__attribute__((noinline)) void sse_mark(void)
{
    __asm__ volatile("" ::: "memory");
}

static void sse_round_trip(const char *cmdline)
{
    unsigned int seen[4] __attribute__((aligned(16)));

    __asm__ volatile("movdqa %0, %%xmm0\n\tmovdqa %1, %%xmm1"
                     :
                     : "m"(sse_pattern[0]), "m"(sse_pattern[1]));
    sse_mark();
    __asm__ volatile("movdqa %%xmm1, %0" : "=m"(seen));
    rt_printf("gdbtarget: xmm1 %x %x %x %x\n", seen[0], seen[1], seen[2], seen[3]);
    if (strcmp(cmdline, "fault") == 0)
        rt_printf("gdbtarget: %d\n", *(volatile int *)0);
}
#endif

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si; /* used on x86_64 only */
    int doubled = twice(gdb_answer);
    rt_printf("gdbtarget: answer %d, doubled %d\n", gdb_answer, doubled);
#if defined(__x86_64__)
    sse_round_trip(si->cmdline);
#endif
    return gdb_answer == 42 ? 0 : 1;
}
