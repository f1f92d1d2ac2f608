"""The sandbox: once set-up is over, a seccomp filter on every thread.

``install()`` runs right before the guest's first instruction, when every
file descriptor pyvmm will use is open (/dev/kvm, the VM and vCPU, guest
memory, taps, block images, eventfds, the KVM statistics fd, --stats-json,
--trace's file) and every thread exists (the IO thread, the statistics
threads). From then on the process may only use what the run loop, the C
fast path, the IO thread, the statistics threads and Python's own runtime
need to run the guest and tear everything down (the list below, found with
``strace -f`` over every device, mode and exit path; docs/security.md).
It opens no file at all: nothing a compromised pyvmm could read of the
host. Anything else fails with EPERM: Python turns that into an
``OSError`` that ends the run with one line and a normal teardown, where a
kill (solo5-hvt's choice) would leave no message and skip the clean-up.
no_new_privs is set first, and the filter is synchronised to every thread
(SECCOMP_FILTER_FLAG_TSYNC).

Built on libseccomp (csrc/sandbox.c): names, not numbers, so one list
serves every architecture (a name an architecture lacks is skipped). The
filter is compiled to BPF once per process (``program``: 0.4 ms of
libseccomp, or read as the build compiled it: sandbox_prebuilt.py), with
placeholders for the values only the filtered process knows (its pid, its
VM's and vCPU's fds), and ``install`` writes those into a copy and loads
it: the warm launcher compiles before it forks (pyvmm/serve/warm.py), so
each VM's child only binds and loads.
"""

from __future__ import annotations

import os
import sys

from pyvmm._native import ffi, lib
from pyvmm.common.errors import HostError
from pyvmm.common.values import MAX_ID, is_decimal
from pyvmm.host import sandbox_prebuilt

# What a thread of pyvmm may still ask the kernel for while the guest runs,
# whatever the arguments. Added in C with argument checks: tgkill (to this
# process), sched_getaffinity/sched_setaffinity (the calling thread),
# fcntl (F_GETFD F_SETFD F_GETFL, F_SETFL without O_ASYNC), madvise
# (MADV_DONTNEED), mmap/mprotect (never PROT_EXEC) and ioctl (KVM's
# requests on the vCPU fd, KVM_IOEVENTFD on the VM fd, two terminal
# queries). Not there at all: open, openat, openat2, stat of a path.
ALLOW = (
    # Frames, blocks, console output, eventfds, counters: taps (read/write,
    # readv/writev), block images (preadv/pwritev), the KVM stats fd (pread).
    "read", "write", "readv", "writev", "pread64", "pwrite64",
    "preadv", "pwritev", "preadv2", "pwritev2", "lseek",
    "fsync", "fdatasync",
    # Waiting: the poll hypercall, the IO thread, console back-pressure.
    "poll", "ppoll", "select", "pselect6",
    "epoll_wait", "epoll_pwait", "epoll_ctl",
    # --tap-read=uring: the IO thread's batched tap reads. Only a ring made
    # before the filter can be entered (io_uring_setup is refused), and that
    # one is restricted to READV on its own taps and the cancel of its own
    # reads (csrc/tap_io.h); any other fd refuses both calls.
    "io_uring_enter", "io_uring_register",
    "futex", "sched_yield", "nanosleep", "clock_nanosleep",
    "clock_gettime", "clock_getres", "gettimeofday", "time", "getcpu",
    # Signals: the stop handlers, SIGUSR1's sigwait, their restore at exit
    # (the kick of the vCPU thread, tgkill, is added in C).
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigtimedwait",
    "sigaltstack", "getpid", "gettid", "restart_syscall",
    # Teardown: fds closed (a block image's flock goes with it), memory
    # unmapped, threads joined, the process ends.
    "close", "flock", "munmap", "mremap", "brk",
    "exit", "exit_group",
    # Python's runtime: an open fd's status, its allocator, randomness.
    "fstat", "getcwd", "getrandom",
    "getuid", "geteuid", "getgid", "getegid", "uname", "sysinfo",
    "rseq", "set_robust_list",
)  # fmt: skip

