/* What badcall.c and badblock.c share: the case name, and the end of a
 * case the host should have stopped. */
#ifndef BADCASE_H
#define BADCASE_H

#include "rt.h"

static int streq(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

static void not_stopped(void)
{
    rt_puts("FAILURE: not stopped\n");
    solo5_exit(2);
}

#endif
