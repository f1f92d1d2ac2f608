/* See fdwait.h: ppoll for readable fds, a bit per fd, and the deadline
 * wait over it. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

#include "fdwait.h"
#include "hvt_abi.h"
#include "spin.h"

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

/*
 * A poll hypercall's timeout is a deadline, and ppoll's own timeout is not
 * quite one: Linux lets a poll-family timeout expire late by an estimate
 * of its accuracy (fs/select.c: 0.1% of the time left, 0.5% for a niced
 * thread, at least the thread's timer slack, 50 us by default, at most
 * 100 ms), to batch wake-ups.  A guest's 1 s yield came back 1.1-1.2 ms
 * late (solo5-hvt, whose deadline is a timerfd, 0.1-0.2 ms).  So a long
 * wait is cut into steps that end before the deadline even that late:
 * each waits the time left less the largest such slack, and once it is
 * short (POLL_EXACT_NS: its slack is the timer slack) the last waits all
 * of it.  A wait that ends on time costs one more (short) ppoll; one ended
 * by a frame or a signal costs nothing more.
 */
#define POLL_EXACT_NS 10000000LL          /* 10 ms: 0.5% of it is 50 us */
#define POLL_SLACK_DIVISOR 200            /* 0.5%, the niced estimate */
#define POLL_SLACK_MAX_NS 100000000LL     /* fs/select.c's MAX_SLACK */

int64_t pyvmm_poll_step(int64_t remaining_ns)
{
    int64_t slack;

    if (remaining_ns <= POLL_EXACT_NS)
        return remaining_ns > 0 ? remaining_ns : 0;
    slack = remaining_ns / POLL_SLACK_DIVISOR;
    if (slack > POLL_SLACK_MAX_NS)
        slack = POLL_SLACK_MAX_NS;
    return remaining_ns - slack;
}

int pyvmm_poll_until(const int *fds, int nfds, int64_t timeout_ns, uint64_t *ready)
{
    /* The deadline from now, the host's earliest look at the request. */
    int64_t now = (int64_t)clock_ns(CLOCK_MONOTONIC), deadline;
    int r;

    if (timeout_ns <= 0)
        return pyvmm_wait_readable(fds, nfds, 0, ready);
    deadline = timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
    for (;;) {
        r = pyvmm_wait_readable(fds, nfds, pyvmm_poll_step(deadline - now), ready);
        if (r != 0)
            return r;   /* ready, a signal (-EINTR) or a failure */
        now = (int64_t)clock_ns(CLOCK_MONOTONIC);
        if (now >= deadline)
            return 0;
    }
}
