"""A guest net device as the hvt hypercalls see it: a tap, a MAC, an MTU."""

from __future__ import annotations

from pyvmm.devices.net.tap import TapBackend

ETHERNET_HEADER = 14


class NetDevice:
    def __init__(self, name: str, tap: TapBackend, mac: bytes) -> None:
        self.name = name
        self.tap = tap
        self.mac = mac
        self.mtu = tap.mtu
        # The largest frame a guest may send: MTU plus the Ethernet header.
        self.max_frame = self.mtu + ETHERNET_HEADER

    def fileno(self) -> int:
        return self.tap.fileno()

    def read_into(self, buf) -> int | None:
        return self.tap.read_into(buf)

    def write(self, buf) -> bool:
        """Send one frame; False when the tap dropped it (counted there)."""
        return self.tap.write(buf)

    def close(self) -> None:
        self.tap.close()
