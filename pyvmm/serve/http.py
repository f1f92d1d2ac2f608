"""Just enough HTTP/1.1 for a local API socket: one request per connection.

The launcher's clients are curl, pyvmm's own client and test code, on a
Unix socket only the launcher's user can reach (and only the users it
allows may talk to: server.py), so the server reads one request (a
request line, headers, a ``Content-Length`` body: no chunked bodies, no
pipelining), answers with a JSON body and closes the connection.
Anything else is a 4xx with a one-line error, and the launcher goes on
serving. Parsing is incremental (``RequestReader.feed``) so a slow client
never blocks the single-threaded server, and bounded: the head, the body
and the JSON's nesting have limits, checked on the bytes as they arrive.
"""

from __future__ import annotations

import json
from typing import Any

#: A request's line and headers, and its body, at most (bytes).
MAX_HEAD = 16 * 1024
MAX_BODY = 1024 * 1024
#: How deep a JSON value (a request's body, a VM's message) may nest: the
#: API's own are 4 levels deep at most.
MAX_DEPTH = 32

REASONS = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class HttpError(Exception):
    """A request that gets ``status`` and ``error_body(message, exit_status)``."""

    def __init__(self, status: int, message: str, exit_status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.exit_status = exit_status

    def body(self) -> dict[str, Any]:
        return error_body(str(self), self.exit_status)


def error_body(message: str, exit_status: int | None = None) -> dict[str, Any]:
    """Every error's body, whatever the error: the one line, and the exit
    status of the VM it is about if that VM ended (else null)."""
    return {"error": message, "exit_status": exit_status}


def nesting_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests at most ``limit`` levels
    (walked without recursion: the value may be hostile)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


def _not_a_number(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is out of range")
    return value


def parse_json(data: bytes | str, what: str) -> Any:
    """JSON from someone not trusted (a client, a VM's process): the value,
    or ValueError with one line. The nesting is bounded (json's own parser
    recurses, and would raise RecursionError on a deep enough value), and
    numbers are finite (no NaN, Infinity or 1e400: no answer repeats one)."""
    try:
        value = json.loads(data, parse_constant=_not_a_number, parse_float=_finite)
    except RecursionError:
        raise ValueError(f"{what} nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"bad JSON in {what}: {err}") from None
    if not nesting_ok(value):
        raise ValueError(f"{what} nests deeper than {MAX_DEPTH} levels")
    return value


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
            value = parse_json(self.body, "the request body")
        except ValueError as err:
            raise HttpError(400, str(err)) from None
        if not isinstance(value, dict):
            raise HttpError(400, "the request body must be a JSON object")
        return value


class RequestReader:
    """Bytes in, one ``Request`` out (or ``HttpError``)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self._head: tuple[str, str, str, dict[str, str]] | None = None
        self._length = 0
        self._searched = 0

    @property
    def head(self) -> tuple[str, str, str, dict[str, str]] | None:
        """(method, path, query, headers) once the head is in, else None."""
        return self._head

    def feed(self, data: bytes) -> Request | None:
        """Add ``data``; the request once it is complete, else None.

        The head (request line, headers and the blank line) may have at
        most MAX_HEAD bytes, however they arrive: a head still open at
        that many bytes, and a longer one that arrived whole, are refused."""
        self.buffer += data
        if self._head is None:
            # (from where the last search stopped: a head sent a byte at a
            # time is searched once, not once a byte)
            end = self.buffer.find(b"\r\n\r\n", self._searched)
            self._searched = max(0, len(self.buffer) - 3)
            if end < 0 and len(self.buffer) < MAX_HEAD:
                return None
            if end < 0 or end + 4 > MAX_HEAD:
                raise HttpError(413, f"request head longer than {MAX_HEAD} bytes")
            self._head = _parse_head(bytes(self.buffer[:end]))
            del self.buffer[: end + 4]
            self._length = _content_length(self._head[3])
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
    for each in (line, *header_lines):  # printable ASCII; a tab is a header value's space
        if not each.replace("\t", " ").isprintable():
            raise HttpError(400, f"a control character in the request head: {each[:80]!r}")
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


def _content_length(headers: dict[str, str]) -> int:
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
        return int(parts[1]), parse_json(body, "the response") if body.strip() else None
    except ValueError:
        raise ValueError(f"response body is not JSON: {body[:80]!r}") from None
