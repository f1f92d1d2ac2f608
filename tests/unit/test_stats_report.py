"""stats.report(): the snapshot assembled from the fast path's struct, each
device's counters() and the exit counts, value for value; the names come
from the C structs and the devices, the one table in stats.py says which
are drops, and everything a device counts reaches the snapshot."""

from __future__ import annotations

from pyvmm._native import ffi, lib
from pyvmm.vm import stats


class FakeDevice:
    def __init__(self, name: str, counted: dict[str, int]) -> None:
        self.name = name
        self.counted = counted

    def counters(self) -> dict[str, int]:
        return dict(self.counted)


def fast_path(**values: int):
    fp = ffi.new("struct pyvmm_fastpath *")
    for name, value in values.items():
        setattr(fp, name, value)
    return fp


def net(name: str, rx_oversize: int, tx: int) -> FakeDevice:
    kernel = {"tx_packets": 10, "tx_bytes": 1000, "tx_dropped": 1}
    kernel |= {"rx_packets": 4, "rx_bytes": 400, "rx_dropped": 0}
    tap = {f"tap_{k}": v for k, v in kernel.items()}
    return FakeDevice(name, {"rx_oversize": rx_oversize, "tx": tx, **tap})


def exits() -> stats.ExitCounters:
    counted = stats.ExitCounters()
    counted.by_reason.update({"IoOut": 7, "Interrupted": 1})
    counted.hypercalls.update({lib.HVT_HYPERCALL_PUTS: 3, lib.HVT_HYPERCALL_NET_READ: 2, 99: 1})
    return counted


def report(fp, devices, **kw):
    args = dict(cpl=3, mode="user", traps=None, kvm=None, net_service=None)
    args |= kw
    return stats.report(
        exits=exits(), transport="IoOut", vcpu_cpu_ns=5, fast_path=fp, devices=devices, **args
    )


def test_a_net_and_a_block_device_with_the_fast_path():
    fp = fast_path(answered=20, walltimes=1, net_reads=5, net_reads_again=4, net_writes=6)
    fp.polls, fp.block_reads, fp.block_writes = 2, 1, 1
    fp.rx_dropped, fp.tx_dropped = 3, 4
    snap = report(fp, [net("service0", 1, 2), FakeDevice("storage", {})])
    assert snap == {
        "schema": "pyvmm-stats/1",
        "cpl": 3,
        "privilege": "user",
        "exits_to_pyvmm": {"IoOut": 27, "Interrupted": 1},
        "hypercalls": {
            "puts": 3,
            "net_read": 11,
            "99": 1,
            "walltime": 1,
            "poll": 2,
            "block_write": 1,
            "block_read": 1,
            "net_write": 6,
        },
        "vcpu_thread_cpu_ns": 5,
        "hypercalls_in_c": {
            "answered": 20,
            "walltimes": 1,
            "net_reads": 5,
            "net_reads_again": 4,
            "net_writes": 6,
            "polls": 2,
            "block_reads": 1,
            "block_writes": 1,
        },
        "tap_drops": {"rx_oversize": 4, "tx": 6},
        "taps": {
            "service0": {
                "tx_packets": 10,
                "tx_bytes": 1000,
                "tx_dropped": 1,
                "rx_packets": 4,
                "rx_bytes": 400,
                "rx_dropped": 0,
            }
        },
    }


def test_python_answers_everything_without_the_fast_path():
    snap = report(None, [net("a", 1, 0), net("b", 0, 5)], kvm={"exits": 9}, traps={"hlt": 1})
    assert "hypercalls_in_c" not in snap
    assert snap["hypercalls"] == {"puts": 3, "net_read": 2, "99": 1}
    assert snap["exits_to_pyvmm"] == {"IoOut": 7, "Interrupted": 1}
    assert snap["tap_drops"] == {"rx_oversize": 1, "tx": 5}
    assert set(snap["taps"]) == {"a", "b"}
    assert snap["kvm"] == {"exits": 9} and snap["traps"] == {"hlt": 1}


def test_no_net_device_no_drop_or_tap_sections():
    snap = report(fast_path(answered=1, polls=1), [FakeDevice("storage", {})])
    assert "tap_drops" not in snap and "taps" not in snap and "devices" not in snap
    assert snap["hypercalls"]["poll"] == 1


