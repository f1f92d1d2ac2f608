"""bench/soak.py's count of pyvmm's own drops, from a --stats-json
snapshot: every drop counter of every path (stats.NET_MEANING's), the
hypercall path's included, and nothing that is not a drop."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import soak  # noqa: E402
from pyvmm.vm import stats  # noqa: E402


def test_the_hypercall_paths_drops_are_counted():
    snap = {"tap_drops": {"rx_oversize": 2, "tx": 3}, "taps": {"service0": {"tx_dropped": 9}}}
    assert soak.drops(snap) == {"tap_path_rx_oversize": 2, "tap_path_tx": 3}


def test_every_ring_drop_counter_and_only_those():
    device = {name: 1 for name in stats.NET_MEANING["shmstream"]} | {"notify_sent": 5}
    ring = {name: 1 for name in stats.NET_MEANING["solo5_ring"]} | {"commit_stalls": 4}
    snap = {
        "shmstream": {"devices": {"a": device, "b": device}},
        "solo5_ring": {"ring": ring},
    }
    got = soak.drops(snap)
    assert set(got) == set(stats.drop_counters("shmstream")) | set(
        stats.drop_counters("solo5_ring")
    )
    assert got["rx_drops_full"] == 2 and got["bad_entries"] == 1
    assert got["write_failures"] == 1
