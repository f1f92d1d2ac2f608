"""Block devices: a disk image (or host block device) per manifest entry.

``backend.py`` is the file side, ``hypercalls.py`` the guest's requests;
the kind below is what the core sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any

from pyvmm._native import lib
from pyvmm.common.errors import UsageError
from pyvmm.common.log import log
from pyvmm.devices import BaseKind, Option, Request
from pyvmm.devices.block.backend import (
    DEFAULT_BLOCK_SIZE,
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    BlockDevice,
    block_size_problem,
)
from pyvmm.devices.block.hypercalls import BlockHypercalls
from pyvmm.kvm.memory import GuestMemory
from pyvmm.loader import DeviceType

__all__ = ["BLOCK", "BlockDevice", "MAX_BLOCK_SIZE", "MIN_BLOCK_SIZE"]


def block_size(option: str, text: str) -> int:
    """--block-sector-size's value: a power of two from 512 to 32 KiB."""
    size = int(text) if text.isascii() and text.isdecimal() else text
    if (
        not isinstance(size, int)
        or size < MIN_BLOCK_SIZE
        or size > MAX_BLOCK_SIZE
        or (size & (size - 1))
    ):
        raise UsageError(f"{option}: {block_size_problem(size)}")
    return size


class BlockKind(BaseKind):
    label = "block"
    type = DeviceType.BLOCK
    options = (
        Option(
            "block",
            "PATH",
            "attach block device NAME to PATH (a file or\n"
            "a host block device, or @FD: one already\n"
            "open read-write), locked while the guest runs",
            attaches=True,
            complete="file",
        ),
        Option(
            "block-sector-size",
            "N",
            f"sector size of block device NAME (default {DEFAULT_BLOCK_SIZE})",
            parse=block_size,
        ),
        Option(
            "no-lock",
            "",
            "do not lock block device images (flock, exclusive)",
            named=False,
            short=True,
        ),
    )

    def attach(self, stack: ExitStack, request: Request) -> BlockDevice:
        size = request.settings.get("block-sector-size", DEFAULT_BLOCK_SIZE)
        device = stack.enter_context(
            BlockDevice.open(
                request.name,
                request.settings["block"],
                size,
                request.handle,
                lock=not request.settings.get("no-lock", False),
            )
        )
        log.info(
            "block device '%s': %s, %d bytes in blocks of %d%s",
            request.name,
            device.path,
            device.capacity,
            device.block_size,
            "" if request.settings.get("no-lock") else ", locked (flock)",
        )
        return device

    def hypercalls(
        self, memory: GuestMemory, devices: Mapping[int, BlockDevice]
    ) -> dict[int, Callable[[int], None]]:
        return BlockHypercalls(memory, devices).table()

    def fill_fast_path(self, fp: Any, devices: Mapping[int, BlockDevice]) -> None:
        for handle in range(lib.MFT_MAX_ENTRIES):
            fp.blk_fd[handle] = -1
        for handle, disk in devices.items():
            fp.blk_fd[handle] = disk.fileno()
            fp.blk_capacity[handle] = disk.capacity
            fp.blk_block_size[handle] = disk.block_size


BLOCK = BlockKind()
