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


class Stopped(PyvmmError):
    """A stop signal ended the run: exit status 128 + signal, as a shell would.

    Here, below the runner and the debugger that both raise it."""

    def __init__(self, signum: int) -> None:
        super().__init__(stop_message(signum))
        self.exit_status = 128 + signum


# The stop signals' names, known without importing the signal module on
# the way out: after --user (files the new user cannot read) or under the
# sandbox an import there can fail. Linux numbers them alike on x86_64 and
# aarch64.
_STOP_SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 15: "SIGTERM"}


def stop_message(signum: int) -> str:
    """The one line for a run ended by a stop signal (status 128 + signum),
    with solo5-hvt's words for the same event."""
    name = _STOP_SIGNAL_NAMES.get(signum, f"signal {signum}")
    return f"stopped by {name} (Exiting on signal {signum})"
