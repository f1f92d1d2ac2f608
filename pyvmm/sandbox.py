"""The sandbox: once set-up is over, a seccomp filter on every thread.

``install()`` runs right before the guest's first instruction, when every
file descriptor pyvmm will use is open (/dev/kvm, the VM and vCPU, guest
memory, taps, block images, eventfds, the KVM statistics fd, --stats-json)
and every thread exists (the IO thread, the statistics threads). From then
on the process may only use what the run loop, the C fast path, the IO
thread, the statistics threads and Python's own runtime need to run the
guest and tear everything down (the list below, found with ``strace -f``
over every device, mode and exit path; docs/security.md). Anything else
fails with EPERM: Python turns that into an ``OSError`` that ends the run
with one line and a normal teardown, where a kill (solo5-hvt's choice)
would leave no message and skip the clean-up. no_new_privs is set first,
and the filter is synchronised to every thread (SECCOMP_FILTER_FLAG_TSYNC).

Built on libseccomp (csrc/sandbox.c): names, not numbers, so one list
serves every architecture (a name an architecture lacks is skipped). The
filter is compiled to BPF once per process (``program``: about 2 ms of
libseccomp) and loaded by ``install``: the warm launcher compiles it before
it forks (pyvmm/serve/warm.py), so each VM's child only loads it.
"""

from __future__ import annotations

import os
import sys

from pyvmm._native import ffi, lib
from pyvmm.errors import HostError

# What a thread of pyvmm may still ask the kernel for while the guest runs.
# openat/open (read-only: Python's lazy imports at teardown, /proc reads),
# mmap/mprotect (never PROT_EXEC) and ioctl (KVM's requests, two terminal
# queries) are added with argument checks in C.
ALLOW = (
    # Frames, blocks, console output, eventfds, counters: taps (read/write,
    # readv/writev), block images (preadv/pwritev), the KVM stats fd (pread).
    "read", "write", "readv", "writev", "pread64", "pwrite64",
    "preadv", "pwritev", "preadv2", "pwritev2", "lseek",
    "fsync", "fdatasync",
    # Waiting: the poll hypercall, the IO thread, console back-pressure.
    "poll", "ppoll", "select", "pselect6",
    "epoll_wait", "epoll_pwait", "epoll_ctl",
    "futex", "sched_yield", "nanosleep", "clock_nanosleep",
    "clock_gettime", "clock_getres", "gettimeofday", "time",
    # The IO thread pins itself (--pin) when it first runs.
    "sched_getaffinity", "sched_setaffinity", "getcpu",
    # Signals: the stop handlers, SIGUSR1's sigwait, their restore at exit,
    # the kick of the vCPU thread (tgkill).
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigtimedwait",
    "sigaltstack", "tgkill", "getpid", "gettid", "restart_syscall",
    # Teardown: fds closed (a block image's flock goes with it), memory
    # unmapped, threads joined, the process ends.
    "close", "flock", "munmap", "madvise", "mremap", "brk",
    "exit", "exit_group",
    # Python's runtime: file status, imports, its allocator, randomness.
    "fstat", "newfstatat", "stat", "lstat", "statx", "fcntl",
    "getdents64", "readlink", "getcwd", "getrandom",
    "getuid", "geteuid", "getgid", "getegid", "uname", "sysinfo",
    "rseq", "set_robust_list",
)  # fmt: skip

# A debugging aid (docs/security.md): after installing the filter, try what
# the filter must refuse, and say what happened on stderr.
SELFTEST_ENV = "PYVMM_SANDBOX_SELFTEST"


#: The compiled programs of this process, by action (``program``).
_programs: dict[bool, bytes] = {}


def program(*, kill: bool = False) -> bytes:
    """The filter compiled to BPF: the same rules give the same program, so
    it is built once per process, and a process forked after the build
    (a launcher's VM) inherits it."""
    compiled = _programs.get(kill)
    if compiled is None:
        names = [ffi.new("char[]", n.encode()) for n in ALLOW]
        array = ffi.new("char *[]", names)
        action = lib.PYVMM_SANDBOX_KILL if kill else lib.PYVMM_SANDBOX_ERRNO
        size = lib.PYVMM_SANDBOX_PROG_MAX
        buf = ffi.new("char[]", size)
        length = lib.pyvmm_sandbox_build(array, len(names), action, buf, size)
        if length < 0:
            raise _error(length)
        compiled = _programs[kill] = ffi.buffer(buf, length)[:]
    return compiled


def install(*, kill: bool = False) -> None:
    """Filter every thread of this process from now on (cannot be undone)."""
    compiled = program(kill=kill)
    testing = bool(os.environ.get(SELFTEST_ENV))
    if testing:
        # Now: once the filter is on, a module with a shared object cannot
        # be imported (mmap with PROT_EXEC is refused).
        import fcntl  # noqa: F401
        import socket  # noqa: F401
    err = lib.pyvmm_sandbox_load(ffi.from_buffer(compiled), len(compiled))
    if err:
        raise _error(err)
    if testing:
        selftest()


def _error(err: int) -> HostError:
    return HostError(
        f"cannot install the sandbox (seccomp): {os.strerror(-err)} (--no-sandbox runs without)"
    )


def selftest() -> None:
    """Try calls outside the list; each must fail with EPERM."""
    import fcntl  # (imported before the filter: install)
    import socket

    attempts = {
        "socket": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close(),
        "execve": lambda: os.execv("/bin/true", ["true"]),
        "open for writing": lambda: os.close(
            os.open("/tmp/pyvmm-sandbox-selftest", os.O_WRONLY | os.O_CREAT)
        ),
        # FIONREAD (termios cannot be imported now: a new shared object
        # needs PROT_EXEC), not one of KVM's requests; any fd answers it.
        "non-KVM ioctl": lambda: fcntl.ioctl(2, 0x541B, bytes(4)),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            outcome = "allowed"
        except OSError as err:
            outcome = f"refused: {err.strerror}"
        sys.stderr.write(f"pyvmm: sandbox self-test: {what}: {outcome}\n")
    sys.stderr.flush()


def drop_privileges(user: str) -> None:
    """Become ``user`` (and its groups) for good; the devices stay open."""
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise HostError(f"--user: no user named '{user}'") from None
    try:
        os.initgroups(entry.pw_name, entry.pw_gid)
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
    except OSError as err:
        raise HostError(f"--user={user}: cannot switch user: {err.strerror}") from None
