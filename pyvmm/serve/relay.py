"""A VM's lines in the launcher's own log, each naming the VM.

A VM created without a console of its own (no ``"stderr"`` file, no fds
passed) used to write pyvmm's lines (a stop, a guest fault, ``--stats``)
straight to the launcher's standard error, where nothing said which VM
a line was about. Such a VM now writes them to a pipe that the launcher
reads and copies to its standard error with the VM's id:

    pyvmm: vm web1: stopped by SIGTERM (Exiting on signal 15)

The launcher never blocks on its own stderr for a VM: a line goes out
only when the log can take it at once (a pipe with room, a file, a
terminal), else it is counted as dropped and the next line says so.
"""

from __future__ import annotations

import contextlib
import os
import select

#: The longest line copied (a longer one is cut in pieces of this size),
#: so that a line and the note before it are one write of less than
#: PIPE_BUF: the most a pipe that selects writable takes without blocking.
MAX_LINE = 2048
LOG_FD = 2


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class StderrRelay:
    """The pipe of one VM's stderr: ``write_fd`` (with ``stdout``) goes to
    the VM, and is closed here once it has it; ``fd`` is read by the
    launcher's loop."""

    def __init__(self, vm_id: str) -> None:
        self.vm_id = vm_id
        #: The VM's stdout to go with it: the launcher's own (a copy).
        self.stdout = os.dup(1) if _is_open(1) else os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            self.fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        except OSError:
            os.close(self.stdout)
            raise
        os.set_blocking(self.fd, False)  # the VM's end blocks, as a stderr does
        self.partial = b""
        self.dropped = 0

    def given(self) -> None:
        """The VM's process has its ends: the launcher's copies go."""
        for name in ("write_fd", "stdout"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def read(self) -> bool:
        """Copy what the VM wrote; False once it has closed its end."""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                data = b""
            if not data:
                self._line(self.partial)
                self.partial = b""
                return False
            lines = (self.partial + data).split(b"\n")
            self.partial = lines.pop()
            while len(self.partial) > MAX_LINE:
                lines.append(self.partial[:MAX_LINE])
                self.partial = self.partial[MAX_LINE:]
            for line in lines:
                for at in range(0, len(line), MAX_LINE):
                    self._line(line[at : at + MAX_LINE])

    def close(self) -> None:
        self.given()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _line(self, raw: bytes) -> None:
        if not raw:
            return
        text = raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\r")
        text = text.removeprefix("pyvmm: ")
        line = f"pyvmm: vm {self.vm_id}: {text}\n"
        if self.dropped:
            note = f"({self.dropped} lines dropped: the log was full)"
            line = f"pyvmm: vm {self.vm_id}: {note}\n{line}"
        with contextlib.suppress(OSError, ValueError):
            _, writable, _ = select.select([], [LOG_FD], [], 0)
            if writable:
                os.write(LOG_FD, line.encode())
                self.dropped = 0
                return
        self.dropped += 1
