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
from pyvmm.common.errors import HostError

if TYPE_CHECKING:
    from pyvmm.devices import Device, DeviceKind, Service
    from pyvmm.kvm.memory import GuestMemory


def check_poll_set(nfds: int) -> None:
    """Refuse a poll set larger than the one limit both waits take
    (csrc/fdwait.h), when the set is built: before the guest runs, not at
    its first poll hypercall."""
    if nfds > lib.PYVMM_WAIT_MAX_FDS:
        raise HostError(
            f"the poll hypercall would wait on {nfds} fds (the stop eventfd, each IO "
            f"service's wake eventfd, each device's fd): at most {lib.PYVMM_WAIT_MAX_FDS}"
        )


def build(
    memory: GuestMemory,
    kinds: Sequence[tuple[DeviceKind, Mapping[int, Device]]],
    poll: Sequence[tuple[int, int]],
    services: Sequence[Service] = (),
):
    """A ``struct pyvmm_fastpath *`` for guest memory ``memory``: each kind
    fills in its part for its devices by manifest handle; the poll set as
    (fd, handle) pairs in wait order (handle -1 for the stop and wake
    eventfds); the rings of the one service that gives the C poll a view
    of them, if any. The structs it points at (``memory.view``, a
    service's ``poll_view``) live as long as ``memory`` and the service."""
    check_poll_set(len(poll))
    fp = ffi.new("struct pyvmm_fastpath *")
    fp.mem = memory.view
    views = [s.poll_view for s in services if s.poll_view != ffi.NULL]
    if len(views) > 1:
        raise ValueError(f"{len(views)} services with a poll view (the C poll reads one)")
    fp.shm = views[0] if views else ffi.NULL
    kicked = [s.kicks_at_exit for s in services if s.kicks_at_exit != ffi.NULL]
    if len(kicked) > 1:
        raise ValueError(f"{len(kicked)} services served at a kick's exit (the C loop serves one)")
    fp.ring_io = kicked[0] if kicked else ffi.NULL
    for kind, devices in kinds:
        kind.fill_fast_path(fp, devices)
    fp.n_poll = len(poll)
    for i, (fd, handle) in enumerate(poll):
        fp.poll_fd[i] = fd
        fp.poll_handle[i] = handle
    return fp
