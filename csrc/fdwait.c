/* See fdwait.h: ppoll for readable fds, a bit per fd. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

#include "fdwait.h"
#include "hvt_abi.h"

_Static_assert(PYVMM_WAIT_MAX_FDS == MFT_MAX_ENTRIES + PYVMM_WAIT_FIXED_FDS,
               "a poll set: the fixed eventfds and one fd per manifest handle");
_Static_assert(PYVMM_WAIT_MASK_WORDS == (PYVMM_WAIT_MAX_FDS + 63) / 64,
               "a ready mask holds a bit per fd of the largest set");

int pyvmm_wait_readable(const int *fds, int nfds, int64_t timeout_ns, uint64_t *ready)
{
    struct pollfd pfds[PYVMM_WAIT_MAX_FDS];
    struct timespec ts;
    int i, r, n = 0, words = nfds > 64 ? (nfds + 63) / 64 : 1;

    if (nfds < 0 || nfds > PYVMM_WAIT_MAX_FDS) {
        ready[0] = 0;
        return -EINVAL;
    }
    memset(ready, 0, (size_t)words * sizeof(*ready));
    for (i = 0; i < nfds; i++) {
        pfds[i].fd = fds[i];
        pfds[i].events = POLLIN;
        pfds[i].revents = 0;
    }
    if (timeout_ns < 0)
        timeout_ns = 0;
    ts.tv_sec = timeout_ns / 1000000000;
    ts.tv_nsec = timeout_ns % 1000000000;
    r = ppoll(pfds, (nfds_t)nfds, &ts, NULL);
    if (r < 0)
        return -errno;
    for (i = 0; i < nfds; i++)
        if (pfds[i].revents & (POLLIN | POLLERR | POLLHUP)) {
            ready[i / 64] |= (uint64_t)1 << (i % 64);
            n++;
        }
    return n;
}
