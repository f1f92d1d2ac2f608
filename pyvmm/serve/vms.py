"""The launcher's side of a VM: from a request to a forked child, and its record.

``prepare`` does in the launcher what needs no host resource: the command
line through cli.py's own parser, and the plan (the unikernel read and
checked, devices matched to its manifest, memory laid out), so a bad
option or a kernel that fails to load is answered at once, with the line
the command would print. ``spawn`` forks; everything that opens a host
resource (taps, /dev/kvm, memory, threads) happens in the child.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from pyvmm.command import cli
from pyvmm.common import stopping
from pyvmm.common.errors import PyvmmError, UsageError
from pyvmm.serve import child
from pyvmm.serve.http import HttpError
from pyvmm.serve.relay import StderrRelay
from pyvmm.serve.warm import HostFacts, precompute
from pyvmm.vm.plan import make_plan
from pyvmm.vm.snapshot.restore import Restore

ID_OK = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # (fullmatch: no "$", which takes a "\n")
#: Passed fds a request may carry: the guest's console and pyvmm's stderr.
MAX_FDS = 2
#: The longest path a request may name (PATH_MAX less its NUL).
MAX_PATH = 4095


class Vm:
    """One VM the launcher started: its process and what is known of it."""

    __slots__ = (
        "id", "pid", "pidfd", "channel", "argv", "kernel", "arrived_ns", "state",
        "exit_status", "signal", "error", "times", "cpu_ns", "final", "imported_after_fork",
        "listed", "pool", "pooled", "refill", "relay", "snapshot",
    )  # fmt: skip

    def __init__(
        self,
        id: str,
        pid: int,
        pidfd: int,
        channel: socket.socket,
        argv: list[str],
        kernel: str,
        arrived_ns: int,
    ) -> None:
        self.id = id
        self.pid = pid
        self.pidfd = pidfd
        self.channel = channel
        self.argv = argv
        self.kernel = kernel
        self.arrived_ns = arrived_ns
        self.state = "starting"  # -> running -> exited
        self.exit_status: int | None = None
        self.signal: str | None = None
        self.error: str | None = None
        #: Start-up times (CLOCK_MONOTONIC ns) the child reported.
        self.times: dict[str, int] = {}
        #: CPU time spent starting it: the launcher's (parse, plan, fork)
        #: and the child's (until its first KVM_RUN), ns; unlike wall time,
        #: it does not grow with the host's load.
        self.cpu_ns: dict[str, int] = {}
        self.final: dict[str, Any] | None = None
        self.imported_after_fork: list[str] = []
        #: Whether a failed create already reported it (then it is not listed).
        self.listed = True
        #: The pool it was prepared for (server.Pool's key), until it starts.
        self.pool: tuple | None = None
        #: Prepared ahead of its request (a pool's).
        self.pooled = False
        #: The pool to refill once this pooled VM has started.
        self.refill: tuple | None = None
        #: Its stderr copied to the launcher's log, named (relay.py), if it
        #: has no console of its own.
        self.relay: StderrRelay | None = None
        #: The snapshot being taken of it (snapshot.Taking) and its client.
        self.snapshot: tuple[Any, Any] | None = None

    @property
    def start_latency_us(self) -> float | None:
        """From the request's first byte to right before the first KVM_RUN."""
        running = self.times.get("running")
        return None if running is None else round((running - self.arrived_ns) / 1000, 1)

    def view(self) -> dict[str, Any]:
        """The VM as GET /vms/ID shows it."""
        out: dict[str, Any] = {
            "id": self.id,
            "pid": self.pid,
            "state": self.state,
            "kernel": self.kernel,
            "argv": self.argv,
            "exit_status": self.exit_status,
            "start_latency_us": self.start_latency_us,
        }
        if self.times:
            base = self.arrived_ns
            out["start_us"] = {k: round((v - base) / 1000, 1) for k, v in self.times.items()}
        if self.cpu_ns:
            out["start_cpu_us"] = {k: round(v / 1000, 1) for k, v in self.cpu_ns.items()}
        if self.pooled:
            out["pooled"] = True
        if self.signal:
            out["signal"] = self.signal
        if self.error:
            out["error"] = self.error
        if self.imported_after_fork:
            out["imported_after_fork"] = self.imported_after_fork
        return out


@contextlib.contextmanager
def _in_directory(path: str | None) -> Iterator[None]:
    """Relative paths in the request are the client's: plan (and fork) there."""
    if path is None:
        yield
        return
    home = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.chdir(path)
        except OSError as err:
            raise HttpError(400, f"pyvmm: cwd={path}: {err.strerror}") from None
        yield
    finally:
        os.fchdir(home)
        os.close(home)


