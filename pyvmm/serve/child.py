"""A VM's own process: what the launcher's child does between fork and exit.

The child is a pyvmm run like the command's (the same ``Vmm``, stop
signals, sandbox, counters, one-line errors, exit status), with three
differences: its plan was made by the launcher before the fork; it dies
with the launcher (PR_SET_PDEATHSIG, so a launcher killed with SIGKILL
leaves no VM behind: the SIGTERM ends the run and its clean-up closes the
taps); and it talks to the launcher over a SOCK_SEQPACKET channel, one
JSON object per packet:

    child -> launcher  {"event": "running", ...}    right before the first KVM_RUN
                       {"event": "error", ...}      the run could not start or failed
                       {"event": "stats", ...}      an answer to b"s"
                       {"event": "final", ...}      the counters at the end
                       {"event": "prepared", ...}   a pooled VM, ready for b"go"
                       {"event": "snapshot", ...}   its state for a snapshot (snapshot.py)
    launcher -> child  b"s"                         the counters, now please
                       b"go" + JSON, console fds    a pooled VM: start now
                       b"S" + JSON, b"S+", b"S-"    a snapshot: take it, written, given up

The channel is read and written with read(2)/write(2) only: the sandbox
allows those (not send/recv) once the guest runs.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pyvmm.common import stopping
from pyvmm.common.errors import PyvmmError, stop_message
from pyvmm.devices.console import ConsoleClosed
from pyvmm.serve.snapshot import KICK_EVERY, Snapshotter
from pyvmm.vm.config import VmConfig
from pyvmm.vm.plan import Plan
from pyvmm.vm.snapshot.restore import Restore
from pyvmm.vm.statsview import StatsOutput, open_json
from pyvmm.vm.vmm import Vmm

PR_SET_PDEATHSIG = 1
#: The longest packet read from the launcher (SOCK_SEQPACKET: a shorter read
#: cuts it): b"S" and a snapshot request's JSON, whose "dir" of at most
#: PATH_MAX - 1 bytes JSON escapes to at most 6 bytes a byte (about 24 KiB).
REQUEST_LIMIT = 64 * 1024
#: The console's fds a pooled VM takes with b"go" (stdout, stderr).
MAX_GO_FDS = 2


class ChildSpec:
    """Everything the child needs, prepared by the launcher before the fork.

    ``notes``: log lines the plan produced in the launcher ("adjusting
    memory ..."), written to the child's stderr first; ``stdout_path``,
    ``stderr_path``, ``fds``: the console, files by path (opened by the
    child) or passed fds; ``cwd``: the client's directory (relative paths in
    its options are its own); ``pooled``: prepared ahead for a pool
    (server.py), set up to the first instruction, then waiting for b"go"
    with the console; ``trace``: --trace, None (off), "" (stderr) or the
    JSON file, its timeline from the request's first byte (``arrived_ns``,
    CLOCK_MONOTONIC)."""

    __slots__ = (
        "config", "plan", "log_level", "notes", "stdout_path", "stderr_path", "fds", "cwd",
        "pooled", "trace", "arrived_ns", "restore",
    )  # fmt: skip

    def __init__(
        self,
        config: VmConfig,
        plan: Plan,
        log_level: str,
        notes: list[str] | None = None,
        stdout_path: str | None = None,
        stderr_path: str | None = None,
        fds: list[int] | None = None,
        cwd: str | None = None,
        pooled: bool = False,
        trace: str | None = None,
        arrived_ns: int = 0,
        restore: Restore | None = None,
    ) -> None:
        self.config = config
        self.plan = plan
        self.log_level = log_level
        self.notes = [] if notes is None else notes
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.fds = [] if fds is None else fds
        self.cwd = cwd
        self.pooled = pooled
        self.trace = trace
        self.arrived_ns = arrived_ns
        #: --restore: the snapshot, read and checked by the launcher.
        self.restore = restore


def _send(fd: int, message: dict[str, Any]) -> None:
    try:
        os.write(fd, json.dumps(message).encode())
    except OSError:
        pass  # the launcher is gone: PR_SET_PDEATHSIG stops this run


#: libc's calls, looked up here in the launcher: a dlopen and a lookup in
#: each child cost 0.5 ms.
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_signalfd = _libc.signalfd
SFD_NONBLOCK = os.O_NONBLOCK
SFD_CLOEXEC = os.O_CLOEXEC
#: A sigset_t of SIGUSR1 alone (read only).
_USR1_SET = (ctypes.c_ulong * 16)(1 << (signal.SIGUSR1 - 1))


def die_with_parent(parent: int) -> None:
    """SIGTERM when the launcher dies; if it died already, end now."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGTERM)


