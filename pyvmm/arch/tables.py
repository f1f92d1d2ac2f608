"""What x86_64's page tables and aarch64's translation tables share: where
the last-level (4 KiB page) tables go."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from pyvmm.common.errors import LoaderError

PAGE = 0x1000


def place_page_tables(
    small: dict[int, list[int]], first: int, extra: int, extra_end: int
) -> Iterator[tuple[int, int, bytes]]:
    """(2 MiB region, GPA of its table, table bytes) for each region with
    4 KiB pages, in address order: the first 2 MiB's table at ``first``,
    the others from ``extra`` up to ``extra_end``."""
    for base, entries in sorted(small.items()):
        if base == 0:
            gpa = first
        else:
            gpa, extra = extra, extra + PAGE
            if gpa >= extra_end:
                raise LoaderError("kernel image too large for pyvmm's page tables")
        yield base, gpa, struct.pack("<512Q", *entries)
