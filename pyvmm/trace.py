"""--trace: pyvmm's start-up and shut-down as a timeline of phases.

A phase ends at a mark: ``mark("create VM")`` says the phase called
"create VM" ran from the previous mark until now, so the timeline needs one
clock read per phase and no nesting. The first phase, "interpreter start",
begins when the process started: the launcher's exec time when the
``pyvmm`` command started through it (exact), else the process start time
from /proc/self/stat (kernel clock ticks: 10 ms steps). Every time is
CLOCK_BOOTTIME, the clock /proc/self/stat counts from.

Off (the default) ``mark`` is a module-level function that does nothing:
the set-up code calls it a few dozen times and the exit loop never does.
The few marks made before the options are known (``early``) are always
taken, a clock read each, and dropped unless --trace is given.

Output: a table on stderr, and with --trace=FILE the Trace Event JSON
format (complete events, ``"ph": "X"``) that Perfetto and chrome://tracing
open. docs/startup.md shows both.
"""

from __future__ import annotations

import os
import time

_CLOCK = time.CLOCK_BOOTTIME

#: When the process started, in ns of CLOCK_BOOTTIME (0: not known yet).
start_ns = 0
#: (phase name, end in ns), in order.
_marks: list[tuple[str, int]] = []
#: --trace=FILE: the file's descriptor, open from the parse on (the
#: sandbox refuses opening files for writing once the guest runs).
_fd = -1
enabled = False


def now() -> int:
    return time.clock_gettime_ns(_CLOCK)


def early(name: str) -> None:
    """A mark taken before the options are parsed (always: one clock read)."""
    _marks.append((name, time.clock_gettime_ns(_CLOCK)))


def mark(name: str) -> None:
    """End the phase ``name`` now (a no-op unless --trace is given)."""


def _mark(name: str) -> None:
    _marks.append((name, time.clock_gettime_ns(_CLOCK)))


def set_start(ns: int) -> None:
    """The process start time, as the launcher measured it."""
    global start_ns
    start_ns = ns


def process_start_ns() -> int:
    """The process start time from /proc/self/stat (10 ms steps), in ns."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    # The command name (field 2) may hold spaces and parentheses: the
    # fields after it start after the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    ticks = int(fields[19])  # field 22, starttime
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def enable(file: str = "") -> None:
    """Record every mark from now on; ``file`` (created now) gets the JSON
    at ``finish``. OSError if it cannot be created."""
    global mark, enabled, _fd
    if file:
        _fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    mark = _mark
    enabled = True


def phases() -> list[tuple[str, int, int]]:
    """(name, start ns, duration ns) of every phase so far."""
    begin = start_ns or process_start_ns()
    out = []
    for name, end in _marks:
        out.append((name, begin, max(0, end - begin)))
        begin = end
    return out


def table(spans: list[tuple[str, int, int]]) -> str:
    """The human form: one line per phase, with its offset from the start."""
    if not spans:
        return ""
    origin = spans[0][1]
    width = max(len(name) for name, _, _ in spans)
    lines = [f"pyvmm: trace: {'phase':<{width}} {'at ms':>8} {'ms':>8}"]
    for name, begin, dur in spans:
        lines.append(
            f"pyvmm: trace: {name:<{width}} {(begin - origin) / 1e6:>8.2f} {dur / 1e6:>8.2f}"
        )
    total = spans[-1][1] + spans[-1][2] - origin
    lines.append(f"pyvmm: trace: {'total (to process exit)':<{width}} {'':>8} {total / 1e6:>8.2f}")
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    """A JSON string (json is not imported for this)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c >= " " else f"\\u{ord(c):04x}" for c in escaped) + '"'


def trace_json(spans: list[tuple[str, int, int]]) -> str:
    """The Trace Event format: a complete event ("X") per phase, times in us
    from the process start (its CLOCK_BOOTTIME ns in ``otherData``)."""
    pid = os.getpid()
    origin = spans[0][1] if spans else 0
    events = [
        f'{{"name":{_quoted(name)},"cat":"pyvmm","ph":"X","ts":{(begin - origin) / 1000:.3f},'
        f'"dur":{dur / 1000:.3f},"pid":{pid},"tid":{pid}}}'
        for name, begin, dur in spans
    ]
    events.append(
        f'{{"name":"process_name","ph":"M","pid":{pid},"tid":{pid},"args":{{"name":"pyvmm"}}}}'
    )
    return (
        '{"traceEvents":[\n' + ",\n".join(events) + '\n],"displayTimeUnit":"ms",'
        f'"otherData":{{"clock":"CLOCK_BOOTTIME","start_ns":{origin}}}}}\n'
    )


def finish() -> None:
    """Write the timeline (on stderr, and to the file if one was given);
    the last mark is the process's last act before it exits."""
    if not enabled:
        return
    spans = phases()
    try:
        os.write(2, table(spans).encode())
    except OSError:
        pass
    if _fd >= 0:
        data = trace_json(spans).encode()
        try:
            while data:
                data = data[os.write(_fd, data) :]
        except OSError as err:
            try:
                os.write(2, f"pyvmm: --trace: cannot write the file: {err.strerror}\n".encode())
            except OSError:
                pass
