"""Just enough HTTP/1.1 for a local API socket: one request per connection.

The launcher's clients are curl, pyvmm's own client and test code, on a
Unix socket only root (or the socket's group) can reach, so the server
reads one request (a request line, headers, a ``Content-Length`` body: no
chunked bodies, no pipelining), answers with a JSON body and closes the
connection. Anything else is a 4xx with a one-line error, and the
launcher goes on serving. Parsing is incremental (``RequestReader.feed``)
so a slow client never blocks the single-threaded server.
"""

from __future__ import annotations

import json
from typing import Any

#: A request's line and headers, and its body, at most (bytes).
MAX_HEAD = 16 * 1024
MAX_BODY = 1024 * 1024

REASONS = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class HttpError(Exception):
    """A request that gets ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Request:
    """One request (a plain class: the client imports this module, and
    dataclasses would cost it milliseconds of start-up)."""

    def __init__(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        #: File descriptors passed with the request (SCM_RIGHTS), in order.
        self.fds: list[int] = []

    def json(self) -> dict[str, Any]:
        """The body as a JSON object ({} when empty)."""
        if not self.body.strip():
            return {}
        try:
            value = json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as err:
            raise HttpError(400, f"bad JSON in the request body: {err}") from None
        if not isinstance(value, dict):
            raise HttpError(400, "the request body must be a JSON object")
        return value


class RequestReader:
    """Bytes in, one ``Request`` out (or ``HttpError``)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self._head: tuple[str, str, str, dict[str, str]] | None = None
        self._length = 0

    def feed(self, data: bytes) -> Request | None:
        """Add ``data``; the request once it is complete, else None."""
        self.buffer += data
        if self._head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    raise HttpError(413, f"request head longer than {MAX_HEAD} bytes")
                return None
            self._head = _parse_head(bytes(self.buffer[:end]))
            del self.buffer[: end + 4]
            self._length = _content_length(self._head[0], self._head[3])
        if len(self.buffer) < self._length:
            return None
        method, path, query, headers = self._head
        return Request(method, path, query, headers, bytes(self.buffer[: self._length]))


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise HttpError(400, "the request head is not ASCII") from None
    line, *header_lines = text.split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"malformed request line: {line[:80]!r}")
    method, target, _version = parts
    path, _, query = target.partition("?")
    headers = {}
    for header in header_lines:
        name, colon, value = header.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(400, f"malformed header line: {header[:80]!r}")
        headers[name.lower()] = value.strip()
    return method, path, query, headers


def _content_length(method: str, headers: dict[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise HttpError(501, "chunked request bodies are not supported: send Content-Length")
    text = headers.get("content-length", "0")
    if not text.isdigit():
        raise HttpError(400, f"bad Content-Length: {text[:40]!r}")
    length = int(text)
    if length > MAX_BODY:
        raise HttpError(413, f"request body longer than {MAX_BODY} bytes")
    return length


def response(status: int, body: Any) -> bytes:
    """A complete response with a JSON body; the connection closes after it."""
    payload = (json.dumps(body, sort_keys=True) + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + payload


def request_bytes(method: str, path: str, body: Any = None) -> bytes:
    """A request as the client sends it (Host is required by HTTP/1.1)."""
    payload = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def parse_response(data: bytes) -> tuple[int, Any]:
    """(status, JSON body) of a whole response as read until EOF."""
    head, sep, body = data.partition(b"\r\n\r\n")
    line = head.split(b"\r\n", 1)[0].decode("ascii", "replace")
    parts = line.split(" ", 2)
    if not sep or len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {line[:80]!r}")
    try:
        return int(parts[1]), json.loads(body) if body.strip() else None
    except ValueError:
        raise ValueError(f"response body is not JSON: {body[:80]!r}") from None
