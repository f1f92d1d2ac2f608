"""block_read and block_write: whole blocks between the disk and guest memory.

The C fast path answers the clean cases; these handlers answer everything
else (a bad handle or a partial block is EINVAL, as in solo5-hvt; a bad
buffer ends the run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyvmm._native import lib
from pyvmm.devices.block.backend import BlockDevice
from pyvmm.kvm.memory import GuestMemory


class BlockHypercalls:
    def __init__(self, memory: GuestMemory, disks: Mapping[int, BlockDevice]) -> None:
        self.memory = memory
        self.disks = disks

    def table(self) -> dict[int, Callable[[int], None]]:
        return {
            lib.HVT_HYPERCALL_BLOCK_WRITE: self.block_write,
            lib.HVT_HYPERCALL_BLOCK_READ: self.block_read,
        }

    def block_write(self, gpa: int) -> None:
        self._block(gpa, "struct hvt_hc_block_write", "block_write hypercall", False)

    def block_read(self, gpa: int) -> None:
        self._block(gpa, "struct hvt_hc_block_read", "block_read hypercall", True)

    def _block(self, gpa: int, ctype: str, what: str, is_read: bool) -> None:
        # Request fields from a copy, read once; only ``ret`` goes back.
        arg, guest = self.memory.request(ctype, gpa, what=what)
        device = self.disks.get(arg.handle)
        if device is None or not device.valid(arg.offset, arg.len):
            guest.ret = lib.HVT_RET_EINVAL
            return
        buf = self.memory.buffer(arg.data, arg.len, write=is_read, what=what)
        try:
            if is_read:
                device.read_into(arg.offset, buf)
            else:
                device.write_from(arg.offset, buf)
        except OSError:
            guest.ret = lib.HVT_RET_EUNSPEC
            return
        guest.ret = lib.HVT_RET_OK
