"""Typed VM exits: what ``Vcpu.run()`` returns, for a ``match`` in the run loop."""

from __future__ import annotations

from dataclasses import dataclass

from pyvmm._native import lib


@dataclass(frozen=True, slots=True)
class IoOut:
    port: int
    size: int
    value: int


@dataclass(frozen=True, slots=True)
class IoIn:
    port: int
    size: int


@dataclass(frozen=True, slots=True)
class Mmio:
    addr: int
    length: int
    is_write: bool
    value: int


@dataclass(frozen=True, slots=True)
class Hlt:
    pass


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Triple fault (x86) or a shutdown request: the guest cannot go on."""


@dataclass(frozen=True, slots=True)
class InternalError:
    suberror: int


@dataclass(frozen=True, slots=True)
class FailEntry:
    hardware_reason: int


@dataclass(frozen=True, slots=True)
class MemoryFault:
    """KVM could not map guest memory for an access (e.g. write to read-only)."""

    gpa: int | None
    flags: int


@dataclass(frozen=True, slots=True)
class SystemEvent:
    pass


@dataclass(frozen=True, slots=True)
class Interrupted:
    """KVM_RUN returned EINTR: a signal is pending for the vCPU thread."""


@dataclass(frozen=True, slots=True)
class UnknownExit:
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
