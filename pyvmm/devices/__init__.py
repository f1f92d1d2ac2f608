"""The device protocol: what a kind of device (net, block) tells the core.

As in Solo5's tender modules, a kind registers its command-line options,
attaches and checks its devices against the manifest, answers its own
hypercalls, and reports the fds the poll hypercall waits on and its
counters. The CLI, the plan, the runner and the hypercall table iterate
over ``kinds()``; none of them names a kind, so a new device kind touches
only its own module and the tuple in ``kinds()`` (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pyvmm.errors import UsageError

if TYPE_CHECKING:
    from pyvmm.loader import Attachment, DeviceType, Manifest
    from pyvmm.memory import GuestMemory


def text_value(option: str, value: str) -> str:
    return value


@dataclass(frozen=True)
class Option:
    """``--FLAG:NAME=VALUE`` for one device NAME of a kind.

    ``attaches`` marks the option that attaches a device (``--net:NAME=``);
    the others set something about an attached one. ``short`` allows the
    nameless ``--FLAG=VALUE`` form too, meaning the manifest's only device
    of this kind (solo5-hvt's ``--net=IFACE``). An option that is not
    ``named`` has only that form and applies to every device of the kind;
    an empty ``metavar`` makes it a flag without a value (``--no-lock``).
    ``complete`` tells shell completion what the value is: "file",
    "interface" or nothing. Every option may be given once (cli.py).
    """

    flag: str
    metavar: str
    help: str
    parse: Callable[[str, str], Any] = text_value
    attaches: bool = False
    short: bool = False
    named: bool = True
    complete: str = ""

    @property
    def takes_value(self) -> bool:
        return bool(self.metavar)

    def spelled(self, name: str | None, value: Any = None) -> str:
        """This option as the command line takes it: ``--net:service0=tap100``
        for a device NAME, ``--net=tap100`` without one, ``--no-lock`` for
        a flag (--query-manifest's hints and -v say it so)."""
        head = f"--{self.flag}:{name}" if self.named and name is not None else f"--{self.flag}"
        return f"{head}={value}" if self.takes_value else head


@dataclass(frozen=True)
class Request:
    """One device as the command line asks for it, matched to the manifest."""

    name: str
    handle: int
    #: Option flag -> parsed value (the attaching one is always there).
    settings: Mapping[str, Any] = field(default_factory=dict)


class Device(Protocol):
    name: str
    handle: int

    def attachment(self) -> Attachment:
        """What the guest's manifest copy says about this device."""

    def poll_fd(self) -> int | None:
        """The fd the poll hypercall waits on for this device, if any."""

    def counters(self) -> dict[str, int]: ...

    def close(self) -> None: ...


class DeviceKind(Protocol):
    label: str
    type: DeviceType
    options: tuple[Option, ...]

    def attach(self, stack: ExitStack, request: Request) -> Device:
        """Open the host side (entered into ``stack``); one line if it cannot."""

    def hypercalls(
        self, memory: GuestMemory, devices: Mapping[int, Device]
    ) -> dict[int, Callable[[int], None]]:
        """Handlers by hypercall number, for this kind's devices by handle."""


def kinds() -> tuple[DeviceKind, ...]:
    """Every registered device kind, in the order --help lists them."""
    from pyvmm.devices.block import BLOCK
    from pyvmm.devices.net import NET

    return (NET, BLOCK)


def option_table() -> dict[str, tuple[DeviceKind, Option]]:
    return {opt.flag: (kind, opt) for kind in kinds() for opt in kind.options}


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
            if opt.attaches:
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
