"""One guest run: load, attach devices, set up KVM, loop over VM exits.

Order matters for users: everything that can be wrong with the command line
or the unikernel is reported before any host resource is touched, and every
resource is acquired inside one ExitStack so each exit path (halt, guest
fault, signal, bug) releases all of it.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from contextlib import ExitStack
from dataclasses import replace

from pyvmm._native import lib
from pyvmm.arch import x86_64
from pyvmm.config import DEFAULT_SHM_MODE, VmConfig
from pyvmm.devices.block import BlockDevice
from pyvmm.devices.console import Console
from pyvmm.devices.net.device import NetDevice
from pyvmm.devices.net.shmstream import ShmLayout, ShmStream
from pyvmm.devices.net.solo5_ring import RING_AREA, Solo5RingService
from pyvmm.devices.net.tap import TapBackend, parse_mac, random_mac
from pyvmm.errors import DeviceError, GuestFault, HostError, PyvmmError, UsageError
from pyvmm.hvt.bootinfo import BootInfo, join_cmdline
from pyvmm.hvt.hypercalls import Halt, Hypercalls
from pyvmm.iothread import DEFAULT_HYBRID_BUDGET_US, MODES, IoConfig
from pyvmm.kvm import (
    FailEntry,
    Hlt,
    InternalError,
    Interrupted,
    IoIn,
    IoOut,
    MemoryFault,
    Mmio,
    Shutdown,
    System,
)
from pyvmm.kvm.stats import KvmStats
from pyvmm.kvm.system import kvm_flavour
from pyvmm.loader import (
    BlockAttachment,
    DeviceType,
    Kernel,
    NetAttachment,
    load_kernel,
    page_protections,
    place,
)
from pyvmm.memory import MIB, GuestMemory
from pyvmm.stats import ExitCounters

# Boot state exists for these (arch/); aarch64 is planned, not written.
SUPPORTED_HOSTS = ("x86_64",)
MEM_ALIGN = 2 * MIB
MEM_MAX = 4096 * MIB


class Stopped(PyvmmError):
    """A stop signal ended the run: exit status 128 + signal, as a shell would."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.exit_status = 128 + signum


def guest_memory_size(mem_mib: int) -> int:
    """--mem in MiB, rounded down to 2 MiB as solo5-hvt does, at most 4 GiB."""
    size = mem_mib * MIB
    if size > MEM_MAX:
        raise UsageError(f"--mem={mem_mib}: at most {MEM_MAX // MIB} MiB is supported")
    size -= size % MEM_ALIGN
    if size <= 0:
        raise UsageError(f"--mem={mem_mib}: guest memory must be at least 2 MiB")
    return size


def choose_cpl(requested: str, kernel: Kernel, flavour: str) -> int:
    """The privilege level to run the guest at.

    Level 3 runs natively under kvm_pvm, where level 0 is emulated about a
    thousand times slower (docs/pvm.md); only a guest that declares it can
    run in user mode (pyvmm's CAP1 note) may get it. Unmodified Solo5
    unikernels never do.
    """
    can = kernel.capabilities.user_mode
    if requested == "3":
        if not can:
            raise UsageError(
                f"--cpl=3: {kernel.path} does not declare that it can run in user mode "
                "(no pyvmm capability note)"
            )
        return 3
    if requested == "0":
        return 0
    return 3 if can and flavour == "pvm" else 0


def check_devices(config: VmConfig, kernel: Kernel) -> dict[str, str]:
    """Match command-line devices against the manifest; returns name -> iface."""
    nets = dict(config.nets)
    net_entries = kernel.manifest.devices(DeviceType.NET)
    if config.default_net is not None:
        if len(net_entries) != 1:
            names = ", ".join(e.name for e in net_entries) or "none"
            raise UsageError(
                f"--net={config.default_net} needs exactly one net device in the manifest "
                f"of {kernel.path} (it declares: {names}); use --net:NAME=IFACE"
            )
        name = net_entries[0].name
        if name in nets:
            raise UsageError(
                f"net device '{name}' given twice (--net={config.default_net} "
                f"and --net:{name}={nets[name]})"
            )
        nets[name] = config.default_net
    requested = {name: DeviceType.NET for name in nets}
    requested |= {name: DeviceType.BLOCK for name in config.blocks}
    kernel.manifest.check_devices(requested)
    for name in config.net_macs:
        if name not in nets:
            raise UsageError(f"--net-mac:{name} given but net device '{name}' is not attached")
    for name in config.block_sector_sizes:
        if name not in config.blocks:
            raise UsageError(
                f"--block-sector-size:{name} given but block device '{name}' is not attached"
            )
    return nets


