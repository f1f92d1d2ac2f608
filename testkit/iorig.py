"""The one test rig around pyvmm's native IO thread (csrc/iothread.c).

An ``IoRig`` owns an IO thread made by ``io_create`` (not started unless a
test starts it), its kick and wake eventfds when asked for, and the
socketpair "taps" it serves: a non-blocking AF_UNIX SOCK_SEQPACKET pair
carries one frame per read or write, as a tap does. The test holds the
``peer`` end; ``serve()`` runs one pass of every service on the calling
thread (testkit's io_test_service), ``start``/``stop`` run the thread, and
a stop that hangs fails the test instead of hanging it. ``close()`` is
safe on every path and leaves no fd behind.

Two services plug in:

- ``ShmRig``: one shmstream link, its two rings between guard areas, with
  the guest's side driven by the same shm_test_* operations the guest
  driver compiles (tests/unit/test_iothread.py);
- ``Solo5Rig``: Solo5's own ring over a guest-memory view, either a plain
  buffer between guard areas or a real ``GuestMemory``
  (tests/unit/test_solo5_ring.py, test_solo5_ring_limits.py).

Memory the host may not write sits in a ``GuardedBuffer``: any write
outside its regions changes a guard, and ``intact()`` shows it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import pytest

from pyvmm._native import ffi, lib
from testkit.native import lib as kit

if TYPE_CHECKING:
    from pyvmm.kvm.memory import GuestMemory

MASK = 0xFFFFFFFF
BAD = kit.SHM_TEST_BAD
SLOT_SIZE = lib.SHM_SLOT_SIZE
SLOT_DATA = lib.SHM_SLOT_DATA
HEADER = 3 * lib.SHM_CACHE_LINE  # ring header: producer, consumer, info lines
GUARD = 4096
GUARD_BYTES = np.frombuffer(b"\xde\xad\xbe\xef" * (GUARD // 4), dtype=np.uint8)
COUNTERS = [name for name, _ in ffi.typeof("struct shm_counters").fields]
NEAR_WRAP = 2**32 - 5
#: The largest frame a rig's socketpair carries (any a tap could).
ANY_FRAME = 65535

# Ring field offsets, from the header via cffi rather than hand-computed.
OFF_PROD = ffi.offsetof("struct shm_ring", "prod")
OFF_CONS = ffi.offsetof("struct shm_ring", "cons")
OFF_LEN = ffi.offsetof("struct shm_slot", "len")
OFF_DATA = ffi.offsetof("struct shm_slot", "data")


class GuardedBuffer:
    """Regions of one 64-aligned buffer, each between guard areas:
    guard | region 0 | guard | region 1 | ... | guard. Regions start zeroed."""

    def __init__(self, *sizes: int) -> None:
        total = GUARD * (len(sizes) + 1) + sum(sizes)
        self._raw = ffi.new("uint8_t[]", total + 64)
        align = -int(ffi.cast("uintptr_t", self._raw)) % 64
        #: The whole buffer, guards included, as bytes a test can index.
        self.mem = np.frombuffer(ffi.buffer(self._raw), dtype=np.uint8)[align : align + total]
        self._base = ffi.cast("uint8_t *", self._raw) + align
        self.offsets: list[int] = []
        self.guards: list[tuple[int, int]] = [(0, GUARD)]
        at = GUARD
        for size in sizes:
            self.offsets.append(at)
            at += size
            self.guards.append((at, GUARD))
            at += GUARD
        for start, size in self.guards:
            self.mem[start : start + size] = GUARD_BYTES[:size]

    def at(self, region: int):
        """Region ``region``'s first byte (``uint8_t *``)."""
        return self._base + self.offsets[region]

    def intact(self) -> bool:
        return all(
            np.array_equal(self.mem[start : start + size], GUARD_BYTES[:size])
            for start, size in self.guards
        )


def _eventfd() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


