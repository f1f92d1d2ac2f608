"""The guest console: bytes from the puts hypercall go to our stdout as-is."""

from __future__ import annotations

import os
import select

from pyvmm.errors import OutputError


class Console:
    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.broken = False

    def write(self, data) -> None:
        """Write everything; a closed stdout (EPIPE) silences the console only,
        any other write error ends the run (OutputError: status 1, one line)."""
        if self.broken:
            return
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except InterruptedError:
                continue
            except BlockingIOError:  # a non-blocking stdout: wait until it drains
                select.select([], [self.fd], [])
                continue
            except BrokenPipeError:
                self.broken = True
                return
            except OSError as err:  # /dev/full, EIO: output lost, said at once
                raise OutputError(
                    f"cannot write the guest's console output to standard output: "
                    f"{err.strerror or err} (the guest was stopped)"
                ) from None
            view = view[written:]
