"""Counters: VM exits that reached pyvmm, by reason."""

from __future__ import annotations

from collections import Counter


class ExitCounters:
    """Exits seen by the run loop (KVM's own counters come from its stats fd)."""

    def __init__(self) -> None:
        self.by_reason: Counter[str] = Counter()

    def count(self, exit: object) -> None:
        self.by_reason[type(exit).__name__] += 1

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())
