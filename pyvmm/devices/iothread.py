"""Control of the native IO thread (csrc/iothread.c): modes, start/stop, stats.

The thread itself is C: it owns the taps of every shmstream device (each a
"link": a tap and its two rings) or of Solo5's ring and moves frames between
them without the GIL. Python only creates it, starts it before the guest
runs, stops it on every exit path and reads its counters.
"""

from __future__ import annotations

import os
from contextlib import ExitStack

from pyvmm._native import ffi, lib
from pyvmm.arch import host_arch
from pyvmm.common.errors import HostError
from pyvmm.common.record import Record
from pyvmm.host.threadswitches import ThreadSwitches

MODES = {"poll": lib.IO_MODE_POLL, "event": lib.IO_MODE_EVENT, "hybrid": lib.IO_MODE_HYBRID}
# Hybrid mode keeps polling this long without work before sleeping again:
# longer than the gap between requests at 1000/s, so a request/response
# stream gets poll's round trip, while an idle guest costs < 1% of a core
# (bench/pps.py --budgets measures the choice; docs/modes.md).
DEFAULT_HYBRID_BUDGET_US = 2000

LINK_COUNTERS = [name for name, _ in ffi.typeof("struct shm_counters").fields]
THREAD_COUNTERS = [name for name, _ in ffi.typeof("struct io_stats").fields]
SOLO5_COUNTERS = [name for name, _ in ffi.typeof("struct solo5_ring_counters").fields]


class IoConfig(Record):
    """The IO thread's settings: its mode, hybrid budget and CPU, and who
    serves a kick of Solo5's ring (``thread`` or the vCPU thread at its
    ``exit``)."""

    __slots__ = ("mode", "hybrid_budget_us", "cpu", "kicks")

    def __init__(
        self,
        mode: str = "event",
        hybrid_budget_us: int = DEFAULT_HYBRID_BUDGET_US,
        cpu: int | None = None,
        kicks: str = "thread",
    ) -> None:
        self.mode = mode
        self.hybrid_budget_us = hybrid_budget_us
        self.cpu = cpu
        self.kicks = kicks


