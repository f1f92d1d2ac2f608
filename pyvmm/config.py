"""What a run asks for, as parsed from the command line (see cli.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MEM_MIB = 512


@dataclass
class VmConfig:
    kernel: str
    guest_args: list[str] = field(default_factory=list)
    mem_mib: int = DEFAULT_MEM_MIB
    # Device name (as in the manifest) -> tap interface name or "@FD".
    nets: dict[str, str] = field(default_factory=dict)
    net_macs: dict[str, str] = field(default_factory=dict)
    # The short form --net=IFACE: attach to the manifest's only net device.
    default_net: str | None = None
    blocks: dict[str, str] = field(default_factory=dict)
    block_sector_sizes: dict[str, int] = field(default_factory=dict)
    # Privilege level of the guest: "auto", "0" or "3" (see vmm.choose_cpl).
    cpl: str = "auto"