# A debugging aid (docs/security.md): after installing the filter, try what
# the filter must refuse, and say what happened on stderr.
SELFTEST_ENV = "PYVMM_SANDBOX_SELFTEST"


#: The compiled programs of this process, by action (``program``).
_programs: dict[bool, bytes] = {}


def program(*, kill: bool = False) -> bytes:
    """The filter compiled to BPF, its pid and fds still placeholders: the
    same rules give the same program, so it is built once per process (or
    read as the build wrote it: pyvmm/host/sandbox_prebuilt.py), and a
    process forked after the build (a launcher's VM) inherits it."""
    compiled = _programs.get(kill)
    if compiled is None:
        compiled = sandbox_prebuilt.load(ALLOW, kill)
        if compiled is None:
            compiled = compile_program(kill)
        _programs[kill] = compiled
    return compiled


def compile_program(kill: bool) -> bytes:
    """The filter compiled by libseccomp now."""
    names = [ffi.new("char[]", n.encode()) for n in ALLOW]
    array = ffi.new("char *[]", names)
    action = lib.PYVMM_SANDBOX_KILL if kill else lib.PYVMM_SANDBOX_ERRNO
    size = lib.PYVMM_SANDBOX_PROG_MAX
    buf = ffi.new("char[]", size)
    length = lib.pyvmm_sandbox_build(array, len(names), action, buf, size)
    if length < 0:
        raise _error(length)
    return ffi.buffer(buf, length)[:]


def write_prebuilt(directory: str | None = None) -> list[str]:
    """Both programs compiled now and written beside the extension (or in
    ``directory``) for the processes to come: the build's step."""
    return sandbox_prebuilt.write(ALLOW, compile_program, directory)


def bound(*, vm_fd: int, vcpu_fd: int, kill: bool = False) -> bytes:
    """The program with this process's pid and its VM's and vCPU's fds."""
    compiled = program(kill=kill)
    buf = ffi.new("char[]", compiled)
    err = lib.pyvmm_sandbox_bind(buf, len(compiled), os.getpid(), vm_fd, vcpu_fd)
    if err:
        raise _error(err)
    return ffi.buffer(buf, len(compiled))[:]


def install(*, kvm_fd: int, vm_fd: int, vcpu_fd: int, kill: bool = False) -> None:
    """Filter every thread of this process from now on (cannot be undone).

    ioctls then reach only the VM (``vm_fd``) and the vCPU (``vcpu_fd``);
    /dev/kvm (``kvm_fd``) gets none: the self-test tries KVM_CREATE_VM on it.
    """
    prog = bound(vm_fd=vm_fd, vcpu_fd=vcpu_fd, kill=kill)
    _before_the_filter()
    testing = _SelfTest(kvm_fd, vm_fd, vcpu_fd) if os.environ.get(SELFTEST_ENV) else None
    err = lib.pyvmm_sandbox_load(ffi.from_buffer(prog), len(prog))
    if err:
        raise _error(err)
    if testing is not None:
        testing.run()


def _error(err: int) -> HostError:
    return HostError(
        f"cannot install the sandbox (seccomp): {os.strerror(-err)} (--no-sandbox runs without)"
    )


def _before_the_filter() -> None:
    """What the run would otherwise open later, done now: --trace's
    timeline starts at the process start, which /proc/self/stat tells when
    the native launcher did not (a read once the filter is on would be
    refused)."""
    from pyvmm.common import trace

    if trace.enabled and not trace.start_ns:
        trace.process_start_ns()  # read now, kept for the timeline's end


# The calls the self-test makes through libc's syscall(), by architecture.
_SYSCALLS = {
    "x86_64": {"open": 2, "tkill": 200, "tgkill": 234, "io_uring_setup": 425, "openat2": 437},
    "aarch64": {"tkill": 130, "tgkill": 131, "io_uring_setup": 425, "openat2": 437},
}
_KVM_CREATE_VM, _KVM_CREATE_VCPU, _KVM_GET_API_VERSION = 0xAE01, 0xAE41, 0xAE00
_KVM_GET_MP_STATE = 0x8004AE98
_MADV_HWPOISON = 100
_AT_FDCWD = -100


