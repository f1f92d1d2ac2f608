"""Counters: everything a run counts, assembled in one place.

What ``--stats`` prints and ``Vmm.counters()`` returns: VM exits that
reached pyvmm by reason (whether C or Python answered them), what the C
fast path answered, frames the hypercall path dropped, KVM's own per-vCPU
statistics and the IO thread's ring counters.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

#: The fast path's per-hypercall counters (struct pyvmm_fastpath, hcfast.h).
FAST_PATH_COUNTERS = (
    "answered",
    "walltimes",
    "net_reads",
    "net_reads_again",
    "net_writes",
    "polls",
    "block_reads",
    "block_writes",
)


class ExitCounters:
    """Exits seen by the run loop (KVM's own counters come from its stats fd)."""

    def __init__(self) -> None:
        self.by_reason: Counter[str] = Counter()

    def count(self, exit: object) -> None:
        self.by_reason[type(exit).__name__] += 1

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())


def exits_to_pyvmm(exits: ExitCounters, fast_path: Any, transport: str) -> dict[str, int]:
    """VM exits that reached this process, by reason, wherever answered.

    Every hypercall the fast path answered was an exit too, of the kind
    that carries hypercalls on this architecture (``transport``: IoOut on
    x86, Mmio on aarch64).
    """
    by_reason = dict(exits.by_reason)
    if fast_path is not None and fast_path.answered:
        by_reason[transport] = by_reason.get(transport, 0) + fast_path.answered
    return by_reason


def fast_path_counters(fast_path: Any) -> dict[str, int] | None:
    if fast_path is None:
        return None
    return {name: getattr(fast_path, name) for name in FAST_PATH_COUNTERS}


def tap_drops(devices: list[Any], fast_path: Any) -> dict[str, int] | None:
    """Frames the plain hypercall path dropped, C and Python alike: too long
    for the guest's buffer, or refused by a full tap."""
    counted = [d.counters() for d in devices]
    counted = [c for c in counted if "rx_oversize" in c]
    if not counted:
        return None
    rx = sum(c["rx_oversize"] for c in counted)
    tx = sum(c["tx"] for c in counted)
    if fast_path is not None:
        rx += fast_path.rx_dropped
        tx += fast_path.tx_dropped
    return {"rx_oversize": rx, "tx": tx}


def report(
    *,
    cpl: int,
    mode: str,
    traps: dict[str, int] | None,
    exits: ExitCounters,
    transport: str,
    vcpu_cpu_ns: int,
    fast_path: Any,
    devices: list[Any],
    kvm: dict[str, int] | None,
    net_service: tuple[str, Any] | None,
) -> dict[str, Any]:
    """The whole counter set of a run (keys as documented for --stats)."""
    out: dict[str, Any] = {
        "cpl": cpl,
        "privilege": mode,
        "exits_to_pyvmm": exits_to_pyvmm(exits, fast_path, transport),
        "vcpu_thread_cpu_ns": vcpu_cpu_ns,
    }
    if traps is not None:
        out["traps"] = traps
    if fast_path is not None:
        out["hypercalls_in_c"] = fast_path_counters(fast_path)
    drops = tap_drops(devices, fast_path)
    if drops is not None:
        out["tap_drops"] = drops
    if kvm is not None:
        out["kvm"] = kvm
    if net_service is not None:
        key, service = net_service
        out[key] = service.counters()
    return out
