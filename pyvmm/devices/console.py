"""The guest console: bytes from the puts hypercall go to our stdout as-is."""

from __future__ import annotations

import os


class Console:
    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.broken = False

    def write(self, data) -> None:
        """Write everything; a closed stdout (EPIPE) silences the console only."""
        if self.broken:
            return
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except InterruptedError:
                continue
            except (BrokenPipeError, OSError):
                self.broken = True
                return
            view = view[written:]
