"""Every decision of a run, made once, before any host resource is touched.

``make_plan`` turns the command line and the unikernel into a ``Plan``:
memory size and layout, privilege level, which ring transport the guest
gets and where, the IO thread's settings. It opens nothing (the unikernel
is read through the ``load`` it is given), so every user mistake is
reported before a tap or /dev/kvm is opened, and the rules are unit-tested
without KVM. ``vmm.Vmm`` carries the plan out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from pyvmm.arch import Arch, host_arch
from pyvmm.config import DEFAULT_SHM_MODE, VmConfig
from pyvmm.devices import DeviceKind, Request, resolve
from pyvmm.devices.net.shmstream import ShmLayout
from pyvmm.devices.net.solo5_ring import RING_AREA
from pyvmm.errors import UsageError
from pyvmm.hvt.bootinfo import join_cmdline
from pyvmm.iothread import DEFAULT_HYBRID_BUDGET_US, IoConfig
from pyvmm.loader import DeviceType, Kernel
from pyvmm.log import INFO, log
from pyvmm.sizes import GUEST_MEMORY_LIMIT, MEM_GRANULE, MIB

KernelLoader = Callable[..., Kernel]


@dataclass(frozen=True)
class Plan:
    """Every decision of a run, made before any host resource is touched."""

    arch: Arch
    kernel: Kernel
    cmdline: bytes
    #: Bytes of guest memory mapped (--mem, rounded).
    mem_size: int
    #: What the guest may use (boot_info.mem_size): below any ring area.
    usable: int
    #: How the guest's code runs (pyvmm.arch.MODES).
    mode: str
    #: Every device to attach, matched to the manifest, in manifest order.
    devices: list[tuple[DeviceKind, Request]]
    #: "off" or the IO thread mode serving a shmstream region.
    shm_mode: str
    shm_layout: ShmLayout | None
    #: Where Solo5's own ring lives, when the guest gets it.
    solo5_ring_gpa: int | None
    io: IoConfig

    @property
    def cpl(self) -> int:
        """The privilege level the guest's code really runs at."""
        return self.arch.modes[self.mode]

    @property
    def stack_top(self) -> int:
        return self.usable - 8


def make_plan(config: VmConfig, *, machine: str, flavour: str, load: KernelLoader) -> Plan:
    """The plan for ``config``; ``load(path, machine, legacy_abi=...)`` reads
    the unikernel (pyvmm.loader.load_kernel, or a stub in tests)."""
    mem_size = guest_memory_size(config.mem_mib)
    cmdline = join_cmdline(config.guest_args)
    kernel = load(config.kernel, machine, legacy_abi=config.legacy_abi)
    arch = host_arch(machine)
    devices = resolve(config.devices, kernel.manifest)
    nets = [request.handle for kind, request in devices if kind.type == DeviceType.NET]
    if nets and (config.snapshot_at is not None or config.restore is not None):
        raise UsageError(
            f"--{'snapshot-at' if config.snapshot_at else 'restore'}: a guest with net devices "
            "cannot be snapshotted or restored yet (its rings' and taps' state is not saved)"
        )
    shm_mode = choose_shm(config.shm, kernel, bool(nets))
    if config.shm_slots is not None and shm_mode == "off":
        why = "--shm=off" if config.shm == "off" else "no net device or no shmstream driver"
        raise UsageError(f"--shm-slots: {kernel.path} gets no shmstream region ({why})")
    layout = None
    usable = mem_size
    if shm_mode != "off":
        layout = ShmLayout.plan(mem_size, tuple(sorted(nets)), config.shm_slots)
        usable = layout.gpa
    ring_gpa = None
    if choose_solo5_ring(config, kernel, bool(nets), shm_mode):
        if usable <= RING_AREA:
            raise UsageError(
                f"Not enough guest memory for ring allocation: --mem={config.mem_mib} is too "
                f"small for the Solo5 net ring (--no-net-ring uses hypercalls instead)"
            )
        usable -= RING_AREA
        ring_gpa = usable
    kernel.check_fits(usable)
    mode = choose_mode(config.cpl, kernel, flavour)
    if mode == "user" and config.cpl == "auto" and config.gdb:
        mode = "deprivileged"  # a debugger gets nothing in user mode (docs/debugging.md)
    if mode not in arch.modes:
        raise UsageError(
            f"--cpl={config.cpl}: {machine} hosts run guests in {', '.join(arch.modes)} mode only"
        )
    io = IoConfig(
        mode=config.shm if config.shm not in (None, "off") else DEFAULT_SHM_MODE,
        hybrid_budget_us=config.hybrid_budget_us or DEFAULT_HYBRID_BUDGET_US,
        cpu=config.pin_io,
    )
    plan = Plan(
        arch=arch,
        kernel=kernel,
        cmdline=cmdline,
        mem_size=mem_size,
        usable=usable,
        mode=mode,
        devices=devices,
        shm_mode=shm_mode,
        shm_layout=layout,
        solo5_ring_gpa=ring_gpa,
        io=io,
    )
    _explain(config, plan, flavour)
    return plan


