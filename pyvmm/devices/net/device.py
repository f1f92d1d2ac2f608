"""A guest net device as the hvt hypercalls see it: a tap, a MAC, an MTU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyvmm._native import lib
from pyvmm.loader import NetAttachment

if TYPE_CHECKING:  # tap.py (sockets, netlink) loads when a net device is attached
    from pyvmm.devices.net.tap import TapBackend


class NetDevice:
    def __init__(self, name: str, handle: int, tap: TapBackend, mac: bytes) -> None:
        self.name = name
        self.handle = handle
        self.tap = tap
        self.mac = mac
        #: The MAC came from --net-mac (a restore keeps the snapshot's).
        self.mac_given = False
        self.mtu = tap.mtu
        # The largest frame a guest may send: MTU plus the Ethernet header.
        self.max_frame = self.mtu + lib.HVT_ETH_HLEN

    def attachment(self) -> NetAttachment:
        return NetAttachment(mac=self.mac, mtu=self.mtu)

    def fileno(self) -> int:
        return self.tap.fileno()

    def poll_fd(self) -> int:
        return self.tap.fileno()

    def counters(self) -> dict[str, int]:
        """Frames the plain hypercall path dropped in Python (the C fast
        path counts its own: stats.py adds them up), and the tap's kernel
        counters as ``tap_*``."""
        kernel = {f"tap_{k}": v for k, v in self.tap.kernel_counters().items()}
        return {"rx_oversize": self.tap.rx_dropped, "tx": self.tap.tx_dropped, **kernel}

    def read_into(self, buf) -> int | None:
        return self.tap.read_into(buf)

    def write(self, buf) -> bool:
        """Send one frame; False when the tap dropped it (counted there)."""
        return self.tap.write(buf)

    def close(self) -> None:
        self.tap.close()
