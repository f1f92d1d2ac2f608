"""Taking a snapshot: the directory made before the sandbox, filled at the trigger.

The sandbox refuses every open once the guest runs (docs/security.md), so
``SnapshotTarget.prepare`` makes the new directory and its three files at
set-up (the memory file already sized, all holes) and the snapshot itself
only writes into them with pwrite, which the filter allows. The metadata is
written last: a directory without it is an incomplete snapshot that a
restore refuses.

The trigger here is the guest's first wait (``--snapshot-at=first-wait``):
the first poll hypercall, when the guest has done its initialisation and
blocks. The snapshot is of the guest just before that hypercall: the out
instruction is completed in KVM (KVM_RUN with immediate_exit, as KVM's
documentation asks before state is read) and rip is set back onto it, so
a restored guest issues the same poll again, with the same timeout.
``--snapshot-at=sigusr2`` takes it between two exits instead, wherever the
guest is, when SIGUSR2 comes (``_watch_signal``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from pyvmm._native import ffi, lib
from pyvmm.common import trace
from pyvmm.common.errors import GuestFault, PyvmmError, UsageError
from pyvmm.common.log import log
from pyvmm.devices import kind_setting, kinds
from pyvmm.hvt.hypercalls import Halt
from pyvmm.kvm import Interrupted
from pyvmm.loader import DeviceType
from pyvmm.vm.snapshot import vcpu as cpu_state
from pyvmm.vm.snapshot.format import (
    CPU_STATE,
    FORMAT,
    MEMORY,
    METADATA,
    VERSION,
    SnapshotError,
    checksum,
    create_file,
    make_directory,
    pack_state,
    seal,
    write_all,
    write_memory,
)
from pyvmm.vm.snapshot.identity import kernel_identity

if TYPE_CHECKING:
    from pyvmm.arch import ExitHandler
    from pyvmm.devices import Device, DeviceKind, Service
    from pyvmm.hvt.hypercalls import Hypercalls
    from pyvmm.kvm import Vcpu
    from pyvmm.kvm.memory import GuestMemory
    from pyvmm.vm.config import VmConfig
    from pyvmm.vm.plan import Plan

TRIGGERS = ("first-wait", "sigusr2")
#: What interrupts KVM_RUN on the vCPU's thread for a SIGUSR2 snapshot (a
#: handler that does nothing; SIGUSR2 itself is taken by sigwait).
KICK = signal.SIGRTMIN + 5


class GuestRun(Protocol):
    """What a snapshot reads of the run it is taken of (``vmm.Vmm`` is
    one): described here, so that this module stays below the runner that
    arms it."""

    config: VmConfig
    plan: Plan
    vcpu: Vcpu
    memory: GuestMemory
    hypercalls: Hypercalls
    devices: list[tuple[DeviceKind, Device]]
    services: list[tuple[DeviceKind, Service]]
    exit_handler: ExitHandler | None


def check_snapshottable(config: VmConfig, plan: Plan) -> None:
    """The runs a snapshot can be taken of today, refused at set-up otherwise."""
    machine = os.uname().machine
    if machine not in ("x86_64", "aarch64"):
        raise UsageError(f"--snapshot-at: x86_64 and aarch64 hosts only (this one: {machine})")
    for kind, _ in plan.devices:
        if kind.not_snapshotted:
            raise UsageError(
                f"--snapshot-at: a guest with {kind.label} devices cannot be snapshotted yet "
                f"({kind.not_snapshotted})"
            )


class SnapshotStop(PyvmmError):
    """--snapshot-stop after a snapshot taken between two exits: the run
    ends there, with status 0 (one line says so)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"snapshot written to {path}; the run ends there (--snapshot-stop)")
        self.exit_status = 0


