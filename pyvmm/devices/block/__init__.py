"""Block devices: a disk image (or host block device) per manifest entry.

``backend.py`` is the file side, ``hypercalls.py`` the guest's requests;
the kind below is what the core sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack

from pyvmm.config import positive_int
from pyvmm.devices import Option, Request
from pyvmm.devices.block.backend import (
    DEFAULT_BLOCK_SIZE,
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    BlockDevice,
)
from pyvmm.devices.block.hypercalls import BlockHypercalls
from pyvmm.loader import DeviceType
from pyvmm.memory import GuestMemory

__all__ = ["BLOCK", "BlockDevice", "MAX_BLOCK_SIZE", "MIN_BLOCK_SIZE"]


class BlockKind:
    label = "block"
    type = DeviceType.BLOCK
    options = (
        Option(
            "block",
            "PATH",
            "attach block device NAME to PATH (a file or\na host block device)",
            attaches=True,
        ),
        Option(
            "block-sector-size",
            "N",
            f"sector size of block device NAME (default {DEFAULT_BLOCK_SIZE})",
            parse=positive_int,
        ),
    )

    def attach(self, stack: ExitStack, request: Request) -> BlockDevice:
        size = request.settings.get("block-sector-size", DEFAULT_BLOCK_SIZE)
        return stack.enter_context(
            BlockDevice.open(request.name, request.settings["block"], size, request.handle)
        )

    def hypercalls(
        self, memory: GuestMemory, devices: Mapping[int, BlockDevice]
    ) -> dict[int, Callable[[int], None]]:
        return BlockHypercalls(memory, devices).table()


BLOCK = BlockKind()
