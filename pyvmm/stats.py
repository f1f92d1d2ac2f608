"""Counters: everything a run counts, assembled in one place.

What ``--stats``/``--stats-json`` show and ``Vmm.counters()`` returns
(docs/stats.md has the schema): VM exits that reached pyvmm by reason
(whether C or Python answered them), hypercalls by name, what the C fast
path answered, frames the hypercall path dropped, each tap's own kernel
counters, KVM's own per-vCPU statistics, the IO thread's ring counters and
each thread's CPU time.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pyvmm._native import lib

#: Version of the snapshot's layout; bumped when a key changes meaning or
#: goes away (new keys may appear within a version). docs/stats.md.
SCHEMA = "pyvmm-stats/1"

#: hvt hypercall numbers (csrc/hvt_abi.h) by name, for counting.
HYPERCALL_NAMES = {
    lib.HVT_HYPERCALL_WALLTIME: "walltime",
    lib.HVT_HYPERCALL_PUTS: "puts",
    lib.HVT_HYPERCALL_POLL: "poll",
    lib.HVT_HYPERCALL_BLOCK_WRITE: "block_write",
    lib.HVT_HYPERCALL_BLOCK_READ: "block_read",
    lib.HVT_HYPERCALL_NET_WRITE: "net_write",
    lib.HVT_HYPERCALL_NET_READ: "net_read",
    lib.HVT_HYPERCALL_HALT: "halt",
}
#: The fast path's counter for each hypercall it answers.
_FAST_PATH_BY_NAME = {
    "walltime": ("walltimes",),
    "poll": ("polls",),
    "block_write": ("block_writes",),
    "block_read": ("block_reads",),
    "net_write": ("net_writes",),
    "net_read": ("net_reads", "net_reads_again"),
}

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
    """Exits seen by the run loop (KVM's own counters come from its stats fd),
    and the hypercalls Python answered, by number."""

    def __init__(self) -> None:
        self.by_reason: Counter[str] = Counter()
        self.hypercalls: Counter[int] = Counter()

    def count(self, exit: object) -> None:
        self.by_reason[type(exit).__name__] += 1

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())


def hypercalls(exits: ExitCounters, fast_path: Any) -> dict[str, int]:
    """Every hypercall answered, by name, C and Python together."""
    out = {HYPERCALL_NAMES.get(n, str(n)): count for n, count in exits.hypercalls.items()}
    if fast_path is not None:
        for name, fields in _FAST_PATH_BY_NAME.items():
            answered = sum(getattr(fast_path, f) for f in fields)
            if answered:
                out[name] = out.get(name, 0) + answered
    return out


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


def tap_drops(counted: list[dict[str, int]], fast_path: Any) -> dict[str, int] | None:
    """Frames the plain hypercall path dropped, C and Python alike: too long
    for the guest's buffer, or refused by a full tap (``counted``: every
    device's ``counters()``)."""
    counted = [c for c in counted if "rx_oversize" in c]
    if not counted:
        return None
    rx = sum(c["rx_oversize"] for c in counted)
    tx = sum(c["tx"] for c in counted)
    if fast_path is not None:
        rx += fast_path.rx_dropped
        tx += fast_path.tx_dropped
    return {"rx_oversize": rx, "tx": tx}


def taps(devices: list[Any], counted: list[dict[str, int]]) -> dict[str, dict[str, int]] | None:
    """Each net device's tap as the kernel counts it, since pyvmm attached
    it: frames and bytes it handed to pyvmm (``tx_*``: a tap transmits to
    its reader) and took from it (``rx_*``), and what it dropped
    (``tx_dropped``: frames for the guest nobody read in time)."""
    out = {}
    for device, c in zip(devices, counted, strict=True):
        kernel = {k[4:]: v for k, v in c.items() if k.startswith("tap_")}
        if kernel:
            out[device.name] = kernel
    return out or None


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
        "schema": SCHEMA,
        "cpl": cpl,
        "privilege": mode,
        "exits_to_pyvmm": exits_to_pyvmm(exits, fast_path, transport),
        "hypercalls": hypercalls(exits, fast_path),
        "vcpu_thread_cpu_ns": vcpu_cpu_ns,
    }
    if traps is not None:
        out["traps"] = traps
    if fast_path is not None:
        out["hypercalls_in_c"] = fast_path_counters(fast_path)
    counted = [d.counters() for d in devices]
    drops = tap_drops(counted, fast_path)
    if drops is not None:
        out["tap_drops"] = drops
    kernel = taps(devices, counted)
    if kernel is not None:
        out["taps"] = kernel
    if kvm is not None:
        out["kvm"] = kvm
    if net_service is not None:
        key, service = net_service
        out[key] = service.counters()
    return out
