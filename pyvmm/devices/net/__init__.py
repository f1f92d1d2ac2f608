"""Network devices: a tap on the host side of every guest NIC.

The kind below is what the core sees (options, attach, hypercalls). How
frames move is chosen per run by the plan: hvt hypercalls
(``hypercalls.py``, answered in C by the fast path), pyvmm's shmstream
rings (``shmstream.py``) or Solo5's own ring (``solo5_ring.py``), the
latter two served by the native IO thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack

from pyvmm.devices import Option, Request
from pyvmm.devices.net.device import NetDevice
from pyvmm.devices.net.hypercalls import NetHypercalls
from pyvmm.loader import DeviceType
from pyvmm.log import log
from pyvmm.memory import GuestMemory


class NetKind:
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
    )

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
        return NetDevice(request.name, request.handle, tap, mac)

    def hypercalls(
        self, memory: GuestMemory, devices: Mapping[int, NetDevice]
    ) -> dict[int, Callable[[int], None]]:
        return NetHypercalls(memory, devices).table()


NET = NetKind()
