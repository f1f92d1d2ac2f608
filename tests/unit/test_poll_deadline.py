"""The poll hypercall keeps the guest's timeout as a deadline: each ppoll
of a long wait ends before the deadline even as late as Linux lets a poll
timeout expire (fs/select.c: 0.1% of the time left, 0.5% for a niced
thread, at least the timer slack, at most 100 ms), and the last one is
short enough that its slack is the timer slack alone (csrc/fdwait.c).
The arithmetic is checked here, not the machine's timing."""

from __future__ import annotations

import errno
import os
import time

from pyvmm._native import ffi, lib
from testkit.helpers import run_python

MS = 1_000_000
EXACT = 10 * MS  # the last wait: 0.5% of it is the 50 us timer slack
TIMER_SLACK = 50_000
MAX_SLACK = 100 * MS


def kernel_slack(timeout: int, niced: bool = True) -> int:
    """How late Linux may end a poll-family timeout of ``timeout`` ns."""
    estimate = timeout // (200 if niced else 1000)
    return min(max(estimate, TIMER_SLACK), MAX_SLACK)


LEFT = [
    1,
    MS,
    EXACT,
    EXACT + 1,
    20 * MS,
    100 * MS,
    999_999_964,  # test_time's 1 s yield, as the host sees it
    10**9,
    60 * 10**9,
    3600 * 10**9,
    2**62,
    2**63 - 1,
]


def test_a_short_wait_is_waited_whole():
    for left in (0, 1, MS, EXACT):
        assert lib.pyvmm_poll_step(left) == left
    assert lib.pyvmm_poll_step(-5) == 0


def test_each_step_of_a_long_wait_ends_before_the_deadline_however_late_it_fires():
    for left in LEFT:
        step = lib.pyvmm_poll_step(left)
        assert 0 < step <= left
        if left > EXACT:
            assert step + kernel_slack(step) <= left, left


def test_a_wait_takes_at_most_three_ppolls():
    """Woken at the earliest (the step itself), the time left is the step's
    margin; it shrinks to a last, exact wait within three ppolls."""
    for left in LEFT:
        polls = 1
        while left > EXACT:
            left -= lib.pyvmm_poll_step(left)
            polls += 1
        assert polls <= 3, left


def test_a_timeout_is_never_cut_short():
    """With nothing to wait for, the wait returns 0 and not before its
    deadline (a lower bound: ppoll never ends early)."""
    fds = ffi.new("int[]", [-1])  # a negative fd is ignored by ppoll
    ready = ffi.new("uint64_t *")
    for timeout in (0, 3 * MS, EXACT + 5 * MS):
        start = time.monotonic_ns()
        assert lib.pyvmm_poll_until(fds, 1, timeout, ready) == 0
        assert time.monotonic_ns() - start >= timeout
        assert ready[0] == 0