def open_devices(stack: ExitStack, config: VmConfig, kernel: Kernel, nets: dict[str, str]):
    """Open every attached device; returns ({handle: device}, {name: attachment})."""
    devices: dict[int, NetDevice | BlockDevice] = {}
    attachments: dict[str, NetAttachment | BlockAttachment] = {}
    for name, iface in nets.items():
        mac = parse_mac(config.net_macs[name]) if name in config.net_macs else random_mac()
        tap = stack.enter_context(TapBackend.open(iface))
        device = NetDevice(name, tap, mac)
        devices[kernel.manifest.by_name(name).index] = device
        attachments[name] = NetAttachment(mac=mac, mtu=device.mtu)
    for name, path in config.blocks.items():
        size = config.block_sector_sizes.get(name, 512)
        block = stack.enter_context(BlockDevice.open(name, path, size))
        devices[kernel.manifest.by_name(name).index] = block
        attachments[name] = BlockAttachment(capacity=block.capacity, block_size=block.block_size)
    return devices, attachments


class Vmm:
    """A prepared guest: call ``run()`` once; use as a context manager."""

    def __init__(self, config: VmConfig) -> None:
        self.config = config
        self.stack = ExitStack()
        self.counters_ = ExitCounters()
        self.fast_path = None
        self.hypercalls: Hypercalls | None = None
        self.elapsed = 0.0
        self.vcpu_cpu_ns = 0
        try:
            self._prepare()
        except BaseException:
            self.stack.close()
            raise

    def _prepare(self) -> None:
        config = self.config
        mem_size = guest_memory_size(config.mem_mib)
        cmdline = join_cmdline(config.guest_args)
        machine = platform.machine()
        kernel = load_kernel(config.kernel, machine, legacy_abi=config.legacy_abi)
        if machine not in SUPPORTED_HOSTS:
            raise HostError(
                f"{machine} hosts are not supported yet (pyvmm boots guests on x86_64 only)"
            )
        nets = check_devices(config, kernel)
        self.shm_mode = choose_shm(config.shm, kernel, bool(nets))
        if config.shm_slots is not None and self.shm_mode == "off":
            why = "--shm=off" if config.shm == "off" else "no net device or no shmstream driver"
            raise UsageError(f"--shm-slots: {kernel.path} gets no shmstream region ({why})")
        layout = None
        usable = mem_size
        if self.shm_mode != "off":
            handles = tuple(sorted(kernel.manifest.by_name(name).index for name in nets))
            layout = ShmLayout.plan(mem_size, handles, config.shm_slots)
            usable = layout.gpa
        ring_gpa = None
        if choose_solo5_ring(config, kernel, bool(nets), self.shm_mode):
            # Solo5's own ring, for ring-capable Solo5 unikernels.
            if usable <= RING_AREA:
                raise UsageError(f"--mem={config.mem_mib} is too small for the Solo5 net ring")
            usable -= RING_AREA
            ring_gpa = usable
        kernel.check_fits(usable)
        devices, attachments = open_devices(self.stack, config, kernel, nets)

        stack = self.stack
        self.system = stack.enter_context(System())
        self.cpl = choose_cpl(config.cpl, kernel, kvm_flavour())
        self.vm = stack.enter_context(self.system.create_vm())
        self.memory = stack.enter_context(GuestMemory(mem_size))
        self.vm.set_memory(0, 0, mem_size, self.memory.host_addr)
        regions = [(r.start, r.start + r.length, r.protection) for r in page_protections(kernel)]
        x86_64.setup_memory(self.memory, regions, self.cpl)
        place(kernel, self.memory)
        self.vcpu = self.vm.create_vcpu(0)
        self.kvm_stats = KvmStats.open(self.vcpu.fd)
        if self.kvm_stats is not None:
            stack.callback(self.kvm_stats.close)
        tsc_hz = self.vcpu.tsc_khz() * 1000
        boot = BootInfo(
            mem_size=usable,
            kernel_end=kernel.kernel_end,
            cpu_cycle_freq=tsc_hz,
            manifest=kernel.manifest.guest_copy(attachments),
            cmdline=cmdline,
        )
        self.shm = None
        self.net_service: ShmStream | Solo5RingService | None = None
        io = IoConfig(
            mode=config.shm if config.shm not in (None, "off") else DEFAULT_SHM_MODE,
            hybrid_budget_us=config.hybrid_budget_us or DEFAULT_HYBRID_BUDGET_US,
            cpu=config.pin_io,
        )
        nets_by_handle = {h: d for h, d in devices.items() if isinstance(d, NetDevice)}
        if ring_gpa is not None:
            self.net_service = Solo5RingService(
                self.memory, ring_gpa, usable, nets_by_handle, io, self.vm
            )
            stack.callback(self.net_service.close)
            boot = replace(boot, host_features=lib.HVT_FEATURE_RING_IO, net_ring=ring_gpa)
        if layout is not None:
            layout.write(self.memory)
            self.shm = ShmStream(self.memory, layout, nets_by_handle, io, self.vm)
            self.net_service = self.shm
            stack.callback(self.shm.close)
            boot = replace(
                boot,
                host_features=lib.PYVMM_FEATURE_BOOT_EXT,
                shm_region=layout.gpa,
                shm_size=layout.size,
                shm_mode=MODES[self.shm_mode],
            )
        boot_info = boot.write(self.memory)
        x86_64.setup_vcpu(
            self.vcpu,
            self.system,
            entry=kernel.image.entry,
            stack=usable - 8,
            boot_info=boot_info,
            cpl=self.cpl,
        )
        self.stop_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        stack.callback(os.close, self.stop_fd)
        self._register_null_kick()
        self.hypercalls = Hypercalls(self.memory, Console(), devices, self.stop_fd, self.shm)
        # PYVMM_PY_HYPERCALLS=1 answers every hypercall in Python (for
        # comparison and diagnosis; docs/architecture.md).
        self.fast_path = (
            None if os.environ.get("PYVMM_PY_HYPERCALLS") else self.hypercalls.fast_path()
        )

    def _register_null_kick(self) -> None:
        """Let guests measure a kick: KVM absorbs writes to this port."""
        if not self.system.check_extension(lib.KVM_CAP_IOEVENTFD):
            return
        fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.stack.callback(os.close, fd)
        self.vm.add_ioeventfd(fd, lib.PYVMM_NULL_KICK_PIO, 4, pio=True)

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
        self.started = time.monotonic()
        cpu_start = time.thread_time_ns()
        try:
            if self.net_service is not None:
                self.net_service.start()
            return self._loop()
        finally:
            if self.net_service is not None:
                self.net_service.stop()
            lib.pyvmm_signals_restore()
            self.elapsed = time.monotonic() - self.started
            self.vcpu_cpu_ns = time.thread_time_ns() - cpu_start

    def counters(self) -> dict:
        """Everything pyvmm counts, for --stats and for benchmarks."""
        out: dict = {
            "cpl": self.cpl,
            "exits_to_pyvmm": self._exits_to_pyvmm(),
            "vcpu_thread_cpu_ns": self.vcpu_cpu_ns,
        }
        if self.fast_path is not None:
            out["hypercalls_in_c"] = self.hypercalls_in_c()
        taps = [d.tap for d in self.hypercalls.nets.values()] if self.hypercalls else []
        if taps:
            # Frames the plain hypercall path dropped (too long for the
            # guest's buffer, or refused by a full tap), C and Python alike.
            fp = self.fast_path
            out["tap_drops"] = {
                "rx_oversize": sum(t.rx_dropped for t in taps) + (fp.rx_dropped if fp else 0),
                "tx": sum(t.tx_dropped for t in taps) + (fp.tx_dropped if fp else 0),
            }
        if self.kvm_stats is not None:
            out["kvm"] = self.kvm_stats.read()
        if self.shm is not None:
            out["shmstream"] = self.shm.counters()
        elif self.net_service is not None:
            out["solo5_ring"] = self.net_service.counters()
        return out

    def _exits_to_pyvmm(self) -> dict[str, int]:
        """VM exits that reached this process, by reason, wherever answered."""
        by_reason = dict(self.counters_.by_reason)
        fp = self.fast_path
        if fp is not None and fp.answered:
            by_reason["IoOut"] = by_reason.get("IoOut", 0) + fp.answered
        return by_reason

    def hypercalls_in_c(self) -> dict[str, int] | None:
        """What the C fast path answered (csrc/hcfast.h), for --stats."""
        fp = self.fast_path
        if fp is None:
            return None
        names = (
            "answered",
            "walltimes",
            "net_reads",
            "net_reads_again",
            "net_writes",
            "polls",
            "block_reads",
            "block_writes",
        )
        return {name: getattr(fp, name) for name in names}

    def _loop(self) -> int:
        vcpu = self.vcpu
        fast_path = self.fast_path
        table = self.hypercalls.table
        base = lib.HVT_HYPERCALL_PIO_BASE
        count = self.counters_.count
        while True:
            exit = vcpu.run(fast_path)
            count(exit)
            match exit:
                case IoOut(port=port, size=4, value=gpa) if port - base in table:
                    try:
                        table[port - base](gpa)
                    except Halt as halt:
                        return halt.status & 0xFF
                    if lib.pyvmm_stop_signal():
                        raise Stopped(lib.pyvmm_stop_signal())
                case Interrupted():
                    if lib.pyvmm_stop_signal():
                        raise Stopped(lib.pyvmm_stop_signal())
                case _:
                    raise self._fault(exit)

    def _explain_triple_fault(self) -> str:
        try:
            regs, sregs = self.vcpu.get_regs(), self.vcpu.get_sregs()
        except HostError:
            return "triple fault (unhandled exception)"
        return explain_page_fault(self.memory, regs.rip, sregs.cr2)

    def _fault(self, exit) -> GuestFault:
        where = self.vcpu.describe()
        match exit:
            case IoOut(port=port, size=size):
                return GuestFault(
                    f"guest fault: invalid hypercall: {size}-byte write to port {port:#x} ({where})"
                )
            case IoIn(port=port, size=size):
                return GuestFault(
                    f"guest fault: invalid {size}-byte read from port {port:#x} ({where})"
                )
            case MemoryFault(gpa=gpa):
                addr = f" at {gpa:#x}" if gpa is not None else ""
                return GuestFault(f"guest fault: write to read-only memory{addr} ({where})")
            case Mmio(addr=addr, is_write=is_write) if addr < self.memory.size:
                # Under PVM, fetching code from a page the host mapped without
                # exec shows up as an MMIO exit inside RAM.
                return GuestFault(
                    f"guest fault: translation fault {'writing' if is_write else 'accessing'} "
                    f"{addr:#x} (not executable or not accessible) ({where})"
                )
            case Mmio(addr=addr, is_write=is_write):
                verb = "write to" if is_write else "read from"
                return GuestFault(f"guest fault: {verb} unmapped address {addr:#x} ({where})")
            case Shutdown():
                return GuestFault(f"guest fault: {self._explain_triple_fault()} ({where})")
            case InternalError(suberror=sub):
                return GuestFault(
                    f"guest fault: KVM internal error, suberror {sub} "
                    f"(instruction KVM cannot emulate?) ({where})"
                )
            case FailEntry(hardware_reason=reason):
                return GuestFault(
                    f"KVM could not enter the guest, hardware reason {reason:#x} ({where})"
                )
            case Hlt():
                return GuestFault(f"guest halted the CPU without the halt hypercall ({where})")
        return GuestFault(f"guest fault: unexpected VM exit {exit} ({where})")


