"""Solo5's own ring I/O (v0.11+), served by pyvmm's native IO thread.

Unmodified ring-capable Solo5 unikernels see ``HVT_FEATURE_RING_IO`` in
``host_features`` and a ring at ``boot_info.net_ring``, at the top of guest
memory (the usable memory shrinks by a 2 MiB area), as under solo5-hvt.
Their kicks (``outl`` to 0x600) land in a KVM ioeventfd and the IO thread
answers submissions: writes go to the tap, reads are committed at once.
With ``--net-ring-kicks=exit`` a kick exits instead and the vCPU thread
answers it the same way, at once.
``--no-net-ring`` turns it off. Layout: csrc/solo5_ring.h; docs/abi.md.
"""

from __future__ import annotations

from pyvmm._native import ffi, lib
from pyvmm.devices.iothread import IoConfig, IoService
from pyvmm.devices.net.device import NetDevice
from pyvmm.kvm.memory import MIB, GuestMemory, PagesGone

RING_AREA = 2 * MIB


class Solo5RingService(IoService):
    """The ring at ``gpa``; guest buffers must lie below ``usable``."""

    key = "solo5_ring"
    # The poll hypercall still waits on the taps, and has no ring to look at.
    owned: frozenset[int] = frozenset()
    poll_view = ffi.NULL

    def drain_wake(self) -> None:
        return None

    def ready_set(self) -> int:
        return 0

    def __init__(
        self,
        memory: GuestMemory,
        gpa: int,
        usable: int,
        nets: dict[int, NetDevice],
        config: IoConfig,
        vm,
    ) -> None:
        self.gpa = gpa
        # Kicks served at their exit (--net-ring-kicks=exit, event and
        # hybrid mode): the guest kicks after every submission and the vCPU
        # thread serves each kick, the guest's commit ready when it resumes;
        # no wake-up of the thread per read, but each kick is an exit to user
        # space (docs/solo5-bindings.md, "Who serves a kick"). Otherwise KVM
        # absorbs the kick and wakes the thread. Poll mode's thread serves
        # the ring as it spins, and its guest never kicks: unpinned, its rare
        # kick needs no ioeventfd. Pinned, the thread lingers after reads.
        at_exit = config.kicks == "exit" and config.mode != "poll"
        inline = at_exit or (config.cpu is None and config.mode == "poll")
        # No host-to-guest notification: the guest spins for its commits.
        self._open(config, vm, lib.HVT_RING_KICK_PIO, wake=False, doorbell=not inline)
        try:
            ring = memory.pointer(gpa, ffi.sizeof("struct solo5_ring"), what="Solo5 ring")
            #: The ring as the host reads it (a restore checks its indices).
            self.ring = ffi.cast("struct solo5_ring *", ring)
            self.io.serve_solo5_ring(ring, memory.view, usable)
            for handle, device in nets.items():
                self.io.attach_solo5(handle, device.fileno(), device.max_frame)
            if at_exit:
                self.io.solo5_kicks_at_exit()
        except BaseException:
            self.close()
            raise
        if inline:
            self.kicks_at_exit = self.io.native

    def kick(self) -> None:
        """A kick that reached Python (no fast path): served as the C loop
        serves it."""
        if lib.io_solo5_kick(self.io.native) < 0:
            raise PagesGone("Solo5's ring: guest memory under it is gone (its file was truncated)")

    def counters(self) -> dict:
        return {
            "mode": self.config.mode,
            "thread": self.io.thread_counters(),
            "ring": self.io.solo5_counters(),
        }