class IoRig:
    """An IO thread for a test, its eventfds and its socketpair taps."""

    def __init__(
        self,
        mode: int = lib.IO_MODE_EVENT,
        budget_us: int = 0,
        *,
        kick: bool = False,
        wake: bool = False,
        cpu: int = -1,
    ) -> None:
        self._socks: list[socket.socket] = []
        self.kick = _eventfd() if kick else -1
        self.wake = _eventfd() if wake else -1
        self.io = lib.io_create(mode, budget_us, cpu, self.kick, self.wake)
        if self.io == ffi.NULL:
            self._close_fds()
            raise AssertionError("io_create failed")
        self.stats = lib.io_thread_stats(self.io)
        self._hung = False

    def tap(self, buffer_bytes: int | None = None) -> tuple[socket.socket, socket.socket]:
        """A (host end, peer end) pair; the host end is what the IO thread
        serves, the peer end the test's. Both closed with the rig."""
        host, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socks += [host, peer]
        for sock in (host, peer):
            sock.setblocking(False)
            if buffer_bytes is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
        return host, peer

    # -- running it ---------------------------------------------------------------

    def serve(self) -> int:
        """One pass of every service on this thread: the work they report."""
        return kit.io_test_service(self.io)

    def service_until_idle(self, max_passes: int = 1000) -> int:
        passes = 0
        while self.serve():
            passes += 1
            assert passes < max_passes, "the services never ran out of work"
        return passes

    def start(self) -> None:
        assert lib.io_start(self.io) == 0

    def stop(self, seconds: float = 30.0) -> float:
        """io_stop on a helper thread, so a hang fails instead of hanging."""
        t0 = time.monotonic()
        stopper = threading.Thread(target=lib.io_stop, args=(self.io,), daemon=True)
        stopper.start()
        stopper.join(seconds)
        if stopper.is_alive():
            self._hung = True
            pytest.fail(f"io_stop did not return within {seconds} s")
        return time.monotonic() - t0

    def close(self) -> None:
        """Stop and destroy the thread (not one whose stop hung: it may
        still use what it was given), then close the taps and eventfds."""
        if self.io is None:
            return
        if not self._hung:
            self.stop()
            lib.io_destroy(self.io)
        self.io = None
        self._close_fds()

    def _close_fds(self) -> None:
        for sock in self._socks:
            sock.close()
        for fd in (self.kick, self.wake):
            if fd >= 0:
                os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ShmRig(IoRig):
    """One shmstream link: two rings between guard areas, a socketpair
    backend (or ``backend_fd``), the guest's side driven by the test.

    The guest's private indices are rx_cons and tx_prod; ``mem`` is the
    whole buffer (guard | RX ring | guard | TX ring | guard).
    """

    def __init__(
        self,
        slots: int = 8,
        *,
        mode: int = lib.IO_MODE_EVENT,
        budget_us: int = 200,
        start_rx: int = NEAR_WRAP,
        start_tx: int = NEAR_WRAP,
        kick: bool = True,
        wake: bool = True,
        backend_fd: int | None = None,
        cpu: int = -1,
    ) -> None:
        super().__init__(mode, budget_us, kick=kick, wake=wake, cpu=cpu)
        self.slots = slots
        self.ring_size = int(kit.shm_test_ring_size(slots))
        self.buffer = GuardedBuffer(self.ring_size, self.ring_size)
        self.mem = self.buffer.mem
        self.rx_off, self.tx_off = self.buffer.offsets
        self.guards = self.buffer.guards
        self.rx = ffi.cast("struct shm_ring *", self.buffer.at(0))
        self.tx = ffi.cast("struct shm_ring *", self.buffer.at(1))
        for ring, start in ((self.rx, start_rx), (self.tx, start_tx)):
            ring.prod = ring.cons = start
            ring.slots = slots
            ring.slot_size = SLOT_SIZE
        self.rx_cons = start_rx
        self.tx_prod = start_tx

        self.host, self.peer = self.tap(4 << 20)
        backend = self.host.fileno() if backend_fd is None else backend_fd
        self.port = lib.io_add_link(self.io, backend, self.rx, self.tx, slots)
        assert self.port == 0
        self.counters = lib.io_link_counters(self.io, self.port)
        self.guest_kicks = 0

    # -- what the test looks at ---------------------------------------------------

    def count(self) -> dict[str, int]:
        return {name: getattr(self.counters, name) for name in COUNTERS}

    def guards_intact(self) -> bool:
        return self.buffer.intact()

    def host_writable(self) -> np.ndarray:
        """Bytes the host may write during a pass: RX prod, RX slot
        lengths and data, TX cons.  Never a TX slot, never a guest field."""
        ok = np.zeros(len(self.mem), dtype=bool)
        ok[self.rx_off + OFF_PROD : self.rx_off + OFF_PROD + 4] = True
        ok[self.tx_off + OFF_CONS : self.tx_off + OFF_CONS + 4] = True
        for i in range(self.slots):
            slot = self.rx_off + HEADER + i * SLOT_SIZE
            ok[slot + OFF_LEN : slot + OFF_LEN + 4] = True
            ok[slot + OFF_DATA : slot + SLOT_SIZE] = True
        return ok

    def rx_slot(self, index: int) -> object:
        return ffi.cast("struct shm_slot *", kit.shm_test_slot(self.rx, index & MASK, self.slots))

    def tx_slot(self, index: int) -> object:
        return ffi.cast("struct shm_slot *", kit.shm_test_slot(self.tx, index & MASK, self.slots))

    # -- the backend (tap) side -------------------------------------------------

    def backend_send(self, frames: list[bytes]) -> None:
        for f in frames:
            assert self.peer.send(f) == len(f)

    def backend_receive(self) -> list[bytes]:
        out = []
        while True:
            try:
                out.append(self.peer.recv(1 << 17))
            except BlockingIOError:
                return out

    # -- the guest side ---------------------------------------------------------

    def guest_receive(self, limit: int | None = None) -> list[bytes]:
        avail = kit.shm_test_cons_avail(self.rx, self.rx_cons, self.slots)
        assert avail != BAD, "the host published an impossible RX index"
        if limit is not None:
            avail = min(avail, limit)
        out = []
        for _ in range(avail):
            slot = self.rx_slot(self.rx_cons)
            assert 1 <= slot.len <= SLOT_DATA
            out.append(ffi.buffer(slot.data, slot.len)[:])
            self.rx_cons = (self.rx_cons + 1) & MASK
        if out:
            kit.shm_test_cons_release(self.rx, self.rx_cons)
        return out

    def guest_send(self, frames: list[bytes], *, kick: bool = True) -> int:
        """Write as many frames as fit, publish once, kick if the host sleeps."""
        space = kit.shm_test_prod_space(self.tx, self.tx_prod, self.slots)
        assert space != BAD, "the host released an impossible TX index"
        sent = frames[:space]
        for f in sent:
            slot = self.tx_slot(self.tx_prod)
            ffi.memmove(slot.data, f, len(f))
            slot.len = len(f)
            self.tx_prod = (self.tx_prod + 1) & MASK
        if sent:
            kit.shm_test_prod_publish(self.tx, self.tx_prod)
            if kick and kit.shm_test_prod_needs_notify(self.tx) and self.kick >= 0:
                os.eventfd_write(self.kick, 1)
                self.guest_kicks += 1
        return len(sent)


