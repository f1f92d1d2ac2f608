"""GDB's remote serial protocol on one connected socket: packets in and out.

A packet is ``$body#cc`` (cc: the body's byte sum mod 256, two hex
digits); the receiver answers ``+`` or ``-`` (resend) until both sides
agree to drop acknowledgements (QStartNoAckMode). A lone 0x03 byte is an
interrupt. The client may be anything that connects, so the reader keeps
at most ``MAX_PACKET`` bytes of a body, drops longer ones whole (answering
``-``), ignores stray bytes between packets and never waits for anything
but the socket and pyvmm's stop eventfd: no input makes it hang or grow.
"""

from __future__ import annotations

import errno
import os
import select

from pyvmm._native import ffi, lib
from pyvmm.common.errors import PyvmmError

#: The largest packet body kept (PacketSize in qSupported, hex there).
MAX_PACKET = 16384
INTERRUPT = 0x03
_WAIT_NS = 3600 * 10**9  # a wait's slice; nothing times out


class Disconnected(PyvmmError):
    """The client closed the connection (or it failed): a detach."""


class StopRequested(PyvmmError):
    """pyvmm's stop eventfd fired (a stop signal) while waiting for gdb."""


def checksum(body: bytes) -> int:
    return sum(body) & 0xFF


def escape(body: bytes) -> bytes:
    """Binary data as a packet body: ``}`` then the byte xor 0x20 for the
    four bytes the framing uses."""
    out = bytearray()
    for byte in body:
        if byte in b"#$}*":
            out += bytes((0x7D, byte ^ 0x20))
        else:
            out.append(byte)
    return bytes(out)


def unescape(body: bytes) -> bytes:
    out = bytearray()
    it = iter(body)
    for byte in it:
        if byte == 0x7D:
            byte = next(it, 0x20 ^ 0x20) ^ 0x20
        out.append(byte)
    return bytes(out)


def frame(body: bytes) -> bytes:
    return b"$" + body + b"#" + b"%02x" % checksum(body)


class Connection:
    """One client. ``stop_fd``: pyvmm's stop eventfd (docs/signals), which
    ends any wait here."""

    def __init__(self, fd: int, stop_fd: int) -> None:
        # Non-blocking: a client that stops reading must not leave pyvmm
        # asleep in write(), deaf to its stop signals (send_raw).
        os.set_blocking(fd, False)
        self.fd = fd
        self.stop_fd = stop_fd
        self.acks = True
        self._buffer = bytearray()
        self._last_sent = b""
        self.interrupts = 0  # 0x03 bytes seen while reading packets

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- bytes --------------------------------------------------------------
    def _fill(self, block: bool = True) -> bool:
        """Read what the socket has into the buffer; False when nothing was
        there (only without ``block``). Raises Disconnected at its end."""
        if self.fd < 0:
            raise Disconnected("gdb: the connection is closed")
        fds = ffi.new("int[2]", [self.fd, self.stop_fd])
        ready = ffi.new("uint64_t *")
        while True:
            n = lib.pyvmm_wait_readable(fds, 2, _WAIT_NS if block else 0, ready)
            if n == -errno.EINTR:
                continue
            if n < 0:
                raise Disconnected(f"gdb: waiting for the client: {os.strerror(-n)}")
            if ready[0] & 2:
                raise StopRequested("gdb: stopped while waiting for the client")
            if ready[0] & 1:
                break
            if not block:
                return False
        try:
            data = os.read(self.fd, 4096)
        except (InterruptedError, BlockingIOError):
            return True
        except OSError as err:
            raise Disconnected(f"gdb: reading from the client: {err.strerror}") from None
        if not data:
            raise Disconnected("gdb: the client closed the connection")
        self._buffer += data
        return True

    def send_raw(self, data: bytes) -> None:
        """Write all of ``data``, waiting for room; a stop signal meanwhile
        ends the wait (the client is then treated as gone)."""
        view = memoryview(data)
        waiter = None
        while view:
            try:
                n = os.write(self.fd, view)
            except (InterruptedError, BlockingIOError):
                n = 0
            except OSError as err:
                raise Disconnected(f"gdb: writing to the client: {err.strerror}") from None
            view = view[n:]
            if view and not n:
                if waiter is None:
                    waiter = select.poll()
                    waiter.register(self.fd, select.POLLOUT)
                    waiter.register(self.stop_fd, select.POLLIN)
                events = dict(waiter.poll())
                if events.get(self.stop_fd):
                    raise Disconnected("gdb: stopped while the client read nothing")
                if events.get(self.fd, 0) & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                    raise Disconnected("gdb: the client closed the connection")

    def send(self, body: bytes) -> None:
        self._last_sent = frame(body)
        self.send_raw(self._last_sent)

    # -- packets ------------------------------------------------------------
    def poll_interrupt(self) -> bool:
        """Whether the client sent 0x03 (read without blocking; other bytes
        stay buffered for the next packet)."""
        while self.fd >= 0 and self._fill(block=False):
            pass
        if INTERRUPT in self._buffer:
            self._buffer = self._buffer.replace(bytes((INTERRUPT,)), b"")
            return True
        if self.interrupts:
            self.interrupts = 0
            return True
        return False

    def receive(self) -> bytes:
        """The next packet's (unescaped) body, acknowledged. Bad checksums
        and overlong packets are answered ``-`` and skipped."""
        while True:
            body = self._next_framed()
            if body is not None:
                return body

    def _next_framed(self) -> bytes | None:
        buf = self._buffer
        # Skip to the next '$', counting interrupts and resend requests.
        while True:
            start = buf.find(b"$")
            junk = buf if start < 0 else buf[:start]
            if INTERRUPT in junk:
                self.interrupts += 1
            if b"-" in junk and self._last_sent:
                self.send_raw(self._last_sent)
            if start >= 0:
                del buf[:start]
                break
            buf.clear()
            self._fill()
        # The body, up to '#' and two checksum digits, at most MAX_PACKET kept.
        overlong = False
        while True:
            end = buf.find(b"#", 1)
            if end >= 0 and len(buf) >= end + 3:
                break
            if end < 0 and len(buf) > MAX_PACKET + 1:
                overlong = True
                del buf[1 : len(buf) - 1]  # keep '$' and the newest byte only
            self._fill()
        body = bytes(buf[1:end])
        digits = bytes(buf[end + 1 : end + 3])
        del buf[: end + 3]
        try:
            good = not overlong and int(digits, 16) == checksum(body) and len(body) <= MAX_PACKET
        except ValueError:
            good = False
        if self.acks:
            self.send_raw(b"+" if good else b"-")
        if not good:
            return None
        return unescape(body)
