"""A raw GDB remote-protocol client for tests that speak packets
themselves: a hostile client's bad packets, and the aarch64 machine,
which has no gdb. Acknowledgements are checked, checksums computed."""

from __future__ import annotations

import re
import socket

_PACKET = re.compile(rb"\$([^#]*)#([0-9a-f]{2})", re.S)


class RawClient:
    """Packets over TCP on 127.0.0.1 (``port``) or a Unix socket (``path``)."""

    def __init__(self, port: int | None = None, *, path: str | None = None, timeout: float = 120):
        if path is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        else:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def packet(self, body: bytes) -> bytes:
        return b"$" + body + b"#%02x" % (sum(body) & 0xFF)

    def ask(self, body: bytes) -> bytes:
        self.send(self.packet(body))
        return self.reply()

    def ack(self) -> bytes:
        while not self.buffer:
            self._fill()
        ack, self.buffer = self.buffer[:1], self.buffer[1:]
        return ack

    def reply(self, acked: bool = True) -> bytes:
        """The next packet's body (after the '+' for ours, if ``acked``)."""
        if acked:
            assert self.ack() == b"+"
        while True:
            match = _PACKET.match(self.buffer)
            if match:
                self.buffer = self.buffer[match.end() :]
                body = match.group(1)
                assert int(match.group(2), 16) == sum(body) & 0xFF
                try:
                    self.send(b"+")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a last packet (W, X): the stub has closed already
                return body
            self._fill()

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        assert data, "pyvmm closed the connection"
        self.buffer += data
