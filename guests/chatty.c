/*
 * chatty: prints lines of 1 KiB without end, so a standard output whose
 * reader stopped fills up and pyvmm's console write blocks (tests: a stop
 * signal must still end pyvmm then).  Never exits by itself.
 */
#include "rt.h"

GUEST_MANIFEST();

static char line[1025];

int solo5_app_main(const struct solo5_start_info *si)
{
    (void)si;
    for (int i = 0; i < 1023; i++)
        line[i] = 'a' + i % 26;
    line[1023] = '\n';
    for (;;)
        rt_puts(line);
}
