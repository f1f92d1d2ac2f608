"""The hvt hypercall table: the core's four (walltime, puts, poll, halt)
and each device kind's own (pyvmm.devices). Every guest address goes
through GuestMemory.

A handler gets the GPA of its argument struct (the value of the guest's
``outl``) and either fills in the results or raises ``Halt`` (the guest is
done) or ``GuestFault`` (the guest passed something that ends its run).
Results for bad requests the guest can recover from (wrong handle, partial
block) go back in ``ret`` as EINVAL, as solo5-hvt does.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Sequence

from pyvmm._native import ffi, lib
from pyvmm.common.errors import GuestFault
from pyvmm.devices import Device, DeviceKind, Service, kinds
from pyvmm.devices.console import Console
from pyvmm.hvt import fastpath
from pyvmm.kvm.memory import GuestMemory

OK = lib.HVT_RET_OK
AGAIN = lib.HVT_RET_AGAIN
EINVAL = lib.HVT_RET_EINVAL
EUNSPEC = lib.HVT_RET_EUNSPEC


class Halt(Exception):
    """The guest called halt; ``status`` becomes pyvmm's exit status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Hypercalls:
    def __init__(
        self,
        memory: GuestMemory,
        console: Console,
        attached: list[tuple[DeviceKind, Device]],
        stop_fd: int,
        services: Sequence[Service] = (),
    ) -> None:
        self.memory = memory
        self.console = console
        self.devices: dict[int, Device] = {d.handle: d for _, d in attached}
        # Every kind with its devices by handle (none: it still answers, EINVAL).
        self.kinds: list[tuple[DeviceKind, dict[int, Device]]] = [
            (kind, {d.handle: d for k, d in attached if k is kind}) for kind in kinds()
        ]
        self.stop_fd = stop_fd
        self._all_services = list(services)
        # The services whose wake-ups poll waits for, and looks at first.
        self.services = [s for s in services if s.wake_fd >= 0]
        # Poll set: the stop eventfd, each service's wake eventfd, then every
        # device whose fd no IO service owns, by handle.
        served = {h for s in services for h in s.owned}
        waits = {h: d.poll_fd() for h, d in self.devices.items() if h not in served}
        self._poll_handles = [h for h, fd in waits.items() if fd is not None]
        first = [stop_fd, *(s.wake_fd for s in self.services)]
        self._poll_first = len(first)
        fds = first + [waits[h] for h in self._poll_handles]
        fastpath.check_poll_set(len(fds))
        self._poll_fds = ffi.new("int[]", fds)
        self._poll_nfds = len(fds)
        # A bit per fd of the poll set, 64 to a word (csrc/fdwait.h).
        self._ready = ffi.new("uint64_t[]", lib.PYVMM_WAIT_MASK_WORDS)
        self.table: dict[int, Callable[[int], None]] = {
            lib.HVT_HYPERCALL_WALLTIME: self.walltime,
            lib.HVT_HYPERCALL_PUTS: self.puts,
            lib.HVT_HYPERCALL_POLL: self.poll,
            lib.HVT_HYPERCALL_HALT: self.halt,
        }
        for kind, devices in self.kinds:
            self.table |= kind.hypercalls(memory, devices)
        # The transport decodes a number past Solo5's only when this table
        # answers it (csrc/hctransport.h); any other such write stays a
        # port access, as solo5-hvt reports it.
        extra = sum(1 << n for n in self.table if n > lib.HVT_HYPERCALL_MAX)
        if lib.pyvmm_hypercall_set_extra(extra) != 0:
            raise ValueError(f"hypercall numbers {extra:#x} overlap Solo5's own")

    def fast_path(self):
        """These hypercalls as the C fast path sees them (hvt/fastpath.py)."""
        handles = [-1] * self._poll_first + self._poll_handles
        poll = [(self._poll_fds[i], h) for i, h in enumerate(handles)]
        return fastpath.build(self.memory, self.kinds, poll, self._all_services)

    def walltime(self, gpa: int) -> None:
        arg = self.memory.struct("struct hvt_hc_walltime", gpa, what="walltime hypercall")
        arg.nsecs = time.time_ns()

    def puts(self, gpa: int) -> None:
        arg, _ = self.memory.request("struct hvt_hc_puts", gpa, what="puts hypercall")
        self.console.write(self.memory.buffer(arg.data, arg.len, what="puts hypercall"))

    def poll(self, gpa: int) -> None:
        arg, guest = self.memory.request("struct hvt_hc_poll", gpa, what="poll hypercall")
        timeout = min(arg.timeout_nsecs, (1 << 63) - 1)
        services = self.services
        ready = 0
        for service in services:
            # Drain stale wake-ups first, then look: a frame published after
            # this look signals wake_fd again, so the wait below sees it.
            service.drain_wake()
            ready |= service.ready_set()
        if ready:
            timeout = 0
        # A deadline, as the C fast path keeps it (csrc/fdwait.c).
        found = lib.pyvmm_poll_until(self._poll_fds, self._poll_nfds, timeout, self._ready)
        if found < 0 and found != -errno.EINTR:  # EINTR: a stop signal, seen by the run loop
            raise GuestFault(f"poll hypercall: wait failed: {os.strerror(-found)}")
        mask = sum(word << (64 * i) for i, word in enumerate(self._ready)) if found > 0 else 0
        for service in services:
            ready |= service.ready_set()
        for bit, handle in enumerate(self._poll_handles, start=self._poll_first):
            if mask > 0 and mask & (1 << bit):
                ready |= 1 << handle
        guest.ready_set = ready
        guest.ret = OK

    def halt(self, gpa: int) -> None:
        arg, _ = self.memory.request("struct hvt_hc_halt", gpa, what="halt hypercall")
        if arg.cookie:
            # The abort cookie (Solo5 passes it for core dumps): only checked,
            # so a bad one is reported rather than read out of bounds later.
            self.memory.check(arg.cookie, lib.HVT_HALT_COOKIE_MAX, what="halt cookie")
        raise Halt(arg.exit_status)
