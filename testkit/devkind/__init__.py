"""A device kind for tests only: what a new kind plugs into pyvmm's device seam.

It shows that a kind owns its whole data path without the core naming
it: its option (``--pyvmm-test:NAME=LABEL``), its manifest type
(``MFT_DEV_PYVMM_TEST``), one hypercall (``HVT_HYPERCALL_PYVMM_TEST``,
answered here), one IO service run by pyvmm's native IO thread through the
ops table (its C side in testkit/csrc/devkind.c) and one counter
(``answered``). pyvmm never loads it: a test registers it for its own
process with ``registered()``.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

from pyvmm import devices
from pyvmm._native import ffi as pyvmm_ffi
from pyvmm._native import lib as pyvmm_lib
from pyvmm.common.errors import GuestFault, HostError
from pyvmm.devices import BaseKind, KindPlan, Option, Request, ServiceSetup
from pyvmm.devices.iothread import IoConfig, IoService
from pyvmm.kvm.memory import GuestMemory
from pyvmm.loader import DeviceType
from pyvmm.loader.manifest import BareAttachment
from testkit.native import ffi, lib

#: How long a request waits for the IO thread's answer before the run ends.
ANSWER_TIMEOUT_MS = 10_000


class ProbeService(IoService):
    """The kind's IO service: one native context, on an IO thread of its own
    that the guest never kicks (it asks through the hypercall)."""

    key = "pyvmm_test"
    owned: frozenset[int] = frozenset()  # its devices have no poll fd
    poll_view = pyvmm_ffi.NULL

    def __init__(self) -> None:
        self._open(IoConfig(mode="event"), None, None, wake=False)
        try:
            self.ctx = ffi.new("struct devkind_ctx *")
            self.ctx.req_fd = self._eventfd()
            self.ctx.done_fd = self._eventfd()
            ops = pyvmm_ffi.cast(
                "const struct io_service_ops *", int(ffi.cast("uintptr_t", lib.devkind_ops()))
            )
            ctx = pyvmm_ffi.cast("void *", int(ffi.cast("uintptr_t", self.ctx)))
            for err in (
                pyvmm_lib.io_add_service(self.io.native, ops, ctx),
                pyvmm_lib.io_watch_fd(self.io.native, self.ctx.req_fd),
            ):
                if err:
                    raise HostError(f"IO thread: cannot add the test service: {os.strerror(-err)}")
        except BaseException:
            self.close()
            raise

    def ask(self, value: int) -> int:
        """The IO thread's answer to ``value`` (the vCPU thread waits for it)."""
        self.ctx.request = value
        os.eventfd_write(self.ctx.req_fd, 1)
        waiter = select.poll()
        waiter.register(self.ctx.done_fd, select.POLLIN)
        if not waiter.poll(ANSWER_TIMEOUT_MS):
            raise GuestFault("test hypercall: the IO thread did not answer")
        os.eventfd_read(self.ctx.done_fd)
        return self.ctx.answer

    def answered(self) -> int:
        return lib.devkind_answered(self.ctx)

    def drain_wake(self) -> None:
        return None

    def ready_set(self) -> int:
        return 0

    def counters(self) -> dict[str, Any]:
        return {
            "mode": self.io.config.mode,
            "thread": self.io.thread_counters(),
            "answered": self.answered(),
        }


class ProbeDevice:
    """One declared test device; answers through its kind's service."""

    def __init__(self, name: str, handle: int, label: str) -> None:
        self.name = name
        self.handle = handle
        self.label = label
        self.service: ProbeService | None = None

    def attachment(self) -> BareAttachment:
        return BareAttachment(DeviceType.PYVMM_TEST)

    def poll_fd(self) -> int | None:
        return None

    def counters(self) -> dict[str, int]:
        return {"answered": self.service.answered() if self.service is not None else 0}

    def close(self) -> None:
        return None


class ProbeKind(BaseKind):
    label = "pyvmm-test"
    type = DeviceType.PYVMM_TEST
    options = (
        Option(
            "pyvmm-test",
            "LABEL",
            "attach test device NAME (tests only)",
            attaches=True,
        ),
    )

    def attach(self, stack: ExitStack, request: Request) -> ProbeDevice:
        return ProbeDevice(request.name, request.handle, request.settings["pyvmm-test"])

    def start_service(
        self, plan: KindPlan | None, setup: ServiceSetup, devices: Mapping[int, ProbeDevice]
    ) -> tuple[ProbeService | None, dict[str, int]]:
        if not devices:
            return None, {}
        service = ProbeService()
        setup.stack.callback(service.close)
        for device in devices.values():
            device.service = service
        return service, {}

    def hypercalls(
        self, memory: GuestMemory, devices: Mapping[int, ProbeDevice]
    ) -> dict[int, Callable[[int], None]]:
        def probe(gpa: int) -> None:
            arg, guest = memory.request("struct hvt_hc_pyvmm_test", gpa, what="test hypercall")
            device = devices.get(arg.handle)
            if device is None or device.service is None:
                guest.ret = pyvmm_lib.HVT_RET_EINVAL
                return
            guest.answer = device.service.ask(arg.value)
            guest.ret = pyvmm_lib.HVT_RET_OK

        return {pyvmm_lib.HVT_HYPERCALL_PYVMM_TEST: probe}


PROBE = ProbeKind()


@contextmanager
def registered() -> Iterator[ProbeKind]:
    """The test kind in ``pyvmm.devices.kinds()`` for the block's duration."""
    remove = devices.register(PROBE)
    try:
        yield PROBE
    finally:
        remove()