class _SelfTest:
    """``PYVMM_SANDBOX_SELFTEST=1``: right after the filter goes on, try
    what it must refuse (each must fail with EPERM) and, as controls, what
    the run needs of the same calls (each must pass), and say on stderr
    what happened. Everything the attempts need (modules, libc, a pipe, a
    page) is made here, before the filter."""

    def __init__(self, kvm_fd: int, vm_fd: int, vcpu_fd: int) -> None:
        import ctypes
        import fcntl
        import mmap
        import signal
        import socket
        import threading

        self.kvm_fd, self.vm_fd, self.vcpu_fd = kvm_fd, vm_fd, vcpu_fd
        self.parent = os.getppid()
        self.parent_cpus = os.sched_getaffinity(self.parent)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.ctypes, self.fcntl, self.mmap, self.socket = ctypes, fcntl, mmap, socket
        self.signal, self.main_thread = signal, threading.main_thread().ident
        self.pipe = os.pipe()
        self.page = mmap.mmap(-1, mmap.PAGESIZE)
        self.numbers = _SYSCALLS.get(os.uname().machine, {})

    def _syscall(self, name: str, *args: object) -> int:
        ctypes = self.ctypes
        self.libc.syscall.restype = ctypes.c_long
        ret = self.libc.syscall(ctypes.c_long(self.numbers[name]), *args)
        if ret < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return ret

    def attempts(self) -> dict[str, object]:
        """What to try: name -> a call (what one lets through is closed)."""
        ctypes, fcntl, parent = self.ctypes, self.fcntl, self.parent
        shadow = b"/etc/shadow"
        out: dict[str, object] = {
            "socket": lambda: _closed(
                self.socket.socket(self.socket.AF_INET, self.socket.SOCK_DGRAM)
            ),
            "execve": lambda: os.execv("/bin/true", ["true"]),
            "open for writing": lambda: _closed(os.open(os.devnull, os.O_WRONLY)),
            "open for reading (/etc/shadow)": lambda: _closed(os.open("/etc/shadow", os.O_RDONLY)),
            "open of another process's memory": lambda: _closed(
                os.open(f"/proc/{parent}/mem", os.O_RDONLY)
            ),
            "open of /dev/kvm": lambda: _closed(os.open("/dev/kvm", os.O_RDONLY)),
        }
        if "open" in self.numbers:
            out["open (the older call)"] = lambda: _closed(
                self._syscall("open", shadow, os.O_RDONLY)
            )
        how = (ctypes.c_uint64 * 3)(os.O_RDONLY, 0, 0)
        out["openat2"] = lambda: _closed(
            self._syscall("openat2", ctypes.c_int(_AT_FDCWD), shadow, how, ctypes.c_size_t(24))
        )
        out |= {
            "stat of a path": lambda: os.stat("/etc/shadow"),
            # FIONREAD (termios cannot be imported now: a new shared object
            # needs PROT_EXEC), not one of KVM's requests; any fd answers it.
            "non-KVM ioctl": lambda: fcntl.ioctl(2, 0x541B, bytes(4)),
            "KVM ioctl on another fd": lambda: fcntl.ioctl(2, _KVM_GET_API_VERSION),
            "KVM_CREATE_VM on its /dev/kvm": lambda: _closed(
                fcntl.ioctl(self.kvm_fd, _KVM_CREATE_VM)
            ),
            "KVM_CREATE_VCPU on its VM": lambda: _closed(
                fcntl.ioctl(self.vm_fd, _KVM_CREATE_VCPU, 1)
            ),
            "kill of another process": lambda: os.kill(parent, 0),
            "tgkill of another process": lambda: self._syscall("tgkill", parent, parent, 0),
            "tkill": lambda: self._syscall("tkill", parent, 0),
            "sched_setaffinity of another process": lambda: os.sched_setaffinity(
                parent, self.parent_cpus
            ),
            "sched_getaffinity of another process": lambda: os.sched_getaffinity(parent),
            "fcntl F_SETOWN": lambda: fcntl.fcntl(self.pipe[1], fcntl.F_SETOWN, parent),
            "fcntl F_SETFL O_ASYNC": lambda: fcntl.fcntl(self.pipe[1], fcntl.F_SETFL, os.O_ASYNC),
            "fcntl F_DUPFD": lambda: _closed(fcntl.fcntl(self.pipe[1], fcntl.F_DUPFD_CLOEXEC, 0)),
            "madvise MADV_HWPOISON": lambda: self._madvise(_MADV_HWPOISON, 0x10000),
            "io_uring_setup": lambda: _closed(
                self._syscall("io_uring_setup", ctypes.c_uint(1), (ctypes.c_char * 120)())
            ),
            "mmap with PROT_EXEC": lambda: _closed(
                self.mmap.mmap(
                    -1, self.mmap.PAGESIZE, prot=self.mmap.PROT_READ | self.mmap.PROT_EXEC
                )
            ),
            # Controls: what the run itself does with the same calls.
            "tgkill of its own thread": lambda: self.signal.pthread_kill(self.main_thread, 0),
            "sched_getaffinity of its own thread": lambda: os.sched_getaffinity(0),
            "fcntl F_GETFL": lambda: fcntl.fcntl(self.pipe[1], fcntl.F_GETFL),
            "madvise MADV_DONTNEED": lambda: self._madvise(4, self._page_address()),
            "KVM ioctl on its vCPU": lambda: fcntl.ioctl(self.vcpu_fd, _KVM_GET_MP_STATE, bytes(4)),
        }
        return out

    def _page_address(self) -> int:
        ctypes = self.ctypes
        return ctypes.addressof(ctypes.c_char.from_buffer(self.page))

    def _madvise(self, advice: int, address: int) -> None:
        """madvise of one page at ``address`` (MADV_HWPOISON: an unmapped
        one, so that a filter letting it through harms nothing)."""
        ctypes = self.ctypes
        madvise = self.libc.madvise
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        if madvise(address, self.mmap.PAGESIZE, advice) < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def run(self) -> None:
        import errno

        for what, attempt in self.attempts().items():
            try:
                attempt()
                outcome = "allowed"
            except OSError as err:
                if err.errno == errno.EPERM:
                    outcome = f"refused: {err.strerror}"
                else:  # passed by the filter, failed in the kernel
                    outcome = f"allowed (the kernel said: {err.strerror})"
            sys.stderr.write(f"pyvmm: sandbox self-test: {what}: {outcome}\n")
        sys.stderr.flush()