def test_every_entry_a_device_counts_reaches_the_snapshot_and_the_summary():
    """A device kind's own counter (not net's drops or tap counters) is
    shown under the device, by its own name, without an edit in stats.py."""
    from pyvmm.vm.statsview import summary

    probe = FakeDevice("probe0", {"pings": 3, "pongs": 2})
    snap = report(fast_path(answered=1), [net("service0", 0, 0), probe])
    assert snap["devices"] == {"probe0": {"pings": 3, "pongs": 2}}
    assert set(snap["taps"]) == {"service0"}
    lines = summary({**snap, "seconds": 1.0}).splitlines()
    assert "  device probe0: pings 3, pongs 2" in lines


def test_the_tables_name_only_what_the_c_structs_and_devices_count():
    from pyvmm.devices.iothread import LINK_COUNTERS, SOLO5_COUNTERS
    from pyvmm.devices.net.tap import TAP_COUNTERS

    assert set(stats.NET_MEANING["shmstream"]) <= set(LINK_COUNTERS)
    assert set(stats.NET_MEANING["solo5_ring"]) <= set(SOLO5_COUNTERS)
    assert set(stats.NET_MEANING["taps"]) <= set(TAP_COUNTERS)
    assert set(stats.FAST_PATH_DROPS) <= set(stats.counter_fields("struct pyvmm_fastpath"))
    assert set(stats.FAST_PATH_DROPS.values()) == set(stats.NET_MEANING["tap_drops"])
    meanings = {m for table in stats.NET_MEANING.values() for m in table.values()}
    assert set(stats.DROP_CAUSES) <= meanings


def test_every_c_counter_named_as_a_drop_is_classified_as_one():
    """A counter added to a struct with a drop's name (drop, bad, fail) is
    counted in the views' drops only once the table says so: this says it
    is missing."""
    from pyvmm.devices.iothread import LINK_COUNTERS, SOLO5_COUNTERS

    def drop_like(name: str) -> bool:
        return any(word in name for word in ("drop", "bad", "fail", "refused"))

    for section, fields in (("shmstream", LINK_COUNTERS), ("solo5_ring", SOLO5_COUNTERS)):
        missing = {f for f in fields if drop_like(f)} - set(stats.drop_counters(section))
        assert not missing, f"{section}: {missing} not in stats.NET_MEANING"


def test_each_fast_path_counter_counts_one_hypercall():
    by_name = stats._FAST_PATH_BY_NAME
    attributed = [f for fields in by_name.values() for f in fields]
    assert sorted(attributed) == sorted(set(stats.FAST_PATH_COUNTERS) - {"answered"})
    assert set(by_name) <= set(stats.HYPERCALL_NAMES.values())
    assert stats.HYPERCALL_NAMES[lib.HVT_HYPERCALL_NET_READ] == "net_read"


def test_each_io_services_counters_under_its_key():
    class Service:
        def __init__(self, counted: dict) -> None:
            self.counted = counted

        def counters(self) -> dict:
            return self.counted

    shm = Service({"mode": "event", "thread": {}, "devices": {}})
    probe = Service({"mode": "event", "thread": {}, "polls": 2})
    snap = report(None, [], net_service=("shmstream", shm), services=[("probe", probe)])
    assert snap["shmstream"] == shm.counted and snap["probe"] == probe.counted


def test_a_write_solo5s_ring_could_not_send_is_one_of_pyvmms_drops():
    from pyvmm.vm.statsview import pyvmm_drops, summary

    ring = {name: 0 for name in stats.NET_MEANING["solo5_ring"]} | {"write_failures": 2}
    thread = {"wakeups": 0, "kicks": 0, "sleeps": 0, "busy_passes": 0, "idle_spins": 0}
    snap = report(None, [net("service0", 0, 0)])
    snap |= {"seconds": 1.0, "solo5_ring": {"mode": "event", "thread": thread | {"cpu_ns": 0}}}
    snap["solo5_ring"]["ring"] = ring
    assert pyvmm_drops(snap) == 2
    lines = summary(snap).splitlines()
    assert any(x.startswith("    dropped by pyvmm: 2 (refused by the tap);") for x in lines), lines