def guest_memory_size(mem_mib: int) -> int:
    """--mem in MiB, rounded down to 2 MiB as solo5-hvt does (with its
    warning, "adjusting memory to N bytes"), at most 4 GiB."""
    size = mem_mib * MIB
    if size > GUEST_MEMORY_LIMIT:
        raise UsageError(
            f"--mem={mem_mib}: guest memory size {size} bytes exceeds the max size "
            f"{GUEST_MEMORY_LIMIT} bytes (at most {GUEST_MEMORY_LIMIT // MIB} MiB is supported)"
        )
    size -= size % MEM_GRANULE
    if size <= 0:
        raise UsageError(f"--mem={mem_mib}: guest memory must be at least 2 MiB")
    if size != mem_mib * MIB:
        log.warning(
            "adjusting memory to %d bytes (--mem=%d rounded down to %d MiB: guest memory "
            "comes in 2 MiB steps)",
            size,
            mem_mib,
            size // MIB,
        )
    return size


def _explain(config: VmConfig, plan: Plan, flavour: str) -> None:
    """What was decided and why, at log level info (-v)."""
    if not log.isEnabledFor(INFO):
        return
    kernel = plan.kernel
    caps = kernel.capabilities
    if config.cpl != "auto":
        why = f"--cpl={config.cpl}"
    elif flavour != "pvm":
        why = f"--cpl=auto on a {flavour} host: level 0, as solo5-hvt"
    elif caps.user_mode and config.gdb:
        why = "--cpl=auto on a PVM host with --gdb: a debugger gets nothing in user mode"
    elif caps.user_mode:
        why = "--cpl=auto on a PVM host, and the guest declares user mode (pyvmm note)"
    else:
        why = "--cpl=auto on a PVM host, and the guest has no user-mode note"
    log.info("privilege: %s mode, the guest's code at CPL %d (%s)", plan.mode, plan.cpl, why)
    if config.pin_vcpu is not None or config.pin_io is not None:
        vcpu, io = (
            f"CPU {c}" if c is not None else "unpinned" for c in (config.pin_vcpu, config.pin_io)
        )
        log.info(
            "pinned (--pin): the vCPU thread to %s, the IO thread to %s (allowed: CPUs %s)",
            vcpu,
            io,
            ",".join(map(str, sorted(os.sched_getaffinity(0)))),
        )
    log.info(
        "memory: %d MiB mapped, the guest may use 0x0-%#x; kernel %#x-%#x, entry %#x, "
        "stack top %#x; low area (boot info, page tables) below 0x100000",
        plan.mem_size // MIB,
        plan.usable,
        min(seg.paddr for seg in kernel.segments),
        kernel.kernel_end,
        kernel.entry,
        plan.stack_top,
    )
    nets = [r.name for k, r in plan.devices if k.type == DeviceType.NET]
    if plan.shm_layout is not None:
        layout = plan.shm_layout
        log.info(
            "net: shmstream region at %#x (%d MiB, %d slots per ring), IO thread in %s mode",
            layout.gpa,
            layout.size // MIB,
            layout.slots,
            plan.shm_mode,
        )
    elif plan.solo5_ring_gpa is not None:
        log.info(
            "net: Solo5's ring I/O at %#x (%d bytes), served by the IO thread in %s mode "
            "(--no-net-ring: hypercalls)",
            plan.solo5_ring_gpa,
            RING_AREA,
            plan.io.mode,
        )
    elif nets:
        why = (
            "--shm=off"
            if config.shm == "off"
            else ("--no-net-ring" if config.no_net_ring else "ABI version 1 or no ring driver")
        )
        log.info("net: hvt hypercalls, one exit per frame (%s)", why)
    options = {opt.flag: opt for kind, _ in plan.devices for opt in kind.options}
    for kind, request in plan.devices:
        log.info(
            "device '%s' (handle %d): %s, %s",
            request.name,
            request.handle,
            kind.label,
            " ".join(
                options[flag].spelled(request.name, value)
                for flag, value in request.settings.items()
            ),
        )


def choose_mode(requested: str, kernel: Kernel, flavour: str) -> str:
    """How to run the guest's code (--cpl; pyvmm.arch.MODES).

    On a PVM host, code at privilege level 0 is emulated about a thousand
    times slower than level 3 runs (docs/pvm.md), so ``auto`` runs every
    guest at level 3 there: a guest that declares it can (pyvmm's CAP1
    note) directly in user mode, any other deprivileged, its privileged
    instructions trapped and emulated. Elsewhere ``auto`` is level 0, as
    solo5-hvt runs it.
    """
    can = kernel.capabilities.user_mode
    if requested == "3":
        if not can:
            raise UsageError(
                f"--cpl=3: {kernel.path} does not declare that it can run in user mode "
                "(no pyvmm capability note; --cpl=deprivileged runs it at level 3 anyway)"
            )
        return "user"
    if requested == "0":
        return "kernel"
    if requested == "deprivileged":
        return "deprivileged"
    if flavour != "pvm":
        return "kernel"
    return "user" if can else "deprivileged"


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
