"""Typed VM exits: what ``Vcpu.run()`` returns, for a ``match`` in the run loop.

NamedTuples rather than frozen dataclasses: equally immutable and matchable,
and about six times cheaper to define, which every pyvmm start pays. No
``from __future__ import annotations`` here: NamedTuple turns each string
annotation into a ForwardRef, which compiles it (33 compiles, 5 ms of every
start); the plain types cost nothing to check.
"""

from typing import NamedTuple

from pyvmm._native import lib


class IoOut(NamedTuple):
    port: int
    size: int
    value: int


class IoIn(NamedTuple):
    port: int
    size: int


class Mmio(NamedTuple):
    addr: int
    length: int
    is_write: bool
    value: int


class Hlt(NamedTuple):
    pass


class Shutdown(NamedTuple):
    """Triple fault (x86) or a shutdown request: the guest cannot go on."""


class InternalError(NamedTuple):
    suberror: int


class FailEntry(NamedTuple):
    hardware_reason: int


class MemoryFault(NamedTuple):
    """KVM could not map guest memory for an access (e.g. write to read-only)."""

    gpa: int | None
    flags: int


class SystemEvent(NamedTuple):
    pass


class Interrupted(NamedTuple):
    """KVM_RUN returned EINTR: a signal is pending for the vCPU thread."""


class UnknownExit(NamedTuple):
    reason: int
    hardware_reason: int


VcpuExit = (
    IoOut
    | IoIn
    | Mmio
    | Hlt
    | Shutdown
    | InternalError
    | FailEntry
    | MemoryFault
    | SystemEvent
    | Interrupted
    | UnknownExit
)


def decode(exit) -> VcpuExit:
    """Turn the C-decoded ``struct pyvmm_exit`` into its typed exit."""
    reason = exit.reason
    if reason == lib.KVM_EXIT_IO:
        if exit.io_direction == lib.KVM_EXIT_IO_OUT:
            return IoOut(exit.io_port, exit.io_size, exit.io_value)
        return IoIn(exit.io_port, exit.io_size)
    if reason == lib.KVM_EXIT_MMIO:
        return Mmio(exit.mmio_addr, exit.mmio_len, bool(exit.mmio_is_write), exit.mmio_value)
    if reason == lib.KVM_EXIT_HLT:
        return Hlt()
    if reason == lib.KVM_EXIT_SHUTDOWN:
        return Shutdown()
    if reason == lib.KVM_EXIT_INTERNAL_ERROR:
        return InternalError(exit.suberror)
    if reason == lib.KVM_EXIT_FAIL_ENTRY:
        return FailEntry(exit.hw_reason)
    if reason == lib.PYVMM_EXIT_MEMORY_FAULT:
        return MemoryFault(exit.fault_gpa, exit.fault_flags)
    if reason == lib.KVM_EXIT_SYSTEM_EVENT:
        return SystemEvent()
    return UnknownExit(reason, exit.hw_reason)
