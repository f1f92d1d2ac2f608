"""Hypercall handlers read each request field once, from a private copy.

The review's case: a request struct in a ring area, which the IO thread may
rewrite while the handler runs, read twice through the guest pointer (once
to check, once to use). Here the device, between the check and the use,
rewrites the guest's struct as that concurrent writer would: the handler
must act on what it checked, and write back only result fields.
"""

from __future__ import annotations

import pytest

from pyvmm._native import ffi, lib
from pyvmm.devices.block.hypercalls import BlockHypercalls
from pyvmm.devices.net.hypercalls import NetHypercalls
from pyvmm.kvm.memory import GuestMemory

ARG = 0x200000
BUF = 0x300000


@pytest.fixture
def memory():
    with GuestMemory(8 << 20) as mem:
        yield mem


class RacingNet:
    """A net device that rewrites the request's length when checked."""

    def __init__(self, memory: GuestMemory, ctype: str) -> None:
        self.memory, self.ctype, self.written = memory, ctype, []

    @property
    def max_frame(self) -> int:
        self.memory.struct(self.ctype, ARG).len = 0x10000  # the concurrent write
        return 1514

    def write(self, data) -> None:
        self.written.append(len(data))


def test_net_write_sends_the_length_it_checked(memory) -> None:
    arg = memory.struct("struct hvt_hc_net_write", ARG)
    arg.handle, arg.data, arg.len = 0, BUF, 100
    device = RacingNet(memory, "struct hvt_hc_net_write")
    NetHypercalls(memory, {0: device}).net_write(ARG)
    assert device.written == [100]  # not 0x10000: over the MTU, never checked
    assert arg.ret == lib.HVT_RET_OK
    assert arg.len == 0x10000  # a request field: not written back


class RacingDisk:
    """A disk that rewrites the request once it said it is valid."""

    def __init__(self, memory: GuestMemory, ctype: str) -> None:
        self.memory, self.ctype, self.done = memory, ctype, []

    def valid(self, offset: int, length: int) -> bool:
        racing = self.memory.struct(self.ctype, ARG)
        racing.offset, racing.len = 1 << 40, 0x40000
        return offset == 512 and length == 512

    def read_into(self, offset: int, buf) -> None:
        self.done.append((offset, len(buf)))

    def write_from(self, offset: int, buf) -> None:
        self.done.append((offset, len(buf)))


@pytest.mark.parametrize("call", ["block_read", "block_write"])
def test_block_requests_use_the_offset_and_length_they_checked(memory, call) -> None:
    ctype = f"struct hvt_hc_{call}"
    arg = memory.struct(ctype, ARG)
    arg.handle, arg.offset, arg.data, arg.len = 0, 512, BUF, 512
    disk = RacingDisk(memory, ctype)
    getattr(BlockHypercalls(memory, {0: disk}), call)(ARG)
    assert disk.done == [(512, 512)]
    assert arg.ret == lib.HVT_RET_OK


def test_net_read_writes_back_only_len_and_ret(memory) -> None:
    class Reader:
        max_frame = 1514

        def read_into(self, buf) -> int:
            racing = memory.struct("struct hvt_hc_net_read", ARG)
            racing.handle, racing.data = 77, 0x1234  # rewritten meanwhile
            buf[:3] = b"abc"
            return 3

    arg = memory.struct("struct hvt_hc_net_read", ARG)
    arg.handle, arg.data, arg.len = 0, BUF, 1514
    NetHypercalls(memory, {0: Reader()}).net_read(ARG)
    assert (arg.ret, arg.len) == (lib.HVT_RET_OK, 3)
    assert (arg.handle, arg.data) == (77, 0x1234)  # left as the writer left them
    assert bytes(ffi.buffer(memory.pointer(BUF, 3, write=False), 3)) == b"abc"
