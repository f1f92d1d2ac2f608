"""The device protocol: what a kind of device (net, block) tells the core.

As in Solo5's tender modules, a kind registers its command-line options,
attaches and checks its devices against the manifest, answers its own
hypercalls, and reports the fds the poll hypercall waits on and its
counters; one with rings also plans its area at the top of guest memory,
starts its IO-thread service and fills its part of the C fast path. The
CLI, the plan, the runner and the hypercall table iterate over
``kinds()``; none of them names a kind, so a new device kind touches its
own folder, its entry in ``kinds()`` (or ``register()``, for tests) and
its manifest type (docs/architecture.md lists the files).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Protocol

from pyvmm.common.errors import UsageError

if TYPE_CHECKING:
    from pyvmm.kvm.memory import GuestMemory
    from pyvmm.loader import Attachment, DeviceType, Kernel, Manifest


def text_value(option: str, value: str) -> str:
    return value


class RunSettings(Protocol):
    """What a kind's plan reads of a run's settings (``vm.config.VmConfig``
    is one): typed here, so the device layer needs nothing from above it."""

    #: The command line's device options (``DeviceOptions``).
    devices: dict[str, dict[str | None, Any]]
    mem_mib: int
    #: The IO thread's CPU (--pin), or None.
    pin_io: int | None


class Option:
    """``--FLAG:NAME=VALUE`` for one device NAME of a kind.

    ``attaches`` marks the option that attaches a device (``--net:NAME=``);
    the others set something about an attached one. ``short`` allows the
    nameless ``--FLAG=VALUE`` form too, meaning the manifest's only device
    of this kind (solo5-hvt's ``--net=IFACE``). An option that is not
    ``named`` has only that form and applies to the whole kind: to each of
    its devices' settings (``--no-lock``), or, not ``per_device``, only to
    the kind's own plan (``--shm``), checked even with no device attached.
    An empty ``metavar`` makes it a flag without a value.
    ``complete`` tells shell completion what the value is: "file",
    "interface", choices separated by "|", or nothing. ``after``: --help
    lists the option right after that core option (``cpl`` for ``--cpl``)
    instead of with the device options. Every option may be given once
    (cli.py).
    """

    __slots__ = ("flag", "metavar", "help", "parse", "attaches", "short", "named", "complete")
    __slots__ += ("after", "per_device")

    def __init__(
        self,
        flag: str,
        metavar: str,
        help: str,
        parse: Callable[[str, str], Any] = text_value,
        attaches: bool = False,
        short: bool = False,
        named: bool = True,
        complete: str = "",
        after: str = "",
        per_device: bool = True,
    ) -> None:
        self.flag = flag
        self.metavar = metavar
        self.help = help
        self.parse = parse
        self.attaches = attaches
        self.short = short
        self.named = named
        self.complete = complete
        self.after = after
        self.per_device = per_device

    def __repr__(self) -> str:
        return f"Option({self.flag!r})"

    @property
    def takes_value(self) -> bool:
        return bool(self.metavar)

    def spelled(self, name: str | None, value: Any = None) -> str:
        """This option as the command line takes it: ``--net:service0=tap100``
        for a device NAME, ``--net=tap100`` without one, ``--no-lock`` for
        a flag (--query-manifest's hints and -v say it so)."""
        head = f"--{self.flag}:{name}" if self.named and name is not None else f"--{self.flag}"
        return f"{head}={value}" if self.takes_value else head


class Request:
    """One device as the command line asks for it, matched to the manifest."""

    __slots__ = ("name", "handle", "settings")

    def __init__(self, name: str, handle: int, settings: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.handle = handle
        #: Option flag -> parsed value (the attaching one is always there).
        self.settings: Mapping[str, Any] = {} if settings is None else settings

    def __eq__(self, other: object) -> bool:
        if type(other) is not Request:
            return NotImplemented
        return (self.name, self.handle, self.settings) == (other.name, other.handle, other.settings)

    __hash__ = None  # type: ignore[assignment]  (settings is a mapping)

    def __repr__(self) -> str:
        return f"Request({self.name!r}, {self.handle}, {dict(self.settings)!r})"


class Device(Protocol):
    name: str
    handle: int

    def attachment(self) -> Attachment:
        """What the guest's manifest copy says about this device."""

    def poll_fd(self) -> int | None:
        """The fd the poll hypercall waits on for this device, if any."""

    def counters(self) -> dict[str, int]: ...

    def close(self) -> None: ...


class KindPlan(Protocol):
    """What a kind decided for a run (``DeviceKind.plan``), before any host
    resource is touched."""

    #: The lowest guest address the kind reserves at the top of memory; the
    #: ``top`` it was given when it reserves nothing.
    bottom: int

    def explain(self) -> list[str]:
        """Its decisions as -v lines (plan._explain logs them)."""


class Service(Protocol):
    """A kind's devices served by the native IO thread (iothread.py). The
    runner starts it before the guest's first instruction and stops it on
    every exit path; the poll hypercall waits on ``wake_fd`` (-1: none) and
    leaves the fds of the ``owned`` handles to it."""

    #: Its key in the counters (--stats), e.g. "shmstream".
    key: str
    owned: frozenset[int]
    wake_fd: int
    #: The C poll hypercall's view of its rings (``struct pyvmm_shm_poll *``)
    #: or ffi.NULL.
    poll_view: Any
    #: Its IO thread (``struct iothread *``) if the vCPU thread serves the
    #: guest's kicks at their exit (``kick``), else ffi.NULL.
    kicks_at_exit: Any

    def drain_wake(self) -> None: ...

    def kick(self) -> None:
        """A kick that exited to Python: served as the C loop serves it."""

    def ready_set(self) -> int:
        """Handles with work for the guest, as a poll ``ready_set`` mask."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def pause(self) -> None:
        """Hold the service between two passes until ``resume`` (a
        snapshot: nothing half-written into guest memory)."""

    def resume(self) -> None: ...

    def close(self) -> None: ...

    def counters(self) -> dict[str, Any]: ...


class ServiceSetup(Protocol):
    """What a kind's service needs from the runner (vmm.Vmm)."""

    memory: GuestMemory
    vm: Any
    stack: ExitStack
    #: What the guest may use (below every kind's reservation).
    usable: int


class DeviceKind(Protocol):
    label: str
    type: DeviceType
    options: tuple[Option, ...]
    #: Why this kind's devices cannot be in a snapshot ("" when they can).
    not_snapshotted: str

    def check_options(self, options: DeviceOptions) -> None:
        """Refuse a combination of this kind's options (the command line's
        checks, before any file is read)."""

    def plan(
        self, config: RunSettings, kernel: Kernel, requests: list[Request], top: int
    ) -> KindPlan | None:
        """Its decisions for a run: what it reserves below ``top`` (the
        lowest reservation so far, or the end of memory), one line if it
        cannot; None when it decides nothing."""

    def attach(self, stack: ExitStack, request: Request) -> Device:
        """Open the host side (entered into ``stack``); one line if it cannot."""

    def start_service(
        self, plan: KindPlan | None, setup: ServiceSetup, devices: Mapping[int, Device]
    ) -> tuple[Service | None, dict[str, int]]:
        """Its IO-thread service for the devices attached (entered into
        ``setup.stack``), or None; and what it adds to the boot info
        (hvt/bootinfo.BootInfo's fields, e.g. ``host_features``)."""

    def hypercalls(
        self, memory: GuestMemory, devices: Mapping[int, Device]
    ) -> dict[int, Callable[[int], None]]:
        """Handlers by hypercall number, for this kind's devices by handle."""

    def fill_fast_path(self, fp: Any, devices: Mapping[int, Device]) -> None:
        """Its part of ``struct pyvmm_fastpath`` (csrc/hcfast.h), for the
        devices by handle (none: every handle marked absent)."""

    def snapshot_state(
        self, plan: KindPlan | None, service: Service | None, devices: Mapping[int, Device]
    ) -> dict[str, Any] | None:
        """What a snapshot keeps of this kind's host side (JSON values),
        read with the vCPU stopped and the service paused; None: nothing
        (guest memory, which holds its rings, is saved by the snapshot)."""

    def restore_state(
        self,
        saved: Any,
        plan: KindPlan | None,
        service: Service | None,
        devices: Mapping[int, Device],
    ) -> None:
        """Put a snapshot's ``snapshot_state`` back, before the service
        starts and after guest memory is the snapshot's. ``saved`` is
        untrusted: a bad value, or one this run's plan or devices
        contradict, is one line (UsageError)."""


class BaseKind:
    """What a kind that needs none of it inherits: no option checks, no
    plan, no IO service, nothing for the fast path, snapshots allowed
    with nothing of its own saved."""

    not_snapshotted = ""

    def check_options(self, options: DeviceOptions) -> None:
        return None

    def plan(
        self, config: RunSettings, kernel: Kernel, requests: list[Request], top: int
    ) -> KindPlan | None:
        return None

    def start_service(
        self, plan: KindPlan | None, setup: ServiceSetup, devices: Mapping[int, Device]
    ) -> tuple[Service | None, dict[str, int]]:
        return None, {}

    def fill_fast_path(self, fp: Any, devices: Mapping[int, Device]) -> None:
        return None

    def snapshot_state(
        self, plan: KindPlan | None, service: Service | None, devices: Mapping[int, Device]
    ) -> dict[str, Any] | None:
        return None

    def restore_state(
        self,
        saved: Any,
        plan: KindPlan | None,
        service: Service | None,
        devices: Mapping[int, Device],
    ) -> None:
        if saved is not None:
            raise UsageError(f"it holds {self.label} device state this pyvmm does not restore")


#: Kinds added for one process's life (tests: testkit/devkind), after the
#: built-in ones. Only code calling ``register`` adds one: no setting or
#: environment variable loads a kind.
_registered: list[DeviceKind] = []


def register(kind: DeviceKind) -> Callable[[], None]:
    """Add ``kind`` to ``kinds()``; returns the function that removes it."""
    _registered.append(kind)
    return lambda: _registered.remove(kind)


def kinds() -> tuple[DeviceKind, ...]:
    """Every registered device kind, in the order --help lists them."""
    from pyvmm.devices.block import BLOCK
    from pyvmm.devices.net import NET

    return (NET, BLOCK, *_registered)


def option_table() -> dict[str, tuple[DeviceKind, Option]]:
    return {opt.flag: (kind, opt) for kind in kinds() for opt in kind.options}


def kind_setting(options: DeviceOptions, flag: str, default: Any = None) -> Any:
    """The value of a kind-wide option (one that is not ``named``)."""
    return options.get(flag, {}).get(None, default)


def attaching_option(kind: DeviceKind) -> Option:
    return next(opt for opt in kind.options if opt.attaches)


#: What the command line said about devices: flag -> {device name: value};
#: the short form ``--FLAG=VALUE`` is stored under the name None.
DeviceOptions = dict[str, dict[str | None, Any]]


def resolve(options: DeviceOptions, manifest: Manifest) -> list[tuple[DeviceKind, Request]]:
    """Match the command line's devices against the manifest.

    Every declared device attached, nothing undeclared, types matching
    (solo5-hvt refuses to start otherwise), every setting about an attached
    device; returns the requests in manifest order.
    """
    wanted: dict[str, tuple[DeviceKind, dict[str, Any]]] = {}
    for kind in kinds():
        attach = attaching_option(kind)
        given = dict(options.get(attach.flag, {}))
        if None in given:
            value = given.pop(None)
            entries = manifest.devices(kind.type)
            if len(entries) != 1:
                names = ", ".join(e.name for e in entries) or "none"
                raise UsageError(
                    f"--{attach.flag}={value} needs exactly one {kind.label} device in the "
                    f"manifest of {manifest.source} (it declares: {names}); "
                    f"use --{attach.flag}:NAME={attach.metavar}"
                )
            name = entries[0].name
            if name in given:
                raise UsageError(
                    f"{kind.label} device '{name}' given twice (--{attach.flag}={value} "
                    f"and --{attach.flag}:{name}={given[name]})"
                )
            given[name] = value
        for name, value in given.items():
            if name in wanted:
                raise UsageError(f"device '{name}' is attached twice")
            wanted[name] = (kind, {attach.flag: value})
    manifest.check_devices({name: kind.type for name, (kind, _) in wanted.items()})
    for kind in kinds():
        for opt in kind.options:
            if opt.attaches or not opt.per_device:
                continue
            for name, value in options.get(opt.flag, {}).items():
                if not opt.named:  # applies to every device of the kind
                    for settings in (s for k, s in wanted.values() if k is kind):
                        settings[opt.flag] = value
                    continue
                if name is None or name not in wanted or wanted[name][0] is not kind:
                    raise UsageError(
                        f"--{opt.flag}:{name} given but {kind.label} device '{name}' "
                        "is not attached"
                    )
                wanted[name][1][opt.flag] = value
    requests = []
    for entry in manifest.devices():
        kind, settings = wanted[entry.name]
        requests.append((kind, Request(entry.name, entry.index, settings)))
    return requests
