"""The guest console: bytes from the puts hypercall go to our stdout as-is."""

from __future__ import annotations

import errno
import os

from pyvmm._native import ffi, lib
from pyvmm.errors import OutputError


class Console:
    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.broken = False

    def write(self, data) -> None:
        """Write everything; a closed stdout (EPIPE) silences the console only,
        any other write error ends the run (OutputError: status 1, one line).

        The write is C's (pyvmm_console_write): a reader that stopped reading
        leaves pyvmm waiting in poll on stdout and the stop eventfd, so a stop
        signal still ends the run (the rest of the output is abandoned and the
        run loop sees the signal), where os.write would retry for ever.
        """
        if self.broken:
            return
        buf = ffi.from_buffer(data)
        result = lib.pyvmm_console_write(self.fd, buf, len(buf))
        if result >= 0 or result == -errno.EINTR:
            return
        if result == -errno.EPIPE:
            self.broken = True
            return
        # /dev/full, EIO: output lost, said at once.
        raise OutputError(
            f"cannot write the guest's console output to standard output: "
            f"{os.strerror(-result)} (the guest was stopped)"
        )
