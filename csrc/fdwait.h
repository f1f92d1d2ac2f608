/*
 * Waiting for readable fds with a nanosecond timeout (ppoll): the poll
 * hypercall's wait (with its deadline), the GDB stub's, the console's.
 * Read by cffi.
 */
#ifndef PYVMM_FDWAIT_H
#define PYVMM_FDWAIT_H

#include <stdint.h>

/*
 * The largest set pyvmm waits on at once, the poll hypercall's: the fixed
 * eventfds it can hold (the stop eventfd and the shmstream wake eventfd)
 * and one fd per manifest handle (MFT_MAX_ENTRIES).  Literals for cffi,
 * checked against those constants in fdwait.c; every poll-set array and
 * check uses these (hcfast.h's PYVMM_FAST_MAX_POLL is this one).
 */
#define PYVMM_WAIT_FIXED_FDS 2
#define PYVMM_WAIT_MAX_FDS 66
/* The 64-bit words of a ready mask for PYVMM_WAIT_MAX_FDS fds. */
#define PYVMM_WAIT_MASK_WORDS 2

/*
 * Wait until one of fds (at most PYVMM_WAIT_MAX_FDS) is readable or
 * timeout_ns passes (nanosecond resolution, unlike epoll).  ready gets a
 * bit per readable fd, by index: bit i % 64 of ready[i / 64].  The caller
 * passes (nfds + 63) / 64 words, at least one (PYVMM_WAIT_MASK_WORDS holds
 * any set); no more are written.  Returns how many are readable (0 on
 * timeout) or -errno (-EINVAL for a set too large, -EINTR on a signal).
 */
int pyvmm_wait_readable(const int *fds, int nfds, int64_t timeout_ns, uint64_t *ready);

/*
 * The poll hypercall's wait (the fast path's and Python's): like
 * pyvmm_wait_readable, but ``timeout_ns`` is kept as a deadline, never
 * overslept by the kernel's slack on poll timeouts (fdwait.c says why),
 * however long.
 */
int pyvmm_poll_until(const int *fds, int nfds, int64_t timeout_ns, uint64_t *ready);
/* How long pyvmm_poll_until's next ppoll waits with this much time left
 * (for tests/unit/test_poll_deadline.py). */
int64_t pyvmm_poll_step(int64_t remaining_ns);

#endif
