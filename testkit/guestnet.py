"""``ffi`` and ``lib`` of testkit._guestnet, the guest's net_shm.c built for
the host (see guestnet_build.py), built first if missing or out of date;
and ``Host``, the test's side of a shmstream region.

The tests play the host: a ``Host`` lays out the boot extension, the region
and its rings as pyvmm's host does (sizes and offsets from csrc/shmstream.h
through cffi), produces RX frames and takes TX frames, and can break any of
it before or between the guest driver's calls.
"""

from __future__ import annotations

from testkit import guestnet_build

if guestnet_build.is_stale():
    guestnet_build.build()

from testkit._guestnet import ffi, lib  # noqa: E402

__all__ = ["ffi", "lib", "Host", "M32", "PAGE", "ring_bytes"]

M32 = 0xFFFFFFFF
PAGE = 4096


def ring_bytes(slots: int) -> int:
    return ffi.sizeof("struct shm_ring") + slots * ffi.sizeof("struct shm_slot")


class Host:
    """One region serving net devices ``handles`` (manifest indices), with
    ``slots`` slots per ring, right above usable memory (boot_info.mem_size
    is the region's address), announced by the boot extension.  Call
    ``lib.gh_reset()`` first (a fresh driver); ``close()`` unmaps it."""

    def __init__(
        self,
        handles: tuple[int, ...] = (1,),
        slots: int = 8,
        mtu: int = 1500,
        size: int | None = None,
        manifest: dict[int, int] | None = None,
    ) -> None:
        self.handles = handles
        self.slots = slots
        self.ring_size = ring_bytes(slots)
        need = lib.SHM_REGION_HEADER_SIZE + 2 * len(handles) * self.ring_size
        self.size = size if size is not None else -(-need // PAGE) * PAGE
        self.mapped = -(-max(self.size, need) // PAGE) * PAGE
        self.mem = lib.gh_map_low(self.mapped)
        assert self.mem != ffi.NULL, "no memory below 4 GiB for the region"
        self.base = int(ffi.cast("uintptr_t", self.mem))

        bi = lib.gh_boot_info()
        bi.mem_size = self.base
        bi.host_features = lib.PYVMM_FEATURE_BOOT_EXT
        self.ext = lib.gh_boot_ext()
        self.ext.magic = lib.PYVMM_BOOT_EXT_MAGIC
        self.ext.version = lib.PYVMM_BOOT_EXT_VERSION
        self.ext.shm_region = self.base
        self.ext.shm_size = self.size
        self.ext.shm_mode = 2

        self.region = ffi.cast("struct shm_region *", self.mem)
        self.region.magic = lib.SHM_MAGIC
        self.region.version = lib.SHM_VERSION
        self.region.ndevices = len(handles)
        self.region.slots = slots
        self.region.size = self.size
        for i, h in enumerate(handles):
            dev = self.region.dev[i]
            dev.handle = h
            dev.rx = self.base + lib.SHM_REGION_HEADER_SIZE + 2 * i * self.ring_size
            dev.tx = dev.rx + self.ring_size
            for gpa in (dev.rx, dev.tx):
                ring = ffi.cast("struct shm_ring *", gpa)
                ring.slots = slots
                ring.slot_size = lib.SHM_SLOT_SIZE

        # Entry 0 is the reserved first one; the rest are net devices unless
        # ``manifest`` says otherwise (handle -> type).
        types = {h: lib.MFT_DEV_NET_BASIC for h in handles} | (manifest or {})
        m = lib.gh_manifest()
        m.version = lib.MFT_VERSION
        m.entries = max(types) + 1
        m.e[0].type = lib.MFT_RESERVED_FIRST
        for h, kind in types.items():
            m.e[h].type = kind
            m.e[h].attached = 1
            m.e[h].u.net_basic.mtu = mtu

    def close(self) -> None:
        lib.gh_unmap(self.mem, self.mapped)

    def dev(self, h: int):
        return self.region.dev[self.handles.index(h)]

    def rx(self, h: int):
        return ffi.cast("struct shm_ring *", self.dev(h).rx)

    def tx(self, h: int):
        return ffi.cast("struct shm_ring *", self.dev(h).tx)

    def slot(self, ring, index: int):
        return ring.slot[index & (self.slots - 1)]

    def put(self, h: int, frame: bytes, length: int | None = None) -> None:
        """Fill the next RX slot with ``frame`` (its length word ``length``,
        by default the frame's) without publishing it."""
        ring = self.rx(h)
        self.put_at(h, ring.prod, frame, length)

    def put_at(self, h: int, index: int, frame: bytes, length: int | None = None) -> None:
        slot = self.slot(self.rx(h), index)
        ffi.memmove(slot.data, frame, len(frame))
        slot.len = len(frame) if length is None else length

    def send(self, h: int, *frames: bytes) -> None:
        """Produce RX frames and publish them."""
        ring = self.rx(h)
        for frame in frames:
            self.put(h, frame)
            ring.prod = (ring.prod + 1) & M32

    def take(self, h: int) -> list[bytes]:
        """Consume every TX frame the guest published."""
        ring = self.tx(h)
        frames = []
        while ring.cons != ring.prod:
            slot = self.slot(ring, ring.cons)
            frames.append(bytes(ffi.buffer(slot.data, slot.len)))
            ring.cons = (ring.cons + 1) & M32
        return frames
