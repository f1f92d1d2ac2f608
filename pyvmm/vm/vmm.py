"""One guest run: carry out the plan, then loop over VM exits.

``plan.make_plan`` has made every decision and reported every user mistake
before this module touches a host resource. ``Vmm`` acquires everything
(devices, /dev/kvm, the VM, memory, the IO thread's service, eventfds)
inside one ExitStack, so each exit path (halt, guest fault, signal, bug)
releases all of it.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from pyvmm._native import ffi, lib
from pyvmm.arch import ExitHandler
from pyvmm.common import trace
from pyvmm.common.errors import (
    DeviceError,
    GuestFault,
    HostError,
    PyvmmError,
    Stopped,
    UsageError,
)
from pyvmm.common.record import replace
from pyvmm.devices import Device, DeviceKind, Service
from pyvmm.devices.console import Console, ConsoleClosed
from pyvmm.host import sandbox
from pyvmm.host.threadswitches import SWITCH_KEYS, ThreadSwitches
from pyvmm.hvt.bootinfo import BootInfo
from pyvmm.hvt.hypercalls import Halt, Hypercalls
from pyvmm.kvm import Interrupted, System, VcpuExit
from pyvmm.kvm.exits import Debug
from pyvmm.kvm.memory import GuestMemory
from pyvmm.kvm.stats import KvmStats
from pyvmm.kvm.system import kvm_flavour
from pyvmm.loader import load_kernel, page_regions, place
from pyvmm.vm.config import VmConfig
from pyvmm.vm.debug.report import annotate as annotate_fault
from pyvmm.vm.debug.symbols import SymbolFile
from pyvmm.vm.faults import fault
from pyvmm.vm.plan import Plan, make_plan
from pyvmm.vm.stats import HYPERCALL_NAMES, ExitCounters, report
from pyvmm.vm.statsview import StatsOutput, open_json

if TYPE_CHECKING:
    from pyvmm.vm.debug.core import CoreDir
    from pyvmm.vm.debug.gdbstub import GdbStub
    from pyvmm.vm.snapshot.restore import Restore
    from pyvmm.vm.snapshot.writer import SnapshotTarget


# The signals a core file names (<signal.h>, alike on x86_64 and aarch64).
SIGABRT, SIGSEGV = 6, 11


class Vmm:
    """A prepared guest: call ``run()`` once; use as a context manager."""

    def __init__(self, config: VmConfig, plan: Plan | None = None) -> None:
        """``plan``: one made already from ``config`` (the launcher plans
        before it forks, pyvmm/serve); by default it is made here."""
        self.config = config
        self.stack = ExitStack()
        self.exits = ExitCounters()
        self.fast_path = None
        self.hypercalls: Hypercalls | None = None
        self.kvm_stats: KvmStats | None = None
        self.exit_handler: ExitHandler | None = None
        self.core: CoreDir | None = None  # --dumpcore
        self.gdb: GdbStub | None = None  # --gdb
        self.symbols: SymbolFile | None = None  # read at a fault only
        #: Each kind's IO-thread service, if it has one (started by run()).
        self.services: list[tuple[DeviceKind, Service]] = []
        self.devices: list[tuple[DeviceKind, Device]] = []
        self.elapsed = 0.0
        self.vcpu_cpu_ns = 0
        self.vcpu_switches: ThreadSwitches | None = None  # open while run() runs
        self._vcpu_switched = dict.fromkeys(SWITCH_KEYS, 0)
        self.started: float | None = None
        # Set while pyvmm's stop-signal handlers are installed (api.Guest.stop
        # may send one to the vCPU thread only then).
        self.running = threading.Event()
        self.running_lock = threading.Lock()
        self.snapshot: SnapshotTarget | None = None  # --snapshot-at
        self.restoring: Restore | None = None  # --restore
        try:
            if config.restore is not None:  # the snapshot's settings, before the plan
                self.restoring = self._open_snapshot(config)
            self.plan = plan or make_plan(
                config, machine=os.uname().machine, flavour=kvm_flavour(), load=_traced_load
            )
            if self.restoring is not None:
                self.restoring.check_plan(self.plan)
            trace.mark("plan", {"privilege": self.plan.mode, "cpl": self.plan.cpl})
            self._bring_up(self.plan)
        except BaseException:
            self.stack.close()
            raise

    @property
    def cpl(self) -> int:
        return self.plan.cpl

    @property
    def usable(self) -> int:
        """What the guest may use (a kind's service checks guest buffers against it)."""
        return self.plan.usable

    def _bring_up(self, plan: Plan) -> None:
        stack = self.stack
        kernel = plan.kernel
        # With --trace, a mark between the parts of the tear-down too: the
        # ExitStack closes them in reverse, each mark after its part.
        traced = trace.enabled
        if traced:
            stack.callback(trace.mark, "tear-down: devices (taps, disks)")
        for kind, request in plan.devices:
            self.devices.append((kind, kind.attach(stack, request)))
        attachments = {device.name: device.attachment() for _, device in self.devices}
        if self.restoring is not None:
            self.restoring.check_devices(self.devices)
        trace.mark("devices and taps", {"devices": list(attachments)} if attachments else None)

        if traced:
            stack.callback(trace.mark, "tear-down: close /dev/kvm")
        self.system = system = stack.enter_context(System())
        trace.mark("open /dev/kvm")
        if traced:
            stack.callback(trace.mark, "tear-down: destroy VM")
        self.vm = vm = stack.enter_context(system.create_vm())
        trace.mark("create VM")
        if traced:
            stack.callback(trace.mark, "tear-down: unmap guest memory")
        self.memory = memory = stack.enter_context(GuestMemory(plan.mem_size))
        vm.set_memory(0, 0, plan.mem_size, memory.host_addr)
        trace.mark("map guest memory", {"bytes": plan.mem_size})
        if self.restoring is not None:  # the snapshot's memory in place of a boot's
            self.restoring.load_memory(memory, kernel)
        else:
            plan.arch.prepare_memory(memory, page_regions(kernel), plan.mode)
            place(kernel, memory)
        trace.mark("page tables, ELF segments placed")
        if traced:
            stack.callback(trace.mark, "tear-down: vCPU, eventfds, IO service")
        self.vcpu = vcpu = vm.create_vcpu(0)
        self.kvm_stats = KvmStats.open(vcpu.fd)
        if self.kvm_stats is not None:
            stack.callback(self.kvm_stats.close)
        boot = BootInfo(
            mem_size=plan.usable,
            kernel_end=kernel.kernel_end,
            cpu_cycle_freq=plan.arch.cycle_freq(vcpu),
            manifest=kernel.manifest.guest_copy(attachments),
            cmdline=plan.cmdline,
        )
        boot = self._start_services(plan, boot)
        if self.restoring is not None:  # the kinds' host side, then the snapshot's vCPU state
            self.restoring.load_devices(plan.kinds, self.services, self.devices)
            self.restoring.load_vcpu(system, vcpu, boot.cpu_cycle_freq // 1000)
        else:
            boot_info = boot.write(memory)
            plan.arch.setup_vcpu(
                system,
                vcpu,
                entry=kernel.image.entry,
                stack=plan.stack_top,
                boot_info=boot_info,
                mode=plan.mode,
            )
        self.exit_handler = plan.arch.exit_handler(plan.mode, vcpu, memory)
        if self.restoring is not None:
            self.restoring.load_shadow(self.exit_handler)
        # Opened now (the sandbox refuses an open later), read at a fault only.
        self.symbols = SymbolFile.open(kernel.path)
        if self.symbols is not None:
            stack.callback(self.symbols.close)
        if self.config.dumpcore is not None:  # its directory, now; its file: run()
            from pyvmm.vm.debug.core import CoreDir

            self.core = CoreDir(self.config.dumpcore, os.uname().machine)
            stack.callback(self.core.close)
        self.stop_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        stack.callback(os.close, self.stop_fd)
        if self.config.gdb:  # listening now; gdb is waited for in run()
            self._listen_for_gdb(plan)
        self._prepare_null_kick()
        self.hypercalls = Hypercalls(
            memory, Console(), self.devices, self.stop_fd, [s for _, s in self.services]
        )
        # PYVMM_PY_HYPERCALLS=1 answers every hypercall in Python (for
        # comparison and diagnosis; docs/architecture.md).
        self.fast_path = (
            None if os.environ.get("PYVMM_PY_HYPERCALLS") else self.hypercalls.fast_path()
        )
        if self.config.snapshot_at is not None:  # its files now, before the sandbox
            from pyvmm.vm.snapshot.writer import SnapshotTarget

            self.snapshot = SnapshotTarget.prepare(self.config, plan)
            stack.callback(self.snapshot.close)
            self.snapshot.arm(self)
        trace.mark("vCPU set-up, boot info, hypercall table")

    def _open_snapshot(self, config: VmConfig) -> Restore:
        """--restore: the snapshot read and checked, its settings in ``config``."""
        from pyvmm.arch import host_arch
        from pyvmm.devices import kinds
        from pyvmm.vm.snapshot.restore import Restore

        # Code, not the snapshot's checks: shown apart, as a boot's imports
        # are (a launcher has them all already). A snapshot is of one
        # architecture, whose code the restore runs (a boot imports it in
        # its plan); the device kinds are what its fields are checked against.
        host_arch()
        kinds()
        trace.mark("imports: snapshot restore, the host architecture, device kinds")
        restoring = Restore(config.restore)
        self.stack.callback(restoring.close)
        restoring.configure(config)
        trace.mark("snapshot opened and checked")
        return restoring

    def _listen_for_gdb(self, plan: Plan) -> None:
        from pyvmm.vm.debug.gdbstub import DEFAULT_PORT, Endpoint, GdbStub

        config = self.config
        if config.gdb_socket is not None and config.gdb_port is not None:
            raise UsageError("--gdb-port and --gdb-socket: give one of them")
        if os.uname().machine not in ("x86_64", "aarch64"):
            raise UsageError(f"--gdb: not on {os.uname().machine} hosts (x86_64 and aarch64)")
        port = DEFAULT_PORT if config.gdb_port is None else config.gdb_port
        endpoint = Endpoint(port=port, path=config.gdb_socket)
        self.gdb = GdbStub(endpoint, plan.mode, self.vcpu, self.memory, self.stop_fd)
        self.stack.callback(self.gdb.close)
        if config.user:
            self.gdb.give_socket_to(config.user)
        if self.exit_handler is not None and hasattr(self.exit_handler, "debugger"):
            self.exit_handler.debugger = self.gdb.trap_stop

    def _start_services(self, plan: Plan, boot: BootInfo) -> BootInfo:
        """Each kind's IO-thread service for its devices, as its plan says
        (none: plain hypercalls), and what it adds to the boot info."""
        for kind, decided in plan.kinds:
            devices = {d.handle: d for k, d in self.devices if k is kind}
            service, fields = kind.start_service(decided, self, devices)
            if service is not None:
                self.services.append((kind, service))
            if fields:
                boot = replace(boot, **fields)
        return boot

    def _prepare_null_kick(self) -> None:
        """Let guests measure a kick: KVM absorbs writes to this doorbell.

        Registered at the guest's first write to it, not here: a VM with an
        ioeventfd takes KVM 10-15 ms more to destroy (an SRCU grace period;
        measured on this host, docs/startup.md), which every guest would pay
        at exit for the few that kick. The eventfd is made now, before the
        sandbox, which refuses creating one; the first kick reaches pyvmm
        (``_doorbell``), the others stay in the kernel."""
        self.null_kick_fd: int | None = None  # None: none to register
        if not self.system.check_extension(lib.KVM_CAP_IOEVENTFD):
            return
        self.null_kick_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.stack.callback(os.close, self.null_kick_fd)

    def _doorbell(self, exit: VcpuExit) -> bool:
        """A doorbell write that reached Python: a kick of a service the
        vCPU thread serves at the kick's exit (the C loop's answer, without
        it), or the null-kick doorbell's first write, which registers it
        (the write itself is done: the guest continues after it)."""
        bell = self.plan.arch.doorbell(exit)  # 0: none, which neither test below takes
        for _, service in self.services:
            if bell == lib.HVT_RING_KICK_PIO and service.kicks_at_exit != ffi.NULL:
                service.kick()
                return True
        if bell == lib.PYVMM_NULL_KICK_PIO and self.null_kick_fd is not None:
            self.plan.arch.add_doorbell(self.vm, self.null_kick_fd, lib.PYVMM_NULL_KICK_PIO)
            self.null_kick_fd = None  # closed by the stack
            return True
        return False

    def close(self) -> None:
        self.stack.close()

    def __enter__(self) -> Vmm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self) -> int:
        """Run the guest to its end; returns the exit status for pyvmm."""
        if self.config.pin_vcpu is not None:
            # This thread is the vCPU thread: pid 0 pins the calling thread.
            os.sched_setaffinity(0, {self.config.pin_vcpu})
        err = lib.pyvmm_signals_install(self.stop_fd, self.vcpu.run_area)
        if err:
            raise HostError(f"cannot install signal handlers: {os.strerror(-err)}")
        self.running.set()
        # This thread's CPU clock, readable from the statistics thread.
        self._vcpu_clock = time.pthread_getcpuclockid(threading.get_ident())
        # The CPU clock read inside the wall clock's interval, at both ends:
        # the thread's CPU time is never more than the run's time.
        self.started = time.monotonic()
        self._vcpu_cpu_start = time.clock_gettime_ns(self._vcpu_clock)
        self.vcpu_switches = ThreadSwitches(threading.get_native_id())
        io_threads = []
        try:
            for kind, service in self.services:
                known = trace.tasks()
                service.start()
                trace.mark("IO thread start")
                io_threads.append((kind, service, trace.thread_started("IO thread", known)))
            # Every fd is open and every thread exists: give up what the
            # run does not need (docs/security.md).
            if self.config.user:
                sandbox.drop_privileges(self.config.user)
            if self.core is not None:  # the core's file, as the user the run ends as
                self.core.prepare(sandboxed=self.config.sandbox)
            if self.gdb is not None:  # its connection, before the filter refuses accept
                self.gdb.accept(self.plan.kernel.path)
            if self.config.sandbox:
                sandbox.install(kvm_fd=self.system.fd, vm_fd=self.vm.fd, vcpu_fd=self.vcpu.fd)
                trace.mark("sandbox (seccomp filter)")
            return self._loop()
        finally:
            trace.mark("guest: run to its end")
            for kind, service in self.services:
                service.stop()
                thread = next((t for k, s, t in io_threads if s is service), None)
                if thread is not None:  # --trace: its life, on its own thread
                    served = service.counters()
                    what = f"IO thread ({served['mode']}): serving the {kind.label} devices"
                    trace.thread_ended(thread, what, served["thread"])
                trace.mark("tear-down: IO thread stop")
            with self.running_lock:
                self.running.clear()
            lib.pyvmm_signals_restore()
            self.vcpu_cpu_ns = time.clock_gettime_ns(self._vcpu_clock) - self._vcpu_cpu_start
            self._vcpu_switched = self.vcpu_switches.read()
            self.vcpu_switches.close()
            self.elapsed = time.monotonic() - self.started
            self.started = None

    def counters(self) -> dict[str, Any]:
        """Everything pyvmm counts so far (stats.py; docs/stats.md). Safe to
        call from another thread while the guest runs."""
        started = self.started
        if started is not None:  # running: the totals so far
            self.vcpu_cpu_ns = time.clock_gettime_ns(self._vcpu_clock) - self._vcpu_cpu_start
            if self.vcpu_switches is not None:
                self._vcpu_switched = self.vcpu_switches.read()
            self.elapsed = time.monotonic() - started
        snapshot = report(
            cpl=self.plan.cpl,
            mode=self.plan.mode,
            traps=self.exit_handler.counters() if self.exit_handler is not None else None,
            exits=self.exits,
            transport=self.plan.arch.hypercall_exit.__name__,
            vcpu_cpu_ns=self.vcpu_cpu_ns,
            vcpu_switches=self._vcpu_switched,
            fast_path=self.fast_path,
            devices=[device for _, device in self.devices],
            kvm=self.kvm_stats.read() if self.kvm_stats is not None else None,
            net_service=None,
            services=[(service.key, service) for _, service in self.services],
        )
        snapshot["seconds"] = round(self.elapsed, 6)
        return snapshot

    def _loop(self) -> int:
        vcpu = self.vcpu
        table = self.hypercalls.table
        hypercall = self.plan.arch.hypercall
        arch_answers = self.exit_handler.handle if self.exit_handler is not None else None
        count = self.exits.count
        hypercalls = self.exits.hypercalls
        run = vcpu.run
        if trace.enabled:  # the first exit marked: a wrapper for its first call only
            run = _first_exit(vcpu, hypercall, table)
        if self.snapshot is not None:  # without the C fast path until it is taken
            run = self.snapshot.wrap_run(run)
        trace.mark("to the first KVM_RUN (first guest instruction)")
        gdb = self.gdb
        try:
            if gdb is not None:
                gdb.start()
            status = self._exits(run, count, hypercall, table, hypercalls, arch_answers)
        except GuestFault as err:  # a fault, a trap or a hypercall the guest got wrong
            annotate_fault(err, vcpu, self.memory, self.symbols)
            if gdb is not None:  # it stops in gdb first
                gdb.faulted(err)
            if self.core is not None:
                self.core.dump_guest(self.memory, vcpu, signal=SIGSEGV)
            raise
        except Stopped as err:
            if gdb is not None:
                gdb.signalled(err.exit_status - 128)
            raise
        if gdb is not None:
            gdb.exited(status)
        return status

    def _exits(self, run, count, hypercall, table, hypercalls, arch_answers) -> int:
        """The exit loop itself: until the guest halts, faults or is stopped."""
        vcpu = self.vcpu
        fast_path = self.fast_path
        gdb = self.gdb
        while True:
            exit = run(fast_path)
            count(exit)
            call = hypercall(exit)
            if call is not None and call[0] in table:
                hypercalls[call[0]] += 1
                try:
                    table[call[0]](call[1])
                except Halt as halt:
                    if halt.status & 0xFF == 255 and self.core is not None:  # solo5_abort()
                        self.core.dump_guest(self.memory, vcpu, signal=SIGABRT, halt_gpa=call[1])
                    return halt.status & 0xFF
                if lib.pyvmm_stop_signal():
                    raise Stopped(lib.pyvmm_stop_signal())
            elif type(exit) is Interrupted:
                if lib.pyvmm_stop_signal():
                    raise Stopped(lib.pyvmm_stop_signal())
                if gdb is not None:  # gdb's Ctrl-C kicks the vCPU
                    gdb.interrupted()
            elif type(exit) is Debug and gdb is not None and gdb.debug_exit(exit):
                pass
            elif arch_answers is not None and arch_answers(exit):
                if lib.pyvmm_stop_signal():
                    raise Stopped(lib.pyvmm_stop_signal())
            elif not self._doorbell(exit):
                raise fault(exit, self.plan.arch, vcpu, self.memory)


def _traced_load(*args: Any, **kwargs: Any):
    """plan.make_plan's loader, with the ELF's load as its own phase."""
    trace.mark("plan: options, memory size")
    kernel = load_kernel(*args, **kwargs)
    trace.mark("load ELF (headers, notes, manifest)")
    return kernel


def _first_exit(vcpu, hypercall, table):
    """vcpu.run, with a trace mark at the first exit that reaches Python
    (the first hypercall the C fast path does not answer: puts, for most
    guests); the loop calls it for every exit, so only --trace uses it."""
    state = {"first": True}
    run = vcpu.run

    def traced(fast_path):
        exit = run(fast_path)
        if state["first"]:
            state["first"] = False
            call = hypercall(exit)
            if call is not None and call[0] in table:
                what = f"hypercall ({HYPERCALL_NAMES.get(call[0], call[0])})"
            else:
                what = f"exit ({type(exit).__name__})"
            trace.mark(f"guest: to the first {what}")
        return exit

    return traced


def run(config: VmConfig) -> int:
    json_out = open_json(config.stats_json) if config.stats_json else None
    with Vmm(config) as vmm:
        # Always there: SIGUSR1 prints the counters so far, whatever the options.
        output = StatsOutput(
            vmm.counters,
            summary_at_exit=config.stats,
            interval=config.stats_interval,
            json_out=json_out,
        )
        output.start()
        trace.mark("counters (SIGUSR1 watcher)")
        status = None
        try:
            status = vmm.run()
            return status
        except ConsoleClosed as err:  # nothing said, as a Unix filter on SIGPIPE
            status = err.exit_status
            return status
        except PyvmmError as err:
            status = err.exit_status
            raise
        except Exception:
            status = 1  # a pyvmm bug: cli.main's "internal error"
            raise
        finally:
            output.finish(vmm.counters(), exit_status=status)
            trace.mark("tear-down: counters", {"exit_status": status})


__all__ = ["DeviceError", "Stopped", "Vmm", "VmConfig", "run"]