class SnapshotTarget:
    """The snapshot directory of one run, prepared before the sandbox."""

    def __init__(self, path: str, stop: bool, trigger: str = "first-wait") -> None:
        self.path = path
        self.stop = stop
        self.trigger = trigger
        self.taken = False
        self.requested = False  # SIGUSR2 came
        self._lock = threading.Lock()
        self._closing = False
        self._watcher: threading.Thread | None = None
        self._sweeper = -1  # the pipe to sweeper.py, under the sandbox
        self.dir_fd = make_directory(path)
        self.fds: dict[str, int] = {}
        try:
            for name in (METADATA, CPU_STATE, MEMORY):
                self.fds[name] = create_file(self.dir_fd, name)
        except OSError as err:
            self.close()
            raise SnapshotError(
                f"--snapshot-dir: cannot create files in {path}: {err.strerror}"
            ) from None

    @classmethod
    def prepare(cls, config: VmConfig, plan: Plan) -> SnapshotTarget:
        check_snapshottable(config, plan)
        cpu_state.for_arch(os.uname().machine)  # its module imported now: no open later
        if config.snapshot_at == "sigusr2":
            if config.gdb:
                raise UsageError("--snapshot-at=sigusr2: not with --gdb (its kick is SIGUSR2)")
            if threading.current_thread() is not threading.main_thread():
                raise UsageError(
                    "--snapshot-at=sigusr2: only where the guest runs on the main thread"
                )
        target = cls(config.snapshot_dir, config.snapshot_stop, config.snapshot_at)
        try:
            os.ftruncate(target.fds[MEMORY], plan.mem_size)  # all holes until written
            if config.sandbox:
                target._start_sweeper()
        except OSError as err:
            target.close()
            why = err.strerror
            raise SnapshotError(f"--snapshot-dir: cannot prepare {target.path}: {why}") from None
        except BaseException:
            target.close()
            raise
        return target

    def _start_sweeper(self) -> None:
        """sweeper.py, which removes the directory if no snapshot is taken
        (pyvmm cannot, once the sandbox is on)."""
        from pyvmm.vm.snapshot import sweeper

        path = os.path.abspath(self.path)
        parent = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        reply_read, reply_write = os.pipe2(os.O_CLOEXEC)
        actions: list[tuple] = [
            (os.POSIX_SPAWN_DUP2, fd, 3 + i) for i, fd in enumerate((parent, read_end, reply_write))
        ]
        actions += [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
        argv = [sys.executable, "-I", "-S", sweeper.__file__, os.path.basename(path)]
        try:
            os.posix_spawn(sys.executable, argv, {}, file_actions=actions, setsid=True)
        except OSError:
            os.close(write_end)
            os.close(reply_read)
            raise
        finally:
            os.close(parent)
            os.close(read_end)
            os.close(reply_write)
        self._sweeper, self._sweeper_reply = write_end, reply_read

    def close(self) -> None:
        """Close the files; a directory never filled is removed (by the
        sweeper under the sandbox, at the end of its pipe)."""
        if self._watcher is not None:
            with self._lock:
                self._closing = True
            if self._watcher.is_alive():
                signal.pthread_kill(self._watcher.ident, signal.SIGUSR2)  # out of its sigwait
                self._watcher.join()
            self._watcher = None
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
        if self.dir_fd < 0:
            return
        if self._sweeper >= 0:
            os.close(self._sweeper)  # it removes the directory, unless told "K"
            self._sweeper = -1
            while True:  # its end: the directory is gone (or kept) when pyvmm exits
                try:
                    if not os.read(self._sweeper_reply, 1):
                        break
                except InterruptedError:
                    continue
            os.close(self._sweeper_reply)
        elif not self.taken:
            for name in (METADATA, CPU_STATE, MEMORY):
                try:
                    os.unlink(name, dir_fd=self.dir_fd)
                except FileNotFoundError:
                    pass
            os.rmdir(self.path)
        os.close(self.dir_fd)
        self.dir_fd = -1

    # -- the trigger -----------------------------------------------------------
    def arm(self, vmm: GuestRun) -> None:
        """Take the snapshot at the guest's first poll hypercall, or when
        SIGUSR2 comes."""
        if self.trigger == "sigusr2":
            self._vmm = vmm
            self._watch_signal(vmm)
            return
        table = vmm.hypercalls.table
        poll = table[lib.HVT_HYPERCALL_POLL]

        def first_wait(gpa: int) -> None:
            table[lib.HVT_HYPERCALL_POLL] = poll
            self.take(vmm)
            if self.stop:
                raise Halt(0)
            poll(gpa)

        table[lib.HVT_HYPERCALL_POLL] = first_wait

    def wrap_run(self, run):
        """vcpu.run without the C fast path until the snapshot is taken
        (it would answer the poll that triggers it); for SIGUSR2, vcpu.run
        that takes the snapshot at the exit the kick causes."""
        if self.trigger == "sigusr2":
            return self._on_kick(run)

        def until_taken(fast_path):
            return run(fast_path if self.taken else None)

        return until_taken

    def _watch_signal(self, vmm: GuestRun) -> None:
        """SIGUSR2 blocked in every thread (this one, and all started
        after it) and taken by sigwait on a thread of its own, which then
        kicks the vCPU: immediate_exit, and KICK to the vCPU's thread."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
        signal.signal(KICK, _ignore)
        vcpu_thread = threading.get_ident()
        vcpu = vmm.vcpu

        def watch() -> None:
            signal.sigwait({signal.SIGUSR2})
            with self._lock:
                if self._closing:
                    return
                self.requested = True
            while True:  # until the vCPU thread has taken it (or the run ends)
                with self._lock:
                    if self.taken or self._closing:
                        return
                    vcpu.set_immediate_exit(True)
                signal.pthread_kill(vcpu_thread, KICK)
                time.sleep(0.01)

        self._watcher = threading.Thread(target=watch, name="pyvmm-snapshot", daemon=True)
        self._watcher.start()

    def _on_kick(self, run):
        vmm = self._vmm

        def run_and_take(fast_path):
            exit = run(fast_path)
            if type(exit) is Interrupted and self.requested and not lib.pyvmm_stop_signal():
                with self._lock:
                    if not self.taken:
                        vmm.vcpu.set_immediate_exit(False)
                        self._take_between_exits(vmm)
                if self.stop:
                    raise SnapshotStop(self.path)
            return exit

        return run_and_take

    # -- the snapshot ----------------------------------------------------------
    def _take_between_exits(self, vmm: GuestRun) -> None:
        """The snapshot at an exit KVM_RUN returned with EINTR: every
        operation complete, the guest between two instructions."""
        trace.mark("snapshot: the guest stopped (SIGUSR2)")
        state = cpu_state.for_arch(os.uname().machine).capture(vmm.vcpu)
        self._finish(vmm, state, time.monotonic())

    def take(self, vmm: GuestRun) -> None:
        started = time.monotonic()
        trace.mark("snapshot: the guest at its first wait")
        vcpu = vmm.vcpu
        vcpu.set_immediate_exit(True)  # completes the out, runs nothing
        try:
            done = vcpu.run(None)
        finally:
            vcpu.set_immediate_exit(False)
        if type(done) is not Interrupted:
            raise SnapshotError(f"snapshot: the vCPU did not stop at once ({done!r})")
        arch_state = cpu_state.for_arch(os.uname().machine)
        state = arch_state.capture(vcpu)

        def read(gpa: int, length: int) -> bytes:
            try:
                return vmm.memory.read(gpa, length, what="snapshot")
            except GuestFault:
                return b""

        rewound = arch_state.rewind_hypercall(state, read)
        if rewound is None:
            raise SnapshotError("snapshot: the guest is not at a hypercall instruction")
        self._finish(vmm, rewound, started)

    def _finish(self, vmm: GuestRun, state: dict[str, bytes], started: float) -> None:
        try:
            pages = self._write(vmm, state)
        except OSError as err:
            raise SnapshotError(f"snapshot: cannot write {self.path}: {err.strerror}") from None
        self.taken = True
        if self._sweeper >= 0:
            os.write(self._sweeper, b"K")  # complete: the sweeper keeps it
        log.info(
            "snapshot: %s written (%d pages of memory, %.1f ms)",
            self.path,
            pages,
            (time.monotonic() - started) * 1e3,
        )
        trace.mark("snapshot: written", {"dir": self.path})

    def _write(self, vmm: GuestRun, state: dict[str, bytes]) -> int:
        """The IO threads paused, so that guest memory and the kinds' host
        side agree; then memory, the vCPU's state, the metadata, each synced."""
        services = [service for _, service in vmm.services]
        for service in services:
            service.pause()
        try:
            return self._write_paused(vmm, state)
        finally:
            if not self.stop:  # the run goes on (with --snapshot-stop it ends paused)
                for service in services:
                    service.resume()

    def _write_paused(self, vmm: GuestRun, state: dict[str, bytes]) -> int:
        wall_ns = time.time_ns()
        host = ffi.buffer(ffi.cast("char *", vmm.memory.host_addr), vmm.memory.size)
        pages = write_memory(self.fds[MEMORY], host)
        trace.mark("snapshot: memory written", {"pages": pages})
        packed = pack_state(state)
        write_all(self.fds[CPU_STATE], packed)
        document = metadata(vmm, state, packed, wall_ns, pages)
        for name in (MEMORY, CPU_STATE):
            os.fsync(self.fds[name])
        write_all(self.fds[METADATA], seal(document))
        os.fsync(self.fds[METADATA])
        return pages


def metadata(
    vmm: GuestRun, state: dict[str, bytes], packed: bytes, wall_ns: int, pages: int
) -> dict[str, Any]:
    """snapshot.json's document (format.seal adds its checksum)."""
    plan, config = vmm.plan, vmm.config
    tsc = cpu_state.for_arch(os.uname().machine).counter(state)
    if tsc is None:
        raise SnapshotError("snapshot: KVM did not give the vCPU's clock counter")
    devices = []
    for kind, device in vmm.devices:
        entry: dict[str, Any] = {"name": device.name, "handle": device.handle}
        entry["type"] = kind.type.name.lower()
        if kind.type == DeviceType.BLOCK:
            entry["capacity"] = device.capacity
            entry["block_size"] = device.block_size
        devices.append(entry)
    device_state = {}
    for kind, decided in plan.kinds:
        service = next((s for k, s in vmm.services if k is kind), None)
        own = {device.handle: device for k, device in vmm.devices if k is kind}
        saved = kind.snapshot_state(decided, service, own)
        if saved is not None:
            device_state[kind.label] = saved
    shadow = None
    handler = vmm.exit_handler
    if handler is not None and hasattr(handler, "shadow"):
        shadow = {
            name: getattr(handler.shadow, name) for name in type(handler.shadow).__annotations__
        }
    return {
        "format": FORMAT,
        "version": VERSION,
        "arch": os.uname().machine,
        "kernel": kernel_identity(plan.kernel),
        "plan": {
            "mem_size": plan.mem_size,
            "usable": plan.usable,
            "mode": plan.mode,
            "cpl": plan.cpl,
            "abi_version": plan.kernel.abi.version,
            "guest_args": list(config.guest_args),
            "cmdline": plan.cmdline.hex(),
            "legacy_abi": config.legacy_abi,
            "no_net_ring": bool(kind_setting(config.devices, "no-net-ring", False)),
            "options": plan_options(config),
        },
        "devices": devices,
        "device_state": device_state,
        "shadow": shadow,
        "clock": {
            "tsc": tsc,
            "tsc_khz": plan.arch.cycle_freq(vmm.vcpu) // 1000,
            "wall_ns": wall_ns,
        },
        "cpu_state": {"file": CPU_STATE, "sha256": checksum(packed), "size": len(packed)},
        "memory": {"file": MEMORY, "size": plan.mem_size, "pages": pages},
    }


def plan_options(config: VmConfig) -> dict[str, Any]:
    """The kinds' options of the run's plan as given (``--shm=poll``,
    ``--shm-slots=N``): a restore plans with the same ones."""
    given = {}
    for kind in kinds():
        for opt in kind.options:
            value = kind_setting(config.devices, opt.flag) if not opt.per_device else None
            if value is not None:
                given[opt.flag] = value
    return given


def _ignore(signum: int, frame: object) -> None:
    """KICK's handler: its only work is interrupting KVM_RUN."""
