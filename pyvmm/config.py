"""What a run asks for, as parsed from the command line (see cli.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MEM_MIB = 512
# The IO thread mode when --shm is not given (docs/modes.md says why).
DEFAULT_SHM_MODE = "event"


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
    # shmstream: None = auto (DEFAULT_SHM_MODE for guests that ask for it),
    # "off", or an IO thread mode ("poll", "event", "hybrid").
    shm: str | None = None
    hybrid_budget_us: int | None = None
    # Slots per ring; None: as many as fit in 1/8 of memory, at most 4096.
    shm_slots: int | None = None
    # Do not offer Solo5's own ring I/O (solo5-hvt's --no-net-ring).
    no_net_ring: bool = False
    # Also boot guests with Solo5 hvt ABI version 1 (Solo5 <= 0.9 builds).
    legacy_abi: bool = False
    pin_vcpu: int | None = None
    pin_io: int | None = None
    # Print counters (VM exits, KVM stats, shmstream) as JSON on stderr at exit.
    stats: bool = False
