"""stats.report(): the snapshot assembled from the fast path's struct, each
device's counters() and the exit counts, value for value; the names come
from the C structs and the devices, the one table in stats.py says which
are drops, and everything a device counts reaches the snapshot."""

from __future__ import annotations

from pyvmm import stats
from pyvmm._native import ffi, lib


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