class Solo5Rig(IoRig):
    """Solo5's ring served by the IO thread, one tap attached on handle 1.

    Guest memory is ``memory`` (a ``GuestMemory``, closed with the rig,
    its view the service's, ``usable`` bytes of it the guest's) or, without
    one, ``size`` plain bytes between guard areas, nothing refused inside
    them (``mem`` is then their ``uint8_t *``). The ring itself lives
    outside guest memory.
    """

    def __init__(
        self,
        memory: GuestMemory | None = None,
        *,
        size: int = 64 * 1024,
        usable: int | None = None,
        max_frame: int = ANY_FRAME,
        kick: bool = False,
        cpu: int = -1,
        mode: int = lib.IO_MODE_EVENT,
        budget_us: int = 0,
    ) -> None:
        super().__init__(mode, budget_us, kick=kick, cpu=cpu)
        self.buffer: GuardedBuffer | None = None
        self._memory = memory
        if memory is None:
            self.buffer = GuardedBuffer(size)
            self.mem = self.buffer.at(0)
            host = int(ffi.cast("uintptr_t", self.mem))
            self.view = ffi.new("struct pyvmm_guestmem *", {"host": host, "size": size})
            usable = size if usable is None else usable
        else:
            self.mem = memory
            self.view = memory.view
            usable = memory.size if usable is None else usable
        self.ring_mem = ffi.new("uint8_t[]", ffi.sizeof("struct solo5_ring"))
        self.ring = ffi.cast("struct solo5_ring *", self.ring_mem)
        self.host, self.peer = self.tap()
        assert lib.io_set_solo5_ring_view(self.io, self.ring, self.view, usable) == 0
        assert lib.io_solo5_attach_tap(self.io, 1, self.host.fileno(), max_frame) == 0
        self.counters = lib.io_solo5_counters(self.io)

    def submit(self, op: int, data: int, length: int, ident: int = 0, *, handle: int = 1) -> None:
        """One entry, as the guest writes it, then its tail moved on."""
        e = self.ring.ent[self.ring.ent_tail % 1024]
        e.operation, e.handle, e.data, e.len, e.id = op, handle, data, length, ident
        self.ring.ent_tail = (self.ring.ent_tail + 1) & 0xFFFFFFFF  # free-running

    def commit(self, i: int) -> tuple[int, int, int]:
        """Completion ``i``: (id, ret, len)."""
        c = self.ring.com[i]
        return c.id, c.ret, c.len

    def guards_intact(self) -> bool:
        return self.buffer is not None and self.buffer.intact()

    def close(self) -> None:
        super().close()
        if self._memory is not None:
            self._memory.close()
            self._memory = None