def _closed(made: object) -> None:
    """Close what an attempt the filter let through made (an fd, a socket,
    a mapping)."""
    if isinstance(made, int):
        os.close(made)
    else:
        made.close()


def resolve_user(user: str) -> tuple[int, int, str | None]:
    """--user's USER: a name from the host's user database, or ``UID:GID``
    in numbers, which is what an OCI bundle's process.user gives (ids that
    need no name on the host). Returns the uid, the gid and the name (None
    for numbers: the run then keeps no supplementary group)."""
    import pwd

    uid_text, colon, gid_text = user.partition(":")
    if colon:
        if not (is_decimal(uid_text) and is_decimal(gid_text)):
            raise HostError(f"--user={user}: not a user name nor UID:GID in numbers")
        uid, gid = int(uid_text), int(gid_text)
        if uid > MAX_ID or gid > MAX_ID:
            raise HostError(f"--user={user}: an id is at most {MAX_ID}")
        return uid, gid, None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise HostError(f"--user: no user named '{user}'") from None
    return entry.pw_uid, entry.pw_gid, entry.pw_name


def drop_privileges(user: str) -> None:
    """Become ``user`` (and its groups) for good; the devices stay open."""
    uid, gid, name = resolve_user(user)
    try:
        if name is None:
            os.setgroups([])
        else:
            os.initgroups(name, gid)
        os.setgid(gid)
        os.setuid(uid)
    except OSError as err:
        raise HostError(f"--user={user}: cannot switch user: {err.strerror}") from None


if __name__ == "__main__":  # the build's step (setup.py): python -m pyvmm.host.sandbox
    for written in write_prebuilt():
        print(written)