def usr1_fd() -> int:
    """SIGUSR1 blocked in this thread (and so in every thread started from
    now on) and readable from the fd returned (signalfd): the channel's
    thread takes it, so no thread of its own waits for it (the command's
    watcher thread cost 1-2 ms of every start here)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    fd = _signalfd(-1, _USR1_SET, SFD_NONBLOCK | SFD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise PyvmmError(f"cannot take SIGUSR1 (signalfd): {os.strerror(err)}")
    return fd


def _console(spec: ChildSpec) -> None:
    """fd 1: the guest's console; fd 2: pyvmm's messages; fd 0: /dev/null."""
    targets = {1: spec.stdout_path, 2: spec.stderr_path}
    passed = spec.fds + spec.fds[-1:] if spec.fds else []
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for target, path in targets.items():
        if path is not None:
            name = "stdout" if target == 1 else "stderr"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            except OSError as err:
                raise _OpenError(f"{name}={path}: cannot open: {err.strerror}") from None
            os.dup2(fd, target)
            os.close(fd)
        elif passed:
            os.dup2(passed[target - 1], target)
    for fd in spec.fds:
        os.close(fd)


class _OpenError(PyvmmError):
    pass


class _LauncherVmm(Vmm):
    """A ``Vmm`` that says when its guest's first instruction is next, and
    takes a snapshot when the launcher asks (snapshot.py)."""

    def __init__(
        self,
        config: VmConfig,
        plan: Plan,
        on_first_run: Callable[[], None],
        restore: Restore | None = None,
    ) -> None:
        self._on_first_run = on_first_run
        self._restore = restore
        self.snapshotter: Snapshotter | None = None
        super().__init__(config, plan)

    def _open_snapshot(self, config: VmConfig) -> Restore:
        """The launcher's: read, checked and its settings in ``config``."""
        restoring = self._restore
        if restoring is None:
            return super()._open_snapshot(config)
        self.stack.callback(restoring.close)
        return restoring

    def _loop(self) -> int:
        if self.snapshot is None and self.snapshotter is not None:
            self.snapshot = self.snapshotter  # its wrap_run around vcpu.run
        self._on_first_run()
        return super()._loop()


class _Channel:
    """The child's side of the channel, on its own thread (started before
    the sandbox, which keeps every thread): it says when the guest has
    started, answers the launcher's b"s" with the counters, and prints
    them on SIGUSR1 (``usr1_fd``) as the command's watcher thread does.

    The vCPU thread only records its start (``started``) right before the
    first KVM_RUN: a message from it would wake the launcher (and its
    client) at the moment the guest needs the CPU, measured here as up to
    several milliseconds on a loaded 2-core host. This thread looks every
    millisecond until then and sends it, the guest running by then."""

    POLL = 0.001

    def __init__(self, fd: int, vmm: Vmm, usr1: int, snapshotter: Snapshotter) -> None:
        self.fd = fd
        self.vmm = vmm
        self.usr1 = usr1
        self.snapshotter = snapshotter
        #: Where SIGUSR1 prints (set once the run's counters output exists).
        self.output: StatsOutput | None = None
        self.lock = threading.Lock()
        self.final: dict[str, Any] | None = None
        self.started: dict[str, Any] | None = None
        self._told = False
        # Not threading.Thread: its start() waits until the new thread has
        # run, a scheduling round trip on the way to the guest's start.
        _thread.start_new_thread(self._loop, ())

    def _loop(self) -> None:
        import select

        watched = [self.fd, self.usr1]
        snapshotter = self.snapshotter
        while True:
            timeout = None if self._told else self.POLL
            if snapshotter.pending:  # the kick again, until the vCPU stops
                timeout = KICK_EVERY
            try:
                ready, _, _ = select.select(watched, [], [], timeout)
            except OSError:
                return
            if snapshotter.pending:
                snapshotter.kick()
            if not self._told and self.started is not None:
                self.tell_started()
            if self.usr1 in ready:
                self._print_counters()
            if self.fd in ready and not self._answer():
                return

    def tell_started(self) -> None:
        """Send the start once (also from the vCPU thread when the run has
        ended first: a guest may be done within the millisecond)."""
        with self.lock:
            started = self.started
            if started is not None and not self._told:
                self._told = True
                _send(self.fd, started)

    def _print_counters(self) -> None:
        """SIGUSR1: the counters so far on stderr (until the run's end)."""
        try:
            os.read(self.usr1, 4096)  # every signalfd_siginfo waiting
        except OSError:
            return
        output = self.output
        if output is not None and self.final is None:
            output.print_summary()

    def _answer(self) -> bool:
        """One request answered; False once the launcher is gone."""
        try:
            packet = os.read(self.fd, REQUEST_LIMIT)
        except OSError:
            return False
        if not packet:
            return False
        if packet.startswith(b"S"):
            self.snapshotter.asked(packet)
            return True
        with self.lock:
            try:
                report = self.final or self.vmm.counters()
                message = {"event": "stats", "report": report}
            except Exception as err:  # tearing down: say so, keep serving
                message = {"event": "stats", "error": f"no counters: {err}"}
        _send(self.fd, message)
        return True

    def finish(self) -> dict[str, Any]:
        with self.lock:
            self.final = self.vmm.counters()
        return self.final


