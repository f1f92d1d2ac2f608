"""Every decision of a run, made once, before any host resource is touched.

``make_plan`` turns the command line and the unikernel into a ``Plan``:
memory size and layout, privilege level, and what each device kind
decides (its own plan: for net, which ring transport the guest gets and
where, and the IO thread's settings). It opens nothing (the unikernel
is read through the ``load`` it is given), so every user mistake is
reported before a tap or /dev/kvm is opened, and the rules are unit-tested
without KVM. ``vmm.Vmm`` carries the plan out.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pyvmm.arch import Arch, host_arch
from pyvmm.common import trace
from pyvmm.common.errors import UsageError
from pyvmm.common.log import INFO, log
from pyvmm.common.sizes import GUEST_MEMORY_LIMIT, MEM_GRANULE, MIB
from pyvmm.devices import DeviceKind, KindPlan, Request, kinds, resolve
from pyvmm.hvt.bootinfo import join_cmdline
from pyvmm.loader import Kernel
from pyvmm.vm.config import VmConfig

KernelLoader = Callable[..., Kernel]


class Plan:
    """Every decision of a run, made before any host resource is touched."""

    __slots__ = ("arch", "kernel", "cmdline", "mem_size", "usable", "mode", "devices", "kinds")

    def __init__(
        self,
        arch: Arch,
        kernel: Kernel,
        cmdline: bytes,
        mem_size: int,
        usable: int,
        mode: str,
        devices: list[tuple[DeviceKind, Request]],
        kinds: list[tuple[DeviceKind, KindPlan | None]],
    ) -> None:
        self.arch = arch
        self.kernel = kernel
        self.cmdline = cmdline
        #: Bytes of guest memory mapped (--mem, rounded).
        self.mem_size = mem_size
        #: What the guest may use (boot_info.mem_size): below every kind's area.
        self.usable = usable
        #: How the guest's code runs (pyvmm.arch.MODES).
        self.mode = mode
        #: Every device to attach, matched to the manifest, in manifest order.
        self.devices = devices
        #: Every kind (devices.kinds()) with what it decided, in that order.
        self.kinds = kinds

    def kind_plan(self, kind: DeviceKind) -> KindPlan | None:
        return next(p for k, p in self.kinds if k is kind)

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
    trace.mark("plan: the host architecture's code (its first import)")
    devices = resolve(config.devices, kernel.manifest)
    for kind in dict.fromkeys(k for k, _ in devices if k.not_snapshotted):
        if config.snapshot_at is not None or config.restore is not None:
            raise UsageError(
                f"--{'snapshot-at' if config.snapshot_at else 'restore'}: a guest with "
                f"{kind.label} devices cannot be snapshotted or restored yet "
                f"({kind.not_snapshotted})"
            )
    # Each kind reserves its area below the previous one's, from the top.
    usable = mem_size
    planned: list[tuple[DeviceKind, KindPlan | None]] = []
    for kind in kinds():
        decided = kind.plan(config, kernel, [r for k, r in devices if k is kind], usable)
        if decided is not None:
            usable = decided.bottom
        planned.append((kind, decided))
    kernel.check_fits(usable)
    mode = choose_mode(config.cpl, kernel, flavour)
    if mode == "user" and config.cpl == "auto" and config.gdb:
        mode = "deprivileged"  # a debugger gets nothing in user mode (docs/debugging.md)
    if mode not in arch.modes:
        raise UsageError(
            f"--cpl={config.cpl}: {machine} hosts run guests in {', '.join(arch.modes)} mode only"
        )
    plan = Plan(
        arch=arch,
        kernel=kernel,
        cmdline=cmdline,
        mem_size=mem_size,
        usable=usable,
        mode=mode,
        devices=devices,
        kinds=planned,
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
    for _, decided in plan.kinds:
        for line in decided.explain() if decided is not None else ():
            log.info("%s", line)
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
