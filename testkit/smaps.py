"""A process's memory by mapping, from /proc/PID/smaps (sizes in KiB).

Used by the image-sharing tests and bench/density.py to say what a guest's
process holds and what it shares: PSS divides each page by the number of
processes that map it, so Pss < Rss means pages shared with another process.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Mapping:
    """One line of /proc/PID/maps with its smaps counters (kB)."""

    start: int
    end: int
    perms: str
    offset: int
    path: str
    kb: dict[str, int] = field(default_factory=dict)
    flags: frozenset[str] = frozenset()  # VmFlags: "nr" = MAP_NORESERVE, ...

    @property
    def size(self) -> int:
        return self.end - self.start

    def __getitem__(self, key: str) -> int:
        return self.kb.get(key, 0)


def read(pid: int) -> list[Mapping]:
    """Every mapping of ``pid`` with its counters."""
    maps: list[Mapping] = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head, _, rest = line.partition(" ")
            if "-" in head and not head.endswith(":"):
                lo, hi = head.split("-")
                fields = rest.split(None, 4)
                maps.append(
                    Mapping(
                        int(lo, 16),
                        int(hi, 16),
                        fields[0],
                        int(fields[1], 16),
                        fields[4].strip() if len(fields) > 4 else "",
                    )
                )
            elif head == "VmFlags:" and maps:
                maps[-1].flags = frozenset(rest.split())
            elif head.endswith(":") and maps:
                value = rest.split()
                if value and value[0].isdigit():
                    maps[-1].kb[head[:-1]] = int(value[0])
    return maps


def rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup's totals (kB): Rss, Pss, Private_Dirty, ..."""
    totals: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            value = rest.split()
            if " " not in key and value and value[0].isdigit():
                totals[key] = int(value[0])
    return totals


def guest_memory(maps: list[Mapping], mem_bytes: int) -> list[tuple[int, int]]:
    """Where pyvmm's guest memory is: adjacent MAP_NORESERVE (VmFlags "nr")
    mappings, anonymous or of the image, adding up to exactly ``mem_bytes``
    (one mmap, split by mprotect and the image's file maps). The
    interpreter's own mappings are not MAP_NORESERVE; glibc's arena
    reservations are, but come with an inaccessible part."""
    runs: list[tuple[int, int]] = []
    for m in maps:
        if "nr" not in m.flags or m.perms.startswith("---") or m.path.startswith("["):
            continue
        if runs and runs[-1][1] == m.start:
            runs[-1] = (runs[-1][0], m.end)
        else:
            runs.append((m.start, m.end))
    return [r for r in runs if r[1] - r[0] == mem_bytes]
