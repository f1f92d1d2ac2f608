"""The guest console: bytes from the puts hypercall go to our stdout as-is."""

from __future__ import annotations

import errno
import os

from pyvmm._native import ffi, lib
from pyvmm.common.errors import OutputError

SIGPIPE = 13  # Linux, every architecture pyvmm runs on


class ConsoleClosed(OutputError):
    """Standard output's reader went away (EPIPE, as in ``pyvmm guest | head
    -1``). The run ends as solo5-hvt's and every Unix filter's does on
    SIGPIPE: status 128 + SIGPIPE and nothing said, but after the same
    clean-up as any other end (the signal itself would skip it)."""

    exit_status = 128 + SIGPIPE

    def __init__(self) -> None:
        super().__init__("the guest's console went unread: standard output was closed")


class Console:
    def __init__(self, fd: int = 1) -> None:
        self.fd = fd

    def write(self, data) -> None:
        """Write everything; a closed stdout (EPIPE) ends the run
        (ConsoleClosed), any other write error too (OutputError: status 1,
        one line).

        The write is C's (pyvmm_console_write): a reader that stopped reading
        leaves pyvmm waiting in poll on stdout and the stop eventfd, so a stop
        signal still ends the run (the rest of the output is abandoned and the
        run loop sees the signal), where os.write would retry for ever.
        """
        buf = ffi.from_buffer(data)
        result = lib.pyvmm_console_write(self.fd, buf, len(buf))
        if result >= 0 or result == -errno.EINTR:
            return
        if result == -errno.EPIPE:
            raise ConsoleClosed()
        # /dev/full, EIO: output lost, said at once.
        raise OutputError(
            f"cannot write the guest's console output to standard output: "
            f"{os.strerror(-result)} (the guest was stopped)"
        )