class IoThread:
    """One native IO thread; ``close()`` stops it and frees it, idempotently."""

    def __init__(self, config: IoConfig, kick_fd: int, wake_fd: int) -> None:
        self.config = config
        cpu = -1 if config.cpu is None else config.cpu
        self._io = lib.io_create(MODES[config.mode], config.hybrid_budget_us, cpu, kick_fd, wake_fd)
        if self._io == ffi.NULL:
            raise HostError("cannot create the IO thread: out of memory or file descriptors")
        self.links = 0
        self._switches: ThreadSwitches | None = None

    def add_link(self, backend_fd: int, rx, tx, slots: int) -> int:
        """A shmstream device: its tap and its rings; returns the link index."""
        link = lib.io_add_link(self._io, backend_fd, rx, tx, slots)
        if link < 0:
            raise HostError(f"IO thread: cannot add a device: {os.strerror(-link)}")
        self.links += 1
        return link

    def serve_solo5_ring(self, ring, view, usable: int) -> None:
        """Also serve Solo5's ring at ``ring``; guest buffers are checked
        against ``view`` (GuestMemory.view) and must lie below ``usable``."""
        err = lib.io_set_solo5_ring_view(self._io, ring, view, usable)
        if err:
            raise HostError(f"IO thread: cannot serve the Solo5 ring: {os.strerror(-err)}")

    def attach_solo5(self, handle: int, backend_fd: int, max_frame: int) -> None:
        err = lib.io_solo5_attach_tap(self._io, handle, backend_fd, max_frame)
        if err:
            raise HostError(f"IO thread: cannot attach handle {handle}: {os.strerror(-err)}")

    def solo5_kicks_at_exit(self) -> None:
        """The vCPU thread serves the ring's kicks (no ioeventfd): ask the
        guest for one after every submission."""
        err = lib.io_solo5_kicks_at_exit(self._io)
        if err:
            raise HostError(f"IO thread: cannot serve kicks at their exit: {os.strerror(-err)}")

    def solo5_counters(self) -> dict[str, int]:
        c = lib.io_solo5_counters(self._io)
        return {name: getattr(c, name) for name in SOLO5_COUNTERS}

    @property
    def native(self):
        """The ``struct iothread *`` (for C that runs while it lives)."""
        return self._io

    def start(self) -> None:
        err = lib.io_start(self._io)
        if err:
            raise HostError(f"cannot start the IO thread: {os.strerror(-err)}")
        if self._switches is not None:
            self._switches.close()
        self._switches = ThreadSwitches(lib.io_thread_tid(self._io))

    def stop(self) -> None:
        if self._io != ffi.NULL:
            if self._switches is not None:  # its last reading, while it lives
                self._switches.read()
            lib.io_stop(self._io)

    def close(self) -> None:
        if self._switches is not None:
            self._switches.close()
        if self._io != ffi.NULL:
            lib.io_destroy(self._io)
            self._io = ffi.NULL

    def pause(self) -> None:
        """Hold the thread between two passes (a snapshot's quiescence)."""
        lib.io_pause(self._io)

    def resume(self) -> None:
        lib.io_resume(self._io)

    def link_indices(self, link: int) -> tuple[int, int]:
        """Link ``link``'s own RX producer and TX consumer indices."""
        rx, tx = ffi.new("uint32_t *"), ffi.new("uint32_t *")
        if lib.io_link_indices(self._io, link, rx, tx):
            raise HostError(f"IO thread: no link {link}")
        return rx[0], tx[0]

    def set_link_indices(self, link: int, rx_prod: int, tx_cons: int) -> None:
        err = lib.io_link_set_indices(self._io, link, rx_prod, tx_cons)
        if err:
            raise HostError(f"IO thread: cannot set link {link}'s indices: {os.strerror(-err)}")

    def solo5_indices(self) -> tuple[int, int]:
        """Solo5's ring: the host's entry head and commit tail."""
        head, tail = ffi.new("uint32_t *"), ffi.new("uint32_t *")
        if lib.io_solo5_indices(self._io, head, tail):
            raise HostError("IO thread: it serves no Solo5 ring")
        return head[0], tail[0]

    def set_solo5_indices(self, ent_head: int, com_tail: int) -> None:
        err = lib.io_solo5_set_indices(self._io, ent_head, com_tail)
        if err:
            raise HostError(f"IO thread: cannot set the Solo5 ring's indices: {os.strerror(-err)}")

    def set_counters(self, which: str, values: dict[str, int], link: int = 0) -> None:
        """Counters continued from a snapshot's (before the thread starts):
        ``which`` is "link", "thread" or "solo5"; the names are checked by
        the caller against the struct's fields."""
        target = {
            "link": lambda: lib.io_link_counters(self._io, link),
            "thread": lambda: lib.io_thread_stats(self._io),
            "solo5": lambda: lib.io_solo5_counters(self._io),
        }[which]()
        for name, value in values.items():
            setattr(target, name, value)

    def link_counters(self, link: int) -> dict[str, int]:
        c = lib.io_link_counters(self._io, link)
        return {name: getattr(c, name) for name in LINK_COUNTERS}

    def thread_counters(self) -> dict[str, int]:
        s = lib.io_thread_stats(self._io)
        counters = {name: getattr(s, name) for name in THREAD_COUNTERS}
        counters["cpu_ns"] = lib.io_cpu_ns(self._io)
        if self._switches is not None:
            counters.update(self._switches.read())
        return counters


class IoService:
    """Devices served by one IoThread; the guest kicks it through a port
    write that KVM turns into an eventfd signal (``KVM_IOEVENTFD``), so a
    kick never exits to pyvmm (Solo5's ring on an unpinned thread excepted:
    ``kicks_at_exit``). Subclasses attach their devices in
    ``__init__`` between ``_open`` and the end, and call ``close`` on error.
    """

    #: A ``struct iothread *`` whose kicks the vCPU thread serves itself at
    #: their exit (io_solo5_kick), or NULL: KVM absorbs them (an ioeventfd).
    kicks_at_exit = ffi.NULL

    def _open(
        self, config: IoConfig, vm, kick_port: int | None, *, wake: bool, doorbell: bool = True
    ) -> None:
        """``kick_port`` None: a service the guest never kicks (no doorbell).
        ``doorbell`` False: the kicks exit to pyvmm, and the eventfd only
        hands the IO thread a kick the vCPU thread could not serve."""
        self.config = config
        self._stack = ExitStack()
        try:
            self.kick_fd = -1
            if kick_port is not None:
                self.kick_fd = self._eventfd()
            if kick_port is not None and doorbell:
                # The architecture's doorbell: a port on x86_64, MMIO on aarch64.
                host_arch().add_doorbell(vm, self.kick_fd, kick_port)
            # wake: the IO thread wakes the vCPU blocked in the poll hypercall.
            self.wake_fd = self._eventfd() if wake else -1
            self.io = IoThread(config, self.kick_fd, self.wake_fd)
            self._stack.callback(self.io.close)
        except BaseException:  # the caller's own clean-up needs self.io
            self._stack.close()
            raise

    def _eventfd(self) -> int:
        fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._stack.callback(os.close, fd)
        return fd

    def start(self) -> None:
        self.io.start()

    def stop(self) -> None:
        self.io.stop()

    def pause(self) -> None:
        self.io.pause()

    def resume(self) -> None:
        self.io.resume()

    def close(self) -> None:
        self._stack.close()