def _run(spec: ChildSpec, channel: int, usr1: int, times: dict[str, int]) -> tuple[int, Any]:
    """Run the guest; (exit status, final counters)."""
    config = spec.config
    cpu_base = 0
    # No garbage collection until the guest runs: the start makes little
    # garbage, and each collection wrote to the pages of the objects it
    # walked (copied from the launcher, 0.1-0.3 ms of every start).
    collecting = gc.isenabled()
    gc.disable()
    answer: _Channel

    def first_run() -> None:
        times["running"] = time.monotonic_ns()
        if collecting:
            gc.enable()
        cpu = time.process_time_ns() - cpu_base  # every thread's, since the fork or b"go"
        answer.started = {"event": "running", "times": dict(times), "cpu_ns": cpu}

    def console() -> None:
        _console(spec)
        # The handler made at the first line shown (most runs show none),
        # not here (0.6 ms of every start).
        stopping.defer_logging(spec.log_level)
        for note in spec.notes:
            stopping.say(note)

    notes = _Notes()
    if not spec.pooled:
        console()
    # --stats-json opened before the set-up, as the command does; "-" (the
    # console) by a pooled VM only once it has its console.
    stdout_json = spec.pooled and config.stats_json == "-"
    json_out = open_json(config.stats_json) if config.stats_json and not stdout_json else None
    if not spec.pooled:
        from pyvmm.common import trace

        trace.mark("child: console, --stats-json")
    keep = {0, 1, 2, channel, usr1} | ({json_out.fileno()} if json_out is not None else set())
    if spec.restore is not None:
        keep.add(spec.restore.memory_fd)
    _let_go_of_others(spec, keep)
    if not spec.pooled:
        trace.mark("child: other VMs' images and the launcher's fds let go")
    with _logged(spec.log_level, notes) if spec.pooled else contextlib.nullcontext():
        vmm = _LauncherVmm(config, spec.plan, first_run, spec.restore)

    def counters_output() -> StatsOutput:
        output = StatsOutput(
            vmm.counters,
            summary_at_exit=config.stats,
            interval=config.stats_interval,
            json_out=json_out,
        )
        output.start(usr1=False)  # the channel's thread takes SIGUSR1
        return output

    with vmm:
        times["ready"] = time.monotonic_ns()
        if spec.pooled:  # its threads now; its console, and its start, with b"go"
            output = None if stdout_json else counters_output()
            _send(channel, {"event": "prepared", "times": times})
            _wait_go(spec, channel)
            _start_trace(spec, "launcher: request read, handed to a pooled VM")
            times["go"] = time.monotonic_ns()
            cpu_base = time.process_time_ns()
            spec.notes += notes.lines
            console()
            if output is None:
                json_out = open_json("-")
                output = counters_output()
        vmm.snapshotter = snapshotter = Snapshotter(vmm, channel)
        answer = _Channel(channel, vmm, usr1, snapshotter)
        if not spec.pooled:
            output = counters_output()
        answer.output = output
        status = None
        try:
            status = vmm.run()
        except PyvmmError as err:
            status = err.exit_status  # for the final --stats-json record
            raise
        finally:
            answer.tell_started()
            final = answer.finish()
            output.finish(final, exit_status=status)
            _send(channel, {"event": "final", "report": final})
    return status, final


def _let_go_of_others(spec: ChildSpec, keep: set[int]) -> None:
    """Before the guest's set-up, keep nothing that is another VM's or the
    launcher's: the images it read for other VMs (warm.forget_other_images)
    and every fd not in ``keep`` (or --trace's file): its listener and
    connections, other VMs' channels, pidfds and stderr pipes, whatever
    else it held at the fork. Each such fd becomes /dev/null rather than
    closed: its number stays taken, so an object of the launcher's heap
    that closes "its" fd later closes a /dev/null, never an fd this VM
    opened since (/dev/kvm's, say)."""
    from pyvmm.common import trace
    from pyvmm.serve import warm

    warm.forget_other_images(spec.plan.kernel)
    if trace._fd >= 0:
        keep = keep | {trace._fd}
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd in keep or fd == null:
                continue
            try:
                os.fstat(fd)
            except OSError:
                continue  # the listing's own, closed by now
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _start_trace(spec: ChildSpec, first: str, forked_ns: int | None = None) -> None:
    """--trace through the launcher: the command's timeline (pyvmm.common.trace),
    from the request's first byte; ``first`` names the launcher's part,
    which ends when the child runs its first line after the fork
    (``forked_ns``; a pooled VM's, now)."""
    if spec.trace is None:
        return
    from pyvmm.common import trace

    trace._marks.clear()  # the launcher's own, inherited
    boot_offset = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    trace.set_start(spec.arrived_ns + boot_offset)
    # The launcher's part on its own track (its process: this one's parent).
    if forked_ns is None:
        trace.handed_over(first, trace.now(), os.getppid(), "pyvmm serve")
    else:
        trace.handed_over(first, forked_ns + boot_offset, os.getppid(), "pyvmm serve")
        trace.early("child: the launcher's fds closed, signals")
    try:
        trace.enable(spec.trace)
    except OSError as err:
        raise _OpenError(f"--trace: cannot create {spec.trace}: {err.strerror}") from None


