/* See netns.h: setns and unshare with errno folded in. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>

#include "netns.h"

int pyvmm_setns(int fd, int nstype)
{
    return setns(fd, nstype) < 0 ? -errno : 0;
}

int pyvmm_unshare(int flags)
{
    return unshare(flags) < 0 ? -errno : 0;
}
