"""The page tables an architecture writes at entry, kept where asked.

They are a pure function of the loaded segments' protections and the
privilege mode: the same image in the same mode always gets the same bytes.
A command run computes them once and has no use for keeping them; a warm
launcher (serve/warm.py) that forks many VMs of one image asks the
architecture to keep them (``Arch.keep_boot_tables``) and computes them
before the fork (``Arch.boot_tables``), so each child finds them ready and
shares them copy-on-write. Each architecture owns one ``BootTables`` over
its own computation; nothing outside the architecture replaces it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from types import MappingProxyType

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyvmm.kvm.memory import Protection

    Regions = list[tuple[int, int, Protection]]


class BootTables:
    """``compute(regions, mode)`` -> {guest address: table bytes}, computed
    each time until ``keep`` is asked, then remembered for the last
    ``entries`` (regions, mode) pairs."""

    __slots__ = ("_compute", "_kept", "_entries")

    def __init__(self, compute: Callable[[Regions, str], dict[int, bytes]]) -> None:
        self._compute = compute
        self._kept: OrderedDict[tuple, Mapping[int, bytes]] | None = None
        self._entries = 0

    def keep(self, entries: int) -> None:
        """Remember up to ``entries`` results from now on (0: none again)."""
        if entries <= 0:
            self._kept, self._entries = None, 0
            return
        self._kept = self._kept if self._kept is not None else OrderedDict()
        self._entries = entries
        while len(self._kept) > entries:
            self._kept.popitem(last=False)

    @property
    def kept(self) -> int:
        """How many results are remembered now."""
        return len(self._kept) if self._kept is not None else 0

    def get(self, regions: Regions, mode: str) -> Mapping[int, bytes]:
        """The tables for ``regions`` in ``mode``; a remembered result is
        shared, so it is read-only."""
        if self._kept is None:
            return self._compute(regions, mode)
        key = (tuple(regions), mode)
        tables = self._kept.get(key)
        if tables is None:
            tables = self._kept[key] = MappingProxyType(self._compute(list(regions), mode))
            if len(self._kept) > self._entries:
                self._kept.popitem(last=False)
        else:
            self._kept.move_to_end(key)
        return tables
