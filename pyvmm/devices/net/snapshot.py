"""The net kind's part of a snapshot: the host side of its devices.

Guest memory, saved whole by the snapshot, holds the rings: their slots,
the frames waiting in them and every index. What lives only in the host
is kept here: each device's MAC and MTU, the path the plan chose for its
frames (pyvmm's shmstream rings, Solo5's ring or hvt hypercalls) and the
rings' place, the IO thread's mode, its own copies of the indices the host
owns and its counters. They are read with the vCPU stopped and the IO
thread paused between two passes, so every index it owns is published and
no slot is half-written.

A restore checks all of it (untrusted input) against the plan made now,
the taps attached now and the rings in the snapshot's memory, then gives
the IO thread those indices and counters before it starts: the rings
continue where they were, and so do the counters. Frames that waited in
the old tap's queue are not in the snapshot: they went with that tap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyvmm._native import ffi, lib
from pyvmm.common.errors import UsageError
from pyvmm.devices.iothread import LINK_COUNTERS, SOLO5_COUNTERS, THREAD_COUNTERS
from pyvmm.host.threadswitches import SWITCH_KEYS

if TYPE_CHECKING:
    from pyvmm.devices.iothread import IoService
    from pyvmm.devices.net.device import NetDevice
    from pyvmm.devices.net.transport import NetPlan

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
#: Thread counters that are the thread's own, not the guest's: its CPU
#: clock and its context switches.
_NOT_CONTINUED = ("cpu_ns", *SWITCH_KEYS)


def transport_of(service: IoService | None) -> str:
    """The path the devices' frames take in this run."""
    return "hypercalls" if service is None else service.key