def _finish_trace(spec: ChildSpec) -> None:
    if spec.trace is not None:
        from pyvmm.common import trace

        trace.mark("flush and exit")
        trace.finish()


def _wait_go(spec: ChildSpec, channel: int) -> None:
    """A pooled VM's start: b"go" and a JSON object, with the console's fds."""
    sock = socket.socket(fileno=os.dup(channel))
    try:
        message, fds, _flags, _ = socket.recv_fds(sock, 65536, MAX_GO_FDS, socket.MSG_CMSG_CLOEXEC)
    finally:
        sock.close()
    if not message.startswith(b"go"):
        for fd in fds:
            os.close(fd)
        raise PyvmmError("the launcher ended this pooled VM before its start")
    console = json.loads(message[2:] or b"{}")
    spec.arrived_ns = int(console.get("arrived_ns", 0))
    spec.fds = list(fds)
    spec.stdout_path = console.get("stdout")
    spec.stderr_path = console.get("stderr")


class _Notes(logging.Handler):
    """Log lines kept for later: the plan's in the launcher, a pooled VM's
    set-up before it has a console."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append("pyvmm: " + " ".join(record.getMessage().split("\n")))


@contextlib.contextmanager
def _logged(level: str, notes: _Notes) -> Iterator[_Notes]:
    """pyvmm's log records into ``notes`` while the ``with`` lasts."""
    from pyvmm.common.log import log

    saved = log.handlers[:], log.level, log.propagate
    log.handlers[:] = [notes]
    log.propagate = False
    log.setLevel(level.upper())
    try:
        yield notes
    finally:
        log.handlers[:], level_saved, log.propagate = saved
        log.setLevel(level_saved)


def main(spec: ChildSpec, channel: int, parent: int, forked_ns: int) -> int:
    """The child's life, after the launcher's fds are closed; its status.

    Stop signals are blocked on entry (the launcher blocks them around the
    fork) and unblocked here once the command's handlers (pyvmm.common.stopping)
    are in again: the launcher's own were its loop's."""
    times = {"forked": forked_ns, "child": time.monotonic_ns()}
    # Only a count: a set of the names would write to every name's page
    # (reference counts), which the launcher shares with every child.
    modules = len(sys.modules)
    die_with_parent(parent)
    os.setpgid(0, 0)  # a Ctrl-C meant for the launcher's terminal is the launcher's
    stopping.handle_stop_signals()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # (blocked: read by the channel's thread)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping.STOP_SIGNALS)
    try:
        try:
            usr1 = usr1_fd()
            if spec.cwd is not None:
                try:
                    os.chdir(spec.cwd)
                except OSError as err:
                    raise _OpenError(f"cwd={spec.cwd}: {err.strerror}") from None
            if not spec.pooled:
                _start_trace(spec, "launcher: request read, parsed, planned; fork", forked_ns)
            status, _final = _run(spec, channel, usr1, times)
        except stopping.Stop:
            raise PyvmmError(stop_message(stopping.stop_signal())) from None
    except PyvmmError as err:
        stop = stopping.stop_signal()
        status = 128 + stop if stop else err.exit_status
        running = "running" in times
        line = stopping.stop_line(stop) if stop else f"pyvmm: {err}"
        _send(channel, {"event": "error", "message": line, "status": status, "running": running})
        if running and not isinstance(err, ConsoleClosed):  # 141 says it, as the command
            stopping.say(line)
    except Exception as err:  # a pyvmm bug: one line, as the command says it
        status = 1
        line = stopping.internal_error_line(err)
        if os.environ.get("PYVMM_DEBUG"):
            import traceback

            traceback.print_exc()
        _send(channel, {"event": "error", "message": line, "status": 1, "internal": True})
        stopping.say(line)
    _finish_trace(spec)
    if len(sys.modules) != modules:
        new = sorted(list(sys.modules)[modules:])
        _send(channel, {"event": "imports", "imported_after_fork": new})
    return status