def test_a_ready_fd_ends_the_wait_with_its_bit():
    fd = os.eventfd(1, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        fds = ffi.new("int[]", [-1, fd])
        ready = ffi.new("uint64_t *")
        assert lib.pyvmm_poll_until(fds, 2, 3600 * 10**9, ready) == 1
        assert ready[0] == 0b10
    finally:
        os.close(fd)


def test_a_wait_just_under_a_second_is_not_taken_for_more():
    """ppoll's timespec from the nanoseconds: 999,999,999 ns is 0 s and
    999,999,999 ns, not a second and more (an upper bound half a second
    past it, far above any scheduling delay; a wrong split adds a second)."""
    fds = ffi.new("int[]", [-1])
    ready = ffi.new("uint64_t *")
    timeout = 10**9 - 1
    start = time.monotonic_ns()
    assert lib.pyvmm_wait_readable(fds, 1, timeout, ready) == 0
    assert timeout <= time.monotonic_ns() - start < timeout + 10**9 // 2


def test_only_the_fds_given_are_read():
    """The set's fds end where the caller's array does: the next word may
    be unmapped (here, a page that is not)."""
    result = run_python(
        """
        import mmap, ctypes
        from pyvmm._native import ffi, lib
        page = mmap.PAGESIZE
        area = mmap.mmap(-1, 2 * page)
        base = ctypes.addressof(ctypes.c_char.from_buffer(area))
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mprotect(ctypes.c_void_p(base + page), page, 0) == 0
        fds = ffi.cast("int *", base + page - 2 * ffi.sizeof("int"))
        fds[0] = fds[1] = -1
        ready = ffi.new("uint64_t[]", lib.PYVMM_WAIT_MASK_WORDS)
        print(lib.pyvmm_wait_readable(fds, 2, 0, ready), ready[0])
        """
    )
    assert (result.returncode, result.stdout) == (0, "0 0\n"), result.stderr


def test_an_empty_set_is_a_plain_wait():
    """No fds at all (a guest with no devices polling): the wait, nothing
    ready, not a refusal."""
    ready = ffi.new("uint64_t *", 1)
    assert lib.pyvmm_wait_readable(ffi.NULL, 0, 1000, ready) == 0
    assert ready[0] == 0
    assert lib.pyvmm_poll_until(ffi.NULL, 0, 1000, ready) == 0


def test_a_set_past_the_limit_is_refused_with_nothing_ready():
    fds = ffi.new("int[]", [-1] * (lib.PYVMM_WAIT_MAX_FDS + 1))
    ready = ffi.new("uint64_t[]", [2**64 - 1] * lib.PYVMM_WAIT_MASK_WORDS)
    assert lib.pyvmm_wait_readable(fds, len(fds), 0, ready) == -errno.EINVAL
    assert ready[0] == 0


def test_nothing_ready_is_0_whatever_errno_held():
    """A wait that ends with nothing ready answers 0, not a stale errno
    from an earlier call read as its failure."""
    fds = ffi.new("int[]", [-1])
    ready = ffi.new("uint64_t *")
    for call in (lib.pyvmm_wait_readable, lib.pyvmm_poll_until):
        ffi.errno = errno.EIO
        assert call(fds, 1, 0, ready) == 0


def test_the_ready_mask_is_cleared_first():
    """The caller's mask may hold the last poll's bits: a wait with nothing
    ready leaves every word 0."""
    fds = ffi.new("int[]", [-1] * lib.PYVMM_WAIT_MAX_FDS)
    ready = ffi.new("uint64_t[]", [2**64 - 1] * lib.PYVMM_WAIT_MASK_WORDS)
    assert lib.pyvmm_wait_readable(fds, lib.PYVMM_WAIT_MAX_FDS, 0, ready) == 0
    assert list(ready) == [0] * lib.PYVMM_WAIT_MASK_WORDS


def test_a_negative_timeout_is_a_look_without_waiting():
    fds = ffi.new("int[]", [-1])
    ready = ffi.new("uint64_t *")
    assert lib.pyvmm_wait_readable(fds, 1, -5, ready) == 0
    assert lib.pyvmm_wait_readable(fds, 1, -(2**63), ready) == 0


def test_only_the_sets_own_entries_are_reported():
    """A ready fd of an earlier, longer set is no bit of this one's (the
    poll entries past this set's length are left from that call)."""
    fd = os.eventfd(1, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        ready = ffi.new("uint64_t *")
        assert lib.pyvmm_wait_readable(ffi.new("int[]", [-1, fd]), 2, 0, ready) == 1
        assert ready[0] == 0b10
        assert lib.pyvmm_wait_readable(ffi.new("int[]", [-1, fd]), 1, 0, ready) == 0
        assert ready[0] == 0
    finally:
        os.close(fd)


def test_a_two_second_wait_lasts_two_seconds():
    """The timespec's seconds and nanoseconds both from the one count: 2 s
    is 2 s and 0 ns (bounds half a second wide; a wrong split is a second
    off)."""
    fds = ffi.new("int[]", [-1])
    ready = ffi.new("uint64_t *")
    timeout = 2 * 10**9
    start = time.monotonic_ns()
    assert lib.pyvmm_wait_readable(fds, 1, timeout, ready) == 0
    assert timeout <= time.monotonic_ns() - start < timeout + 10**9 // 2


def test_a_deadline_wait_ends_at_its_deadline_not_a_step_later():
    """Each step waits the time left to the deadline less its slack: the
    wait ends near the deadline, not one whole timeout after it."""
    fds = ffi.new("int[]", [-1])
    ready = ffi.new("uint64_t *")
    timeout = 400 * MS
    start = time.monotonic_ns()
    assert lib.pyvmm_poll_until(fds, 1, timeout, ready) == 0
    assert timeout <= time.monotonic_ns() - start < timeout * 3 // 2