def _mac_text(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


def _counters(values: Mapping[str, int]) -> dict[str, int]:
    return {k: v for k, v in values.items() if k not in _NOT_CONTINUED}


def save(plan: NetPlan, service: IoService | None, devices: Mapping[int, NetDevice]) -> dict | None:
    """The host side of the net devices, the IO thread paused (or absent);
    None for a guest without any."""
    if not devices:
        return None
    state: dict[str, Any] = {
        "transport": transport_of(service),
        "devices": [
            {"name": d.name, "handle": d.handle, "mac": _mac_text(d.mac), "mtu": d.mtu}
            for _, d in sorted(devices.items())
        ],
    }
    if service is None:
        return state
    io = service.io
    state["io_mode"] = service.config.mode
    state["thread"] = _counters(io.thread_counters())
    if service.key == "shmstream":
        layout = service.layout
        links = []
        for i in range(len(layout.handles)):
            rx_prod, tx_cons = io.link_indices(i)
            links.append({"rx_prod": rx_prod, "tx_cons": tx_cons, "counters": io.link_counters(i)})
        state["shmstream"] = {
            "gpa": layout.gpa,
            "size": layout.size,
            "slots": layout.slots,
            "ring_size": layout.ring_size,
            "handles": list(layout.handles),
            "tap_read": service.tap_read,
            "links": links,
        }
    else:
        ent_head, com_tail = io.solo5_indices()
        state["solo5_ring"] = {
            "gpa": service.gpa,
            "ent_head": ent_head,
            "com_tail": com_tail,
            "counters": io.solo5_counters(),
        }
    return state


# -- restore -----------------------------------------------------------------------


def _refuse(why: str) -> UsageError:
    return UsageError(f"net state: {why}")


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _refuse(f"'{where}' is missing or not an object")
    return value


def _integer(parent: dict[str, Any], name: str, where: str, high: int = U64) -> int:
    value = parent.get(name)
    if type(value) is not int or not 0 <= value <= high:
        raise _refuse(f"'{where}.{name}' is missing, not an integer or out of range")
    return value


def _same(saved: object, now: object, what: str) -> None:
    if saved != now:
        raise _refuse(f"{what}: the snapshot's is {saved!r}, this run's {now!r}")


def _counter_values(value: object, names: list[str], where: str) -> dict[str, int]:
    counters = _object(value, where)
    if set(counters) != set(names):
        raise _refuse(f"'{where}' does not hold this pyvmm's counters")
    return {name: _integer(counters, name, where) for name in names}


def restore(
    saved: object,
    plan: NetPlan,
    service: IoService | None,
    devices: Mapping[int, NetDevice],
) -> None:
    """Check a snapshot's net state and give it to this run's devices and
    IO thread (created, not started); UsageError (one line) if it is bad
    or does not fit."""
    if saved is None and not devices:
        return
    state = _object(saved, "net")
    _same(state.get("transport"), transport_of(service), "the frames' path")
    _restore_devices(state.get("devices"), devices)
    if service is None:
        return
    _same(state.get("io_mode"), service.config.mode, "the IO thread's mode")
    thread = _counter_values(state.get("thread"), _continued(THREAD_COUNTERS), "net.thread")
    if service.key == "shmstream":
        _restore_shmstream(_object(state.get("shmstream"), "net.shmstream"), service)
    else:
        _restore_solo5_ring(_object(state.get("solo5_ring"), "net.solo5_ring"), service)
    service.io.set_counters("thread", thread)


def _continued(names: list[str]) -> list[str]:
    return [n for n in names if n not in _NOT_CONTINUED]


def _restore_devices(value: object, devices: Mapping[int, NetDevice]) -> None:
    """The same devices, each on a tap of the snapshot's MTU (the guest
    read it at boot), with the snapshot's MAC (so did it)."""
    from pyvmm.devices.net.tap import parse_mac

    if not isinstance(value, list) or len(value) != len(devices):
        raise _refuse("its net devices are not this run's")
    for i, entry in enumerate(value):
        entry = _object(entry, f"net.devices[{i}]")
        handle = _integer(entry, "handle", f"net.devices[{i}]", lib.MFT_MAX_ENTRIES - 1)
        device = devices.get(handle)
        if device is None or entry.get("name") != device.name:
            raise _refuse(f"net device {entry.get('name')!r} is not this run's")
        mtu = _integer(entry, "mtu", f"net.devices[{i}]", 1 << 16)
        if mtu != device.mtu:
            raise _refuse(
                f"net device '{device.name}': tap {device.tap.ifname} has MTU {device.mtu}, "
                f"the snapshot's had {mtu} (the guest read it at boot)"
            )
        text = entry.get("mac")
        mac = parse_mac(text) if isinstance(text, str) else None
        if mac is None:
            raise _refuse(f"'net.devices[{i}].mac' is missing or bad")
        if device.mac_given and device.mac != mac:
            raise _refuse(
                f"net device '{device.name}': --net-mac:{device.name}={_mac_text(device.mac)}, "
                f"but the guest has {_mac_text(mac)} (leave --net-mac out)"
            )
        device.mac = mac


def _ring_at(base, offset: int = 0):
    return ffi.cast("struct shm_ring *", ffi.cast("char *", base) + offset)


def _restore_shmstream(state: dict[str, Any], service) -> None:
    layout = service.layout
    for name in ("gpa", "size", "slots", "ring_size"):
        _same(state.get(name), getattr(layout, name), f"the shmstream region's {name}")
    _same(state.get("handles"), list(layout.handles), "the devices on shmstream rings")
    links = state.get("links")
    if not isinstance(links, list) or len(links) != len(layout.handles):
        raise _refuse("'net.shmstream.links' is not one entry per device")
    slots = layout.slots
    for i, link in enumerate(links):
        where = f"net.shmstream.links[{i}]"
        link = _object(link, where)
        rx_prod = _integer(link, "rx_prod", where, U32)
        tx_cons = _integer(link, "tx_cons", where, U32)
        counters = _counter_values(link.get("counters"), LINK_COUNTERS, f"{where}.counters")
        rx = _ring_at(service.poll_view.rx[i])
        tx = _ring_at(service.poll_view.rx[i], layout.ring_size)
        name = service.nets[layout.handles[i]].name
        # The rings in the snapshot's memory must be the ones these indices
        # were read with: the host's as published, the guest's within a ring.
        if rx.prod != rx_prod or tx.cons != tx_cons:
            raise _refuse(
                f"net device '{name}': its rings' host indices in memory ({rx.prod}, {tx.cons}) "
                f"are not the IO thread's ({rx_prod}, {tx_cons}) (corrupted?)"
            )
        if (rx_prod - rx.cons) & U32 > slots or (tx.prod - tx_cons) & U32 > slots:
            raise _refuse(
                f"net device '{name}': its ring indices are more than {slots} slots apart "
                "(corrupted?)"
            )
        service.io.set_link_indices(i, rx_prod, tx_cons)
        service.io.set_counters("link", counters, i)


def _restore_solo5_ring(state: dict[str, Any], service) -> None:
    _same(state.get("gpa"), service.gpa, "Solo5's ring address")
    ent_head = _integer(state, "ent_head", "net.solo5_ring", U32)
    com_tail = _integer(state, "com_tail", "net.solo5_ring", U32)
    counters = _counter_values(state.get("counters"), SOLO5_COUNTERS, "net.solo5_ring.counters")
    ring = service.ring
    entries = lib.SOLO5_RING_ENTRIES
    if ring.ent_head != ent_head or ring.com_tail != com_tail:
        raise _refuse(
            f"Solo5's ring's host indices in memory ({ring.ent_head}, {ring.com_tail}) are not "
            f"the IO thread's ({ent_head}, {com_tail}) (corrupted?)"
        )
    if (ring.ent_tail - ent_head) & U32 > entries or (com_tail - ring.com_head) & U32 > entries:
        raise _refuse(f"Solo5's ring indices are more than {entries} entries apart (corrupted?)")
    service.io.set_solo5_indices(ent_head, com_tail)
    service.io.set_counters("solo5", counters)
