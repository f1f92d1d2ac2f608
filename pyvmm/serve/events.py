"""What a VM's process may say to the launcher, checked before it is used.

A VM's process runs a guest, and a guest that took over its VMM could
write anything on the channel (child.py lists the events). So the
launcher reads each packet as untrusted input: JSON of bounded size and
nesting, a known event, each field of its type and range. A packet that
is not is a ``BadMessage``, and the launcher ends that VM (server.py);
nothing of it is stored, so it can neither break the launcher's answers
about other VMs nor the launcher itself. What is stored is bounded too:
only the known start-up steps' times, messages cut at a line's length.
"""

from __future__ import annotations

from typing import Any

from pyvmm.serve.http import parse_json
from pyvmm.serve.snapshot import decode_state

#: The largest packet a VM's process sends (its counters are a few KiB).
MAX_MESSAGE = 64 * 1024
#: The longest line kept from it (an error message).
MAX_LINE = 4096
#: The start-up steps a VM reports the time of (CLOCK_MONOTONIC ns).
TIME_KEYS = frozenset({"forked", "child", "ready", "go", "running"})
#: Module names in an "imports" event, at most.
MAX_IMPORTS = 1024
_NS_LIMIT = 1 << 63


class BadMessage(ValueError):
    """A packet that is not one of child.py's events: one line."""


def _int(event: dict[str, Any], key: str, low: int, high: int) -> int:
    value = event.get(key)
    if type(value) is not int or not low <= value <= high:
        raise BadMessage(f'"{key}" must be an integer from {low} to {high}')
    return value


def _line(event: dict[str, Any], key: str) -> str:
    """A line of text, kept as one line of at most MAX_LINE characters."""
    value = event.get(key)
    if not isinstance(value, str):
        raise BadMessage(f'"{key}" must be a string')
    return " ".join(value[:MAX_LINE].splitlines())


def _flag(event: dict[str, Any], key: str) -> bool:
    value = event.get(key, False)
    if not isinstance(value, bool):
        raise BadMessage(f'"{key}" must be true or false')
    return value


def _times(event: dict[str, Any]) -> dict[str, int]:
    times = event.get("times")
    if not isinstance(times, dict) or not set(times) <= TIME_KEYS:
        raise BadMessage(f'"times" must be an object of {", ".join(sorted(TIME_KEYS))}')
    for key, value in times.items():
        if type(value) is not int or not 0 <= value < _NS_LIMIT:
            raise BadMessage(f'"times.{key}" must be a time in ns')
    return times


def _report(event: dict[str, Any]) -> dict[str, Any]:
    report = event.get("report")
    if not isinstance(report, dict) or report.get("schema") != "pyvmm-stats/1":
        raise BadMessage('"report" must be the counters (schema "pyvmm-stats/1")')
    return report


def parse_event(packet: bytes) -> dict[str, Any]:
    """One packet from a VM's process -> its event, with only the fields
    the launcher uses, each checked; or BadMessage."""
    if len(packet) > MAX_MESSAGE:
        raise BadMessage(f"a message longer than {MAX_MESSAGE} bytes")
    try:
        event = parse_json(packet, "the message")
    except ValueError as err:
        raise BadMessage(str(err)) from None
    if not isinstance(event, dict):
        raise BadMessage("a message that is not a JSON object")
    kind = event.get("event")
    if kind == "running":
        cpu_ns = _int(event, "cpu_ns", 0, _NS_LIMIT)
        return {"event": kind, "times": _times(event), "cpu_ns": cpu_ns}
    if kind == "prepared":
        return {"event": kind, "times": _times(event)}
    if kind == "error":
        return {
            "event": kind,
            "message": _line(event, "message"),
            "status": _int(event, "status", 0, 255),
            "internal": _flag(event, "internal"),
            "running": _flag(event, "running"),
        }
    if kind == "stats":
        if "report" in event:
            return {"event": kind, "report": _report(event)}
        return {"event": kind, "error": _line(event, "error")}
    if kind == "final":
        return {"event": kind, "report": _report(event)}
    if kind == "snapshot":
        if "error" in event:
            return {"event": kind, "error": _line(event, "error")}
        document = event.get("metadata")
        if not isinstance(document, dict):
            raise BadMessage('"metadata" must be an object')
        state = event.get("state")
        try:
            packed = decode_state(state if isinstance(state, str) else "")
        except ValueError as err:
            raise BadMessage(str(err)) from None
        addr = _int(event, "memory_addr", 1, (1 << 64) - 1)
        return {"event": kind, "metadata": document, "state": packed, "memory_addr": addr}
    if kind == "imports":
        names = event.get("imported_after_fork")
        if (
            not isinstance(names, list)
            or len(names) > MAX_IMPORTS
            or not all(isinstance(name, str) and len(name) <= 256 for name in names)
        ):
            raise BadMessage('"imported_after_fork" must be a list of module names')
        return {"event": kind, "imported_after_fork": names}
    shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
    raise BadMessage(f"an unknown event {shown!r}")
