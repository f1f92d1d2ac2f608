"""Counters: everything a run counts, assembled in one place.

What ``--stats``/``--stats-json`` show and ``Vmm.counters()`` returns
(docs/stats.md has the schema): VM exits that reached pyvmm by reason
(whether C or Python answered them), hypercalls by name, what the C fast
path answered, frames the hypercall path dropped, each tap's own kernel
counters, whatever else a device counts (by its own names), KVM's own
per-vCPU statistics, the IO thread's ring counters and each thread's CPU
time. The names come from where things are counted (the C structs through
cffi, each device's ``counters()``); the tables here only say what they mean.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from pyvmm._native import ffi

#: Version of the snapshot's layout; bumped when a key changes meaning or
#: goes away (new keys may appear within a version). docs/stats.md.
SCHEMA = "pyvmm-stats/1"


def _hypercall_names() -> dict[int, str]:
    """hvt hypercall numbers by name, as enum hvt_hypercall (csrc/hvt_abi.h)
    names them: HVT_HYPERCALL_NET_READ counts as ``net_read``."""
    prefix = "HVT_HYPERCALL_"
    elements = ffi.typeof("enum hvt_hypercall").elements
    return {n: name.removeprefix(prefix).lower() for n, name in sorted(elements.items())}


def counter_fields(struct: str) -> tuple[str, ...]:
    """The counters of a C struct, in its order: its scalar 64-bit fields
    (the others are the struct's settings: fds, sizes, arrays, pointers)."""
    fields = ffi.typeof(struct).fields
    return tuple(n for n, f in fields if f.type.kind == "primitive" and f.type.cname == "uint64_t")


HYPERCALL_NAMES = _hypercall_names()

# -- what the counters mean ------------------------------------------------------
#
# Each counter is named once, where it is counted: a C struct's field (read
# through cffi) or a device's counters() key. The tables below only say
# what a name means to the views; a name they do not list is still shown
# under its section, just not classified.

#: pyvmm's own drops, by cause: the views' key for it, and the cause in
#: words. A counter is one of pyvmm's drops when NET_MEANING gives it one
#: of these keys.
DROP_CAUSES = {
    "drops_full": "guest's ring full",
    "drops_oversize": "too long for the guest's buffer",
    "drops_bad": "bad ring entry",
    "drops_refused": "refused by the tap",
}

#: What the views make of a net path's counters, by the snapshot's section
#: and the counter's own name: frames and bytes to the guest (``rx_*``) and
#: from it (``tx_*``), pyvmm's own drops by cause (DROP_CAUSES) and the
#: tap's as the kernel counts them, by direction as the guest sees it.
NET_MEANING: dict[str, dict[str, str]] = {
    # shmstream's rings, per device (struct shm_counters, csrc/iothread.h).
    "shmstream": {
        "rx_frames": "rx_frames",
        "rx_bytes": "rx_bytes",
        "tx_frames": "tx_frames",
        "tx_bytes": "tx_bytes",
        "rx_drops_full": "drops_full",
        "rx_drops_oversize": "drops_oversize",
        "rx_bad_index": "drops_bad",
        "tx_bad_index": "drops_bad",
        "tx_drops_bad_len": "drops_bad",
        "tx_drops_backend": "drops_refused",
    },
    # Solo5's ring, one for every device (struct solo5_ring_counters).
    "solo5_ring": {
        "reads": "rx_frames",
        "read_bytes": "rx_bytes",
        "writes": "tx_frames",
        "write_bytes": "tx_bytes",
        "read_drops_oversize": "drops_oversize",
        "bad_entries": "drops_bad",
        "bad_index": "drops_bad",
        "write_failures": "drops_refused",
    },
    # The hypercall path's drops, C and Python together (a net device's
    # counters() names them; the fast path's are FAST_PATH_DROPS).
    "tap_drops": {"rx_oversize": "drops_oversize", "tx": "drops_refused"},
    # A tap as the kernel counts it: it transmits to its reader, so its
    # ``tx`` is towards the guest.
    "taps": {
        "tx_packets": "rx_frames",
        "tx_bytes": "rx_bytes",
        "rx_packets": "tx_frames",
        "rx_bytes": "tx_bytes",
        "tx_dropped": "tap_to_guest",
        "rx_dropped": "tap_from_guest",
    },
}


def by_meaning(section: str, counted: dict[str, int] | None) -> dict[str, int]:
    """A section's counters summed by what they mean (NET_MEANING); those
    the table gives no meaning are left out."""
    out: dict[str, int] = {}
    for name, meaning in NET_MEANING[section].items():
        if counted and name in counted:
            out[meaning] = out.get(meaning, 0) + counted[name]
    return out


def drop_counters(section: str) -> tuple[str, ...]:
    """The counters of a section that are pyvmm's own drops."""
    return tuple(n for n, m in NET_MEANING[section].items() if m in DROP_CAUSES)


def dropped(section: str, counted: dict[str, int] | None) -> int:
    """How many frames a section's counters say pyvmm dropped."""
    return sum(v for k, v in by_meaning(section, counted).items() if k in DROP_CAUSES)


#: The fast path's own drops (struct pyvmm_fastpath), by the name the
#: hypercall path gives them in ``tap_drops``: its drop rule is TapBackend's.
FAST_PATH_DROPS = {"rx_dropped": "rx_oversize", "tx_dropped": "tx"}

#: What the fast path answered (struct pyvmm_fastpath, csrc/hcfast.h):
#: ``answered``, every one, and a counter per hypercall, named after it
#: (``polls``; ``net_reads_again`` for a kind of answer).
FAST_PATH_COUNTERS = tuple(
    n for n in counter_fields("struct pyvmm_fastpath") if n not in FAST_PATH_DROPS
)


def _fast_path_by_name() -> dict[str, tuple[str, ...]]:
    """The fast path's counters for each hypercall: ``NAMEs``, and
    ``NAMEs_...`` for a kind of answer (``net_reads_again``)."""
    out = {}
    for name in HYPERCALL_NAMES.values():
        fields = tuple(
            f for f in FAST_PATH_COUNTERS if f == f"{name}s" or f.startswith(f"{name}s_")
        )
        if fields:
            out[name] = fields
    return out


_FAST_PATH_BY_NAME = _fast_path_by_name()

#: A device's counters() entries with a section of their own: the hypercall
#: path's drops (summed over the devices, with the fast path's) and, as
#: ``tap_*``, its tap as the kernel counts it (``taps``, per device). Every
#: other entry goes under ``devices``, per device, by the device's name.
TAP_PREFIX = "tap_"


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
    device's ``counters()``; None without a device that counts them)."""
    names = NET_MEANING["tap_drops"]
    counted = [c for c in counted if any(n in c for n in names)]
    if not counted:
        return None
    out = {n: sum(c.get(n, 0) for c in counted) for n in names}
    if fast_path is not None:
        for field, name in FAST_PATH_DROPS.items():
            out[name] += getattr(fast_path, field)
    return out


def taps(devices: list[Any], counted: list[dict[str, int]]) -> dict[str, dict[str, int]] | None:
    """Each net device's tap as the kernel counts it, since pyvmm attached
    it: frames and bytes it handed to pyvmm (``tx_*``: a tap transmits to
    its reader) and took from it (``rx_*``), and what it dropped
    (``tx_dropped``: frames for the guest nobody read in time)."""
    out = {}
    for device, c in zip(devices, counted, strict=True):
        kernel = {k.removeprefix(TAP_PREFIX): v for k, v in c.items() if k.startswith(TAP_PREFIX)}
        if kernel:
            out[device.name] = kernel
    return out or None


def device_counters(
    devices: list[Any], counted: list[dict[str, int]]
) -> dict[str, dict[str, int]] | None:
    """What each device counts beyond the sections above, by its own names:
    a device kind's counters reach the snapshot without a line here."""
    own = NET_MEANING["tap_drops"]
    out = {}
    for device, c in zip(devices, counted, strict=True):
        rest = {k: v for k, v in c.items() if k not in own and not k.startswith(TAP_PREFIX)}
        if rest:
            out[device.name] = rest
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
    vcpu_switches: dict[str, int] | None = None,
    devices: list[Any],
    kvm: dict[str, int] | None,
    net_service: tuple[str, Any] | None,
    services: Sequence[tuple[str, Any]] = (),
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
    # The vCPU thread's context switches (the IO thread's are in its
    # service's "thread"): what a frame costs in switches.
    for key, value in (vcpu_switches or {}).items():
        out[f"vcpu_thread_{key}"] = value
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
    rest = device_counters(devices, counted)
    if rest is not None:
        out["devices"] = rest
    if kvm is not None:
        out["kvm"] = kvm
    # Each IO service's counters under its key (shmstream, solo5_ring, a
    # device kind's own): ``net_service`` is one such pair, ``services`` any.
    for key, service in ([net_service] if net_service is not None else []) + list(services):
        out[key] = service.counters()
    return out
