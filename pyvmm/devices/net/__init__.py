"""Network devices: a tap on the host side of every guest NIC.

The kind below is what the core sees (options, plan, attach, service,
hypercalls, fast path). How frames move is chosen per run by its plan
(``transport.py``): hvt hypercalls (``hypercalls.py``, answered in C by the
fast path), pyvmm's shmstream rings (``shmstream.py``) or Solo5's own ring
(``solo5_ring.py``), the latter two served by the native IO thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from pyvmm._native import lib
from pyvmm.common.log import log
from pyvmm.devices import (
    BaseKind,
    DeviceOptions,
    Option,
    Request,
    RunSettings,
    ServiceSetup,
)
from pyvmm.devices.iothread import MODES

# snapshot: imported now, since a snapshot is taken under the sandbox (no open).
from pyvmm.devices.net import snapshot, transport
from pyvmm.devices.net.device import NetDevice
from pyvmm.devices.net.hypercalls import NetHypercalls
from pyvmm.devices.net.transport import SHM_VALUES, TAP_READ_VALUES, NetPlan
from pyvmm.kvm.memory import GuestMemory
from pyvmm.loader import DeviceType, Kernel

if TYPE_CHECKING:
    from pyvmm.devices.iothread import IoService


def _plan_option(flag: str, metavar: str, help: str, **more: Any) -> Option:
    """An option of the kind's own plan (``--shm``): given once for the
    run in its nameless form, checked even with no device attached."""
    return Option(flag, metavar, help, short=True, named=False, per_device=False, **more)


class NetKind(BaseKind):
    label = "net"
    type = DeviceType.NET
    options = (
        Option(
            "net",
            "IFACE",
            "attach net device NAME to tap IFACE (or @FD:\nan already open tap file descriptor)",
            attaches=True,
            short=True,
            complete="interface",
        ),
        Option("net-mac", "HWADDR", "guest MAC address of net device NAME"),
        _plan_option(
            "shm",
            "off|poll|event|hybrid",
            "shmstream ring networking for guests with a\n"
            "shmstream driver: the IO thread's mode\n"
            "(default event; off = plain hypercalls)",
            parse=transport.shm_value,
            complete="|".join(SHM_VALUES),
            after="--cpl",
        ),
        _plan_option(
            "tap-read",
            "readv|uring|auto",
            "shmstream: how the IO thread reads the taps:\n"
            "one readv per frame, batched through io_uring,\n"
            "or io_uring where the host allows it\n"
            "(default readv)",
            parse=transport.tap_read_value,
            complete="|".join(TAP_READ_VALUES),
            after="--cpl",
        ),
        _plan_option(
            "hybrid-budget",
            "US",
            "hybrid mode: keep polling this many\n"
            "microseconds without work before sleeping\n"
            "(default 2000)",
            parse=transport.hybrid_budget,
            after="--cpl",
        ),
        _plan_option(
            "net-ring-kicks",
            "thread|exit",
            "Solo5's ring in event and hybrid mode: who\n"
            "serves a kick, the IO thread (woken by KVM) or\n"
            "the vCPU thread at the kick's exit (more\n"
            "frames/s unpinned on PVM, slower round trips;\n"
            "default thread)",
            parse=transport.net_ring_kicks_value,
            complete="|".join(transport.NET_RING_KICKS_VALUES),
            after="--cpl",
        ),
        _plan_option(
            "no-net-ring",
            "",
            "do not offer Solo5's ring I/O to Solo5 v0.11+\nunikernels (as solo5-hvt's option)",
            after="--cpl",
        ),
        _plan_option(
            "shm-slots",
            "N",
            "slots per ring, a power of two (default: as\n"
            "many as fit in 1/8 of guest memory, <= 4096)",
            parse=transport.shm_slots,
            after="--gdb-socket",
        ),
    )

    def check_options(self, options: DeviceOptions) -> None:
        transport.check_options(options)

    def plan(
        self, config: RunSettings, kernel: Kernel, requests: list[Request], top: int
    ) -> NetPlan:
        return transport.plan_net(config, kernel, requests, top)

    def attach(self, stack: ExitStack, request: Request) -> NetDevice:
        text = request.settings.get("net-mac")
        # tap.py (sockets, netlink) only when a net device is attached.
        from pyvmm.devices.net.tap import TapBackend, parse_mac, random_mac

        mac = parse_mac(text) if text is not None else random_mac()
        tap = stack.enter_context(TapBackend.open(request.settings["net"]))
        log.info(
            "net device '%s': tap %s (MTU %d), MAC %s%s",
            request.name,
            tap.ifname,
            tap.mtu,
            ":".join(f"{b:02x}" for b in mac),
            "" if text is not None else " (random)",
        )
        device = NetDevice(request.name, request.handle, tap, mac)
        device.mac_given = text is not None
        return device

    def hypercalls(
        self, memory: GuestMemory, devices: Mapping[int, NetDevice]
    ) -> dict[int, Callable[[int], None]]:
        return NetHypercalls(memory, devices).table()

    def start_service(
        self, plan: NetPlan, setup: ServiceSetup, devices: Mapping[int, NetDevice]
    ) -> tuple[IoService | None, dict[str, int]]:
        """The IO thread's service for the net devices, as planned: Solo5's
        ring, pyvmm's shmstream region, or none (plain hypercalls)."""
        nets = dict(devices)
        if plan.solo5_ring_gpa is not None:
            from pyvmm.devices.net.solo5_ring import Solo5RingService

            ring = Solo5RingService(
                setup.memory, plan.solo5_ring_gpa, setup.usable, nets, plan.io, setup.vm
            )
            setup.stack.callback(ring.close)
            return ring, {"host_features": lib.HVT_FEATURE_RING_IO, "net_ring": ring.gpa}
        layout = plan.shm_layout and plan.shm_layout.serving(nets)
        if layout is None:
            return None, {}
        from pyvmm.devices.net.shmstream import ShmStream

        layout.write(setup.memory)
        shm = ShmStream(setup.memory, layout, nets, plan.io, setup.vm, tap_read=plan.tap_read)
        setup.stack.callback(shm.close)
        return shm, {
            "host_features": lib.PYVMM_FEATURE_BOOT_EXT,
            "shm_region": layout.gpa,
            "shm_size": layout.size,
            "shm_mode": MODES[plan.shm_mode],
        }

    def snapshot_state(
        self, plan: NetPlan, service: IoService | None, devices: Mapping[int, NetDevice]
    ) -> dict | None:
        return snapshot.save(plan, service, devices)

    def restore_state(
        self,
        saved: object,
        plan: NetPlan,
        service: IoService | None,
        devices: Mapping[int, NetDevice],
    ) -> None:
        snapshot.restore(saved, plan, service, devices)

    def fill_fast_path(self, fp: Any, devices: Mapping[int, NetDevice]) -> None:
        for handle in range(lib.MFT_MAX_ENTRIES):
            fp.net_fd[handle] = -1
        for handle, net in devices.items():
            fp.net_fd[handle] = net.fileno()
            fp.max_frame[handle] = net.max_frame


NET = NetKind()