def _strings(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise HttpError(400, f'"{key}" must be a list of strings (the command line after pyvmm)')
    return value


def checked_id(body: dict[str, Any]) -> str | None:
    """The request's "id", if given: 1-64 of [A-Za-z0-9_.-]."""
    vm_id = body.get("id")
    if vm_id is not None and (not isinstance(vm_id, str) or not ID_OK.fullmatch(vm_id)):
        shown = repr(vm_id)[:80]
        raise HttpError(400, f'"id" must be 1-64 of [A-Za-z0-9_.-], not {shown}')
    return vm_id


def optional_path(body: dict[str, Any], key: str) -> str | None:
    """A path in the request ("cwd", "stdout", "stderr"), if given: a
    string the kernel could take as a path. Its length is bounded here,
    with the request's answer, so that it also fits in the message that
    hands a pooled VM its console."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise HttpError(400, f'"{key}" must be a non-empty string')
    if len(value.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise HttpError(400, f'"{key}" is longer than {MAX_PATH} bytes (PATH_MAX)')
    return value


KNOWN_KEYS = {"argv", "id", "cwd", "stdout", "stderr", "wait", "restore"}


def command_line(body: dict[str, Any]) -> list[str]:
    """The request's command line: "argv", or with "restore": DIR, the
    command's ``--restore=DIR`` and the devices' options in "argv"."""
    if "restore" not in body:
        return _strings(body, "argv")
    snapshot = optional_path(body, "restore")
    argv = _strings(body, "argv") if "argv" in body else []
    return [f"--restore={snapshot}", *argv]


class Prepared:
    """A create request made ready to fork: what the child runs, and the
    request's own words. ``close`` lets go of what the launcher holds for
    it (a snapshot's memory file: the child inherits its own)."""

    __slots__ = ("spec", "argv", "id", "cwd")

    def __init__(self, spec: child.ChildSpec, argv: list[str], id: str | None, cwd: str | None):
        self.spec = spec
        self.argv = argv
        self.id = id
        self.cwd = cwd

    def close(self) -> None:
        if self.spec.restore is not None:
            self.spec.restore.close()


def pool_key(body: dict[str, Any]) -> tuple[tuple[str, ...], str | None]:
    """What a pool and a create must share: the command line and directory."""
    return tuple(command_line(body)), optional_path(body, "cwd")


def _refuse_descriptor_numbers(devices: dict[str, dict[str | None, Any]]) -> None:
    """A device given as @FD: in a request, the number would name one of the
    launcher's descriptors (or its child's), not one the client holds."""
    for flag, attached in devices.items():
        for name, value in attached.items():
            if isinstance(value, str) and value.startswith("@"):
                option = f"--{flag}" if name is None else f"--{flag}:{name}"
                raise UsageError(
                    f"{option}={value}: the launcher cannot take a descriptor number "
                    "(it would name one of the launcher's own): name the tap or the file"
                )


def prepare(body: dict[str, Any], fds: list[int], facts: HostFacts) -> Prepared:
    """A create request's body -> what the child runs, or HttpError 400
    with the line the command would print."""
    unknown = sorted(set(body) - KNOWN_KEYS)
    if unknown:
        raise HttpError(400, f"unknown key {unknown[0]!r} (known: {', '.join(sorted(KNOWN_KEYS))})")
    argv = command_line(body)
    vm_id = checked_id(body)
    cwd = optional_path(body, "cwd")
    if len(fds) > MAX_FDS:
        raise HttpError(400, f"at most {MAX_FDS} file descriptors (stdout, stderr), got {len(fds)}")
    restoring = None
    try:
        cmd = cli.parse_command(argv)
        if cmd.action != "run":
            raise UsageError(
                f"the launcher runs guests: {cmd.action} is the command's own "
                f"(pyvmm --{cmd.action})"
            )
        _refuse_descriptor_numbers(cmd.config.devices)
        with _in_directory(cwd), child._logged(cmd.log_level, child._Notes()) as notes:
            if cmd.config.restore is not None:  # read and checked here, mapped by the child
                restoring = Restore(cmd.config.restore)
                restoring.configure(cmd.config)
            plan = make_plan(
                cmd.config, machine=facts.machine, flavour=facts.flavour, load=facts.kernels.load
            )
            if restoring is not None:
                restoring.check_plan(plan)
            else:
                precompute(plan)
    except PyvmmError as err:
        if restoring is not None:
            restoring.close()
        raise HttpError(400, f"pyvmm: {err}") from None
    spec = child.ChildSpec(
        config=cmd.config,
        plan=plan,
        log_level=cmd.log_level,
        notes=notes.lines,
        stdout_path=optional_path(body, "stdout"),
        stderr_path=optional_path(body, "stderr"),
        fds=fds,
        cwd=cwd,
        trace=getattr(cmd, "trace", None),
        restore=restoring,
    )
    return Prepared(spec, argv, vm_id, cwd)


def spawn(
    vm_id: str,
    prepared: Prepared,
    arrived_ns: int,
    close_in_child: Callable[[], None],
) -> Vm:
    """Fork the VM's process (this process must have one thread)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    prepared.spec.arrived_ns = arrived_ns
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stopping.STOP_SIGNALS)
    try:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                forked = time.monotonic_ns()
                close_in_child()
                ours.close()
                status = child.main(prepared.spec, theirs.detach(), parent, forked)
            finally:
                with contextlib.suppress(BaseException):
                    sys.stdout.flush()
                os._exit(status)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    theirs.close()
    prepared.close()  # the child has its own
    ours.setblocking(False)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as err:  # out of fds: this VM cannot be watched, so it goes
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        ours.close()
        raise HttpError(503, f"pyvmm: cannot watch the VM's process: {err.strerror}") from None
    return Vm(
        id=vm_id,
        pid=pid,
        pidfd=pidfd,
        channel=ours,
        argv=prepared.argv,
        kernel=prepared.spec.config.kernel,
        arrived_ns=arrived_ns,
    )


def describe_status(wait_status: int) -> tuple[int, str | None]:
    """(exit status as a shell shows it, the signal's name if one killed it)."""
    code = os.waitstatus_to_exitcode(wait_status)
    if code >= 0:
        return code, None
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return 128 - code, name
