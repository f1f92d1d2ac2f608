"""The hypercall fast path's configuration (``struct pyvmm_fastpath``,
csrc/hcfast.h): what the C loop needs to answer the clean cases of
walltime, poll, net_read, net_write, block_read and block_write without
Python.

Everything else goes back to the Python handlers, so both agree by
construction on every error: guest addresses are checked by the same
accessor (``GuestMemory.view``, csrc/guestmem.h), and poll with a shmstream
region looks at the rings through the same C functions that
``ShmStream.ready_set`` and ``drain_wake`` call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib

if TYPE_CHECKING:
    from pyvmm.devices.block import BlockDevice
    from pyvmm.devices.net.device import NetDevice
    from pyvmm.devices.net.shmstream import ShmStream
    from pyvmm.memory import GuestMemory


def build(
    memory: GuestMemory,
    nets: Mapping[int, NetDevice],
    disks: Mapping[int, BlockDevice],
    poll: Sequence[tuple[int, int]],
    shm: ShmStream | None,
):
    """A ``struct pyvmm_fastpath *`` for guest memory ``memory``, the net and
    block devices by manifest handle, the poll set as (fd, handle) pairs in
    wait order (handle -1 for the stop and wake eventfds) and the shmstream
    service, if any. The structs it points at (``memory.view``,
    ``shm.poll_view``) live as long as ``memory`` and ``shm``."""
    if len(poll) > lib.PYVMM_FAST_MAX_POLL:
        raise ValueError(f"a poll set of {len(poll)} fds (at most {lib.PYVMM_FAST_MAX_POLL})")
    fp = ffi.new("struct pyvmm_fastpath *")
    fp.mem = memory.view
    fp.shm = shm.poll_view if shm is not None else ffi.NULL
    for handle in range(lib.MFT_MAX_ENTRIES):
        fp.net_fd[handle] = fp.blk_fd[handle] = -1
    for handle, net in nets.items():
        fp.net_fd[handle] = net.fileno()
        fp.max_frame[handle] = net.max_frame
    for handle, disk in disks.items():
        fp.blk_fd[handle] = disk.fileno()
        fp.blk_capacity[handle] = disk.capacity
        fp.blk_block_size[handle] = disk.block_size
    fp.n_poll = len(poll)
    for i, (fd, handle) in enumerate(poll):
        fp.poll_fd[i] = fd
        fp.poll_handle[i] = handle
    return fp
