/*
 * gdbtarget: a guest for debugger tests. It prints a global that a
 * debugger may change before it is read, calls a function a debugger can
 * step into and finish (which writes a global a watchpoint can catch), and exits 0 only when the global was set to 42
 * (1 otherwise), so a test sees the guest act on a debugger's write.
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

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    int doubled = twice(gdb_answer);
    rt_printf("gdbtarget: answer %d, doubled %d\n", gdb_answer, doubled);
    return gdb_answer == 42 ? 0 : 1;
}