def explain_page_fault(memory: GuestMemory, rip: int, cr2: int) -> str:
    """Best reading of a triple fault from RIP and the last fault address.

    The guest has no IDT of ours, so any exception ends in a triple fault;
    CR2 and RIP (reliable under PVM and VMX alike, measured) tell the usual
    causes apart.
    """
    if cr2 == rip:
        return f"instruction fetch from non-executable memory at {cr2:#x}"
    if cr2 < x86_64.LOW_ABSENT_END:
        return f"access to unmapped page zero at {cr2:#x} (NULL pointer?)"
    if cr2 >= memory.size:
        return f"access to {cr2:#x}, outside guest memory (size {memory.size:#x})"
    if memory.is_read_only(cr2, cr2 + 1) or cr2 < x86_64.LOW_READONLY_END:
        return f"write to read-only memory at {cr2:#x}"
    return "triple fault (unhandled exception)"


def choose_shm(requested: str | None, kernel: Kernel, has_nets: bool) -> str:
    """The shmstream mode for this guest's net devices, or "off".

    Only a guest that declares a shmstream driver gets the region. For any
    other guest an explicit mode still sets how the IO thread serves
    Solo5's own ring (see choose_solo5_ring).
    """
    if requested == "off" or not has_nets or not kernel.capabilities.shmstream:
        return "off"
    if kernel.abi.legacy:  # reads no host features: cannot find a region
        return "off"
    return requested or DEFAULT_SHM_MODE


def choose_solo5_ring(config: VmConfig, kernel: Kernel, has_nets: bool, shm_mode: str) -> bool:
    """Whether to offer Solo5's ring I/O, as solo5-hvt does unless told not to."""
    serve = (
        shm_mode == "off"
        and has_nets
        and config.shm != "off"
        and not config.no_net_ring
        and not kernel.abi.legacy
    )
    if config.shm not in (None, "off") and shm_mode == "off" and not serve:
        if not has_nets:
            why = "no net device"
        elif kernel.abi.legacy:
            why = "ABI version 1, which knows no rings"
        else:
            why = "no shmstream driver and --no-net-ring is set"
        raise UsageError(f"--shm={config.shm}: nothing to serve: {kernel.path} has {why}")
    return serve


def run(config: VmConfig) -> int:
    with Vmm(config) as vmm:
        try:
            return vmm.run()
        finally:
            if config.stats:
                report = vmm.counters()
                report["seconds"] = round(vmm.elapsed, 6)
                sys.stderr.write("pyvmm-stats: " + json.dumps(report, sort_keys=True) + "\n")


__all__ = ["DeviceError", "Vmm", "VmConfig", "run"]
