"""The shmstream device set: the shared region, its rings, the IO thread.

Every net device of a guest that asks for shmstream (pyvmm's CAP1 note,
``PYVMM_CAP_SHMSTREAM``) gets an RX and a TX ring in one region at the top
of guest memory; the guest's usable memory (``boot_info.mem_size``) ends
below it, so ``--mem`` stays the total. The region header tells the guest
where each device's rings are; the host never reads it back.
Layout and protocol: csrc/shmstream.h, docs/abi.md, docs/modes.md.
"""

from __future__ import annotations

import os

from pyvmm._native import ffi, lib
from pyvmm.common.errors import HostError, UsageError
from pyvmm.common.log import log
from pyvmm.common.record import Record
from pyvmm.devices.iothread import IoConfig, IoService
from pyvmm.devices.net.device import NetDevice
from pyvmm.kvm.memory import MIB, PAGE_SIZE, GuestMemory

REGION_ALIGN = 2 * MIB
MAX_FRAME = lib.SHM_SLOT_DATA
MAX_AUTO_SLOTS = 4096
MIN_AUTO_SLOTS = 64


def _page_align(value: int) -> int:
    return -(-value // PAGE_SIZE) * PAGE_SIZE


class ShmLayout(Record):
    """Where the region and each device's rings live (guest addresses)."""

    __slots__ = ("gpa", "size", "slots", "ring_size", "handles")

    def __init__(
        self, gpa: int, size: int, slots: int, ring_size: int, handles: tuple[int, ...]
    ) -> None:
        self.gpa = gpa
        self.size = size
        self.slots = slots
        self.ring_size = ring_size
        self.handles = handles

    @staticmethod
    def auto_slots(mem_size: int, ndevices: int) -> int:
        """The most slots (up to MAX_AUTO_SLOTS) whose rings fit in an
        eighth of guest memory. Measured here (bench/RESULTS.md): on a busy
        2-core host the vCPU is descheduled for milliseconds at a time, and
        a deeper RX ring turns those gaps into latency instead of drops
        (256 slots: ~100k frames/s received; 4096: ~200k)."""
        budget = mem_size // 8
        slots = MAX_AUTO_SLOTS
        while slots > MIN_AUTO_SLOTS and 2 * ndevices * slots * lib.SHM_SLOT_SIZE > budget:
            slots //= 2
        return slots

    @staticmethod
    def plan(mem_size: int, handles: tuple[int, ...], slots: int | None = None) -> ShmLayout:
        if slots is None:
            slots = ShmLayout.auto_slots(mem_size, len(handles))
        if len(handles) > lib.SHM_MAX_DEVICES:
            raise UsageError(f"shmstream serves at most {lib.SHM_MAX_DEVICES} net devices")
        ring_size = _page_align(
            ffi.sizeof("struct shm_ring") + slots * ffi.sizeof("struct shm_slot")
        )
        used = lib.SHM_REGION_HEADER_SIZE + 2 * ring_size * len(handles)
        size = -(-used // REGION_ALIGN) * REGION_ALIGN
        if size >= mem_size:
            need = (size + REGION_ALIGN) // MIB
            raise UsageError(
                f"--mem={mem_size // MIB} is too small for the shmstream region "
                f"({size // MIB} MiB): give --mem={need} or more (the region and at least "
                f"{REGION_ALIGN // MIB} MiB for the guest), or --shm=off for plain hypercalls"
            )
        return ShmLayout(mem_size - size, size, slots, ring_size, handles)

    def serving(self, nets: dict[int, NetDevice]) -> ShmLayout | None:
        """This layout for the devices whose frames fit in a slot, or None if
        none does. A tap's MTU is known only once it is attached; a device
        with a larger one (a jumbo-frame tap) is left to the hvt hypercalls,
        which the guest's driver uses for every device the region does not
        list, so the guest starts as under solo5-hvt."""
        fits = tuple(h for h in self.handles if nets[h].max_frame <= MAX_FRAME)
        for handle in self.handles:
            if handle not in fits:
                device = nets[handle]
                log.info(
                    "net device '%s': tap MTU %d is too large for shmstream slots "
                    "(at most %d): hvt hypercalls for it",
                    device.name,
                    device.mtu,
                    MAX_FRAME - lib.HVT_ETH_HLEN,
                )
        if fits == self.handles:
            return self
        return self.replace(handles=fits) if fits else None

    def rings(self, i: int) -> tuple[int, int]:
        """GPAs of device i's RX and TX rings."""
        rx = self.gpa + lib.SHM_REGION_HEADER_SIZE + 2 * i * self.ring_size
        return rx, rx + self.ring_size

    def write(self, memory: GuestMemory) -> None:
        """The region header and each ring's info line, for the guest."""
        region = memory.struct("struct shm_region", self.gpa, what="shmstream region", setup=True)
        region.magic = lib.SHM_MAGIC
        region.version = lib.SHM_VERSION
        region.ndevices = len(self.handles)
        region.slots = self.slots
        region.size = self.size
        for i, handle in enumerate(self.handles):
            rx, tx = self.rings(i)
            region.dev[i].handle = handle
            region.dev[i].rx = rx
            region.dev[i].tx = tx
            for gpa in (rx, tx):
                ring = memory.struct("struct shm_ring", gpa, what="shmstream ring", setup=True)
                ring.slots = self.slots
                ring.slot_size = lib.SHM_SLOT_SIZE


class ShmStream(IoService):
    """The IO thread serving every net device of one guest through rings."""

    key = "shmstream"

    def __init__(
        self,
        memory: GuestMemory,
        layout: ShmLayout,
        nets: dict[int, NetDevice],
        config: IoConfig,
        vm,
        *,
        tap_read: str = "readv",
    ) -> None:
        self.layout = layout
        self.nets = nets
        # The taps it reads: the poll hypercall leaves them to it.
        self.owned = frozenset(layout.handles)
        self._open(config, vm, lib.SHM_KICK_PIO, wake=True)
        try:
            # What the poll hypercall needs, in C and Python alike.
            self.poll_view = ffi.new("struct pyvmm_shm_poll *")
            self.poll_view.io = self.io.native
            self.poll_view.wake_fd = self.wake_fd
            self.poll_view.n = len(layout.handles)
            for i, handle in enumerate(layout.handles):
                device = nets[handle]
                if device.max_frame > MAX_FRAME:
                    raise UsageError(
                        f"net device '{device.name}': tap MTU {device.mtu} is too large for "
                        f"shmstream slots (at most {MAX_FRAME - lib.HVT_ETH_HLEN})"
                    )
                rx_gpa, tx_gpa = layout.rings(i)
                rx = memory.pointer(rx_gpa, layout.ring_size, what="shmstream ring")
                tx = memory.pointer(tx_gpa, layout.ring_size, what="shmstream ring")
                self.io.add_link(device.fileno(), rx, tx, layout.slots)
                self.poll_view.rx[i] = ffi.cast("struct shm_ring *", rx)
                self.poll_view.handle[i] = handle
            #: How the taps are read, as set up: "readv" or "uring".
            self.tap_read = self._choose_reader(tap_read)
        except BaseException:
            self.close()
            raise

    def _choose_reader(self, asked: str) -> str:
        """io_uring's batched reads if asked for and the host gives them
        (set up now, before the sandbox: its filter refuses io_uring_setup),
        else one readv per frame (auto) or a refusal (uring); decided once,
        said at -v."""
        if asked == "readv":
            return "readv"
        err = lib.io_shm_use_uring(self.io.native)
        if err and asked == "uring":
            raise HostError(
                f"--tap-read=uring: io_uring is not available here: {os.strerror(-err)} "
                "(--tap-read=auto falls back to readv)"
            )
        if err:
            log.info("net: tap reads: readv (io_uring is not available: %s)", os.strerror(-err))
            return "readv"
        self._stack.callback(self._release_uring)
        log.info("net: tap reads: io_uring, up to %d in flight per tap", lib.TAP_URING_CHAIN)
        return "uring"

    def _release_uring(self) -> None:
        """The ring closes once the thread is stopped (its last pass cancels
        the reads still in flight into guest memory)."""
        self.io.stop()
        lib.io_shm_release_uring(self.io.native)

    def ready_set(self) -> int:
        """Handles whose RX ring holds frames the guest has not consumed
        (shm_poll_ready_set: only reads the rings; an impossible ``cons``
        just counts as "ready", so the guest looks)."""
        return lib.shm_poll_ready_set(self.poll_view)

    def drain_wake(self) -> None:
        """Re-arm the IO thread's wake-up and clear a stale one; the caller
        looks at the rings afterwards, so nothing published after the
        re-arm can be missed (shm_poll_drain_wake)."""
        lib.shm_poll_drain_wake(self.poll_view)

    def counters(self) -> dict:
        devices = {
            self.nets[handle].name: self.io.link_counters(i)
            for i, handle in enumerate(self.layout.handles)
        }
        return {
            "mode": self.config.mode,
            "tap_read": self.tap_read,
            "thread": self.io.thread_counters(),
            "devices": devices,
        }
