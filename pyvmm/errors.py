"""Exceptions that end a run with a one-line message.

Every error a user can cause (bad option, bad kernel, missing device) or a
guest can cause (fault, bad pointer) is a ``PyvmmError``; the CLI prints its
message on one line and exits non-zero, so no traceback ever reaches a user.
"""

from __future__ import annotations


class PyvmmError(Exception):
    """Base class: ``str(err)`` is the whole one-line message."""

    exit_status = 1


class UsageError(PyvmmError):
    """The command line is wrong (unknown option, bad value)."""


class LoaderError(PyvmmError):
    """The unikernel file cannot be run: not ELF, wrong ABI, bad manifest."""


class DeviceError(PyvmmError):
    """A host-side device cannot be attached (tap missing, file missing)."""


class HostError(PyvmmError):
    """The host cannot run guests (no /dev/kvm, no permission, KVM failure)."""


class OutputError(PyvmmError):
    """pyvmm cannot write the guest's console output (stdout closed, full)."""


class GuestFault(PyvmmError):
    """The guest did something that ends its run (fault, bad pointer)."""


def stop_message(signum: int) -> str:
    """The one line for a run ended by a stop signal (status 128 + signum),
    with solo5-hvt's words for the same event."""
    import signal

    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"stopped by {name} (Exiting on signal {signum})"
