"""Typed VM exits: what ``Vcpu.run()`` returns, for a ``match`` in the run loop.

Named tuples rather than frozen dataclasses: equally immutable and
matchable, and far cheaper to define, which every pyvmm start pays. Made
with collections.namedtuple rather than typing.NamedTuple: typing (with re,
enum and functools) would be the largest import of ``pyvmm --version``,
which needs these for its throw-away vCPU (docs/startup.md). Every field is
an int (``is_write`` a bool; ``MemoryFault.gpa`` None when KVM did not say).
"""

from collections import namedtuple

from pyvmm._native import lib


def _exit(name: str, fields: str, doc: str, defaults: tuple = ()) -> type:
    cls = namedtuple(name, fields, module=__name__, defaults=defaults)
    cls.__doc__ = doc
    return cls


IoOut = _exit(
    "IoOut",
    "port size value count",
    "A port write (x86 hypercalls and doorbells); count > 1 for a string write (rep outs).",
    defaults=(1,),
)
IoIn = _exit("IoIn", "port size", "A port read.")
Mmio = _exit(
    "Mmio",
    "addr length is_write value",
    "An MMIO access (aarch64 hypercalls and doorbells, anything unmapped).",
)
Hlt = _exit("Hlt", "", "The guest halted (HLT).")
Shutdown = _exit(
    "Shutdown", "", "Triple fault (x86) or a shutdown request: the guest cannot go on."
)
InternalError = _exit(
    "InternalError", "suberror", "KVM_EXIT_INTERNAL_ERROR: KVM could not go on (suberror says why)."
)
FailEntry = _exit("FailEntry", "hardware_reason", "The hardware refused to enter the guest.")
MemoryFault = _exit(
    "MemoryFault",
    "gpa flags",
    "KVM could not map guest memory for an access (e.g. write to read-only).",
)
SystemEvent = _exit("SystemEvent", "", "A reset, shutdown or crash request (PSCI on arm64).")
Interrupted = _exit(
    "Interrupted", "", "KVM_RUN returned EINTR: a signal is pending for the vCPU thread."
)
Debug = _exit(
    "Debug",
    "exception pc dr6 dr7 hsr far",
    "KVM_EXIT_DEBUG: a single step, a breakpoint or a watchpoint asked with KVM_SET_GUEST_DEBUG"
    " (x86_64: exception, pc, dr6, dr7; arm64: the syndrome hsr and, for a watchpoint, far).",
)
UnknownExit = _exit("UnknownExit", "reason hardware_reason", "An exit pyvmm does not decode.")


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
    | Debug
    | UnknownExit
)


def decode(exit) -> VcpuExit:
    """Turn the C-decoded ``struct pyvmm_exit`` into its typed exit."""
    reason = exit.reason
    if reason == lib.KVM_EXIT_IO:
        if exit.io_direction == lib.KVM_EXIT_IO_OUT:
            return IoOut(exit.io_port, exit.io_size, exit.io_value, exit.io_count)
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
    if reason == lib.KVM_EXIT_DEBUG:
        return Debug(
            exit.debug_exception,
            exit.debug_pc,
            exit.debug_dr6,
            exit.debug_dr7,
            exit.debug_hsr,
            exit.debug_far,
        )
    return UnknownExit(reason, exit.hw_reason)
