"""Which pages the launcher reads out of a VM's process for a snapshot:
runs of /proc/PID/pagemap entries that are present or swapped, whole
blocks of untouched ones skipped (pyvmm/serve/snapshot.py)."""

from __future__ import annotations

import random
import struct

from pyvmm.serve.snapshot import _PRESENT, _SWAPPED, _used_runs


def runs_one_by_one(entries: list[int]) -> list[tuple[int, int]]:
    runs, run = [], None
    for i, entry in enumerate(entries):
        used = entry & (_PRESENT | _SWAPPED)
        if used and run is None:
            run = i
        elif not used and run is not None:
            runs.append((run, i - run))
            run = None
    if run is not None:
        runs.append((run, len(entries) - run))
    return runs


def test_runs_of_used_pages_match_a_page_by_page_walk():
    rng = random.Random(25)
    kinds = [
        0,
        _PRESENT,
        _SWAPPED,
        _PRESENT | 0x1234,
        1 << 55,
        0x7,
    ]  # PFN or soft-dirty only: unused
    for _ in range(500):
        count = rng.randint(1, 700)
        dense = rng.random()
        entries = [rng.choice(kinds) if rng.random() < dense else 0 for _ in range(count)]
        raw = struct.pack(f"<{count}Q", *entries)
        assert _used_runs(raw) == runs_one_by_one(entries)


def test_a_used_page_at_each_end_of_a_block_of_sixty_four():
    entries = [0] * 256
    for i in (0, 63, 64, 127, 255):
        entries[i] = _PRESENT
    raw = struct.pack("<256Q", *entries)
    assert _used_runs(raw) == [(0, 1), (63, 2), (127, 1), (255, 1)]
    assert _used_runs(bytes(256 * 8)) == []
