"""--trace: pyvmm's start-up and shut-down as a timeline of phases.

A phase ends at a mark: ``mark("create VM")`` says the phase called
"create VM" ran on the calling thread from that thread's previous mark
until now, so the timeline needs one clock read per phase and no nesting.
The first phase of the main thread, "interpreter start", begins when the
process started: the launcher's exec time when the ``pyvmm`` command
started through it (exact), else the process start time from
/proc/self/stat (kernel clock ticks: 10 ms steps). Every time is
CLOCK_BOOTTIME, the clock /proc/self/stat counts from.

What other threads do is recorded where it happens: ``event`` (a span on
the calling thread, such as a row of the live counters), ``thread_started``
and ``thread_ended`` (a thread pyvmm does not run Python on, the IO
thread, from its start to its stop) and ``handed_over`` (the warm
launcher's part of a start, in the launcher's own process). A mark or an
event may carry ``args``: facts about the phase (sizes, counts, modes).

Off (the default) ``mark`` is a module-level function that does nothing:
the set-up code calls it a few dozen times and the exit loop never does.
The few marks made before the options are known (``early``) are always
taken, a clock read each, and dropped unless --trace is given.

Output: a table on stderr, and with --trace=FILE the Trace Event JSON
format (complete events, ``"ph": "X"``, on their process and thread, with
``process_name`` and ``thread_name`` metadata) that Perfetto and
chrome://tracing open. docs/startup.md shows both.
"""

from __future__ import annotations

import _thread
import os
import time

_CLOCK = time.CLOCK_BOOTTIME

#: When the process started, in ns of CLOCK_BOOTTIME (0: not known yet).
start_ns = 0
#: (phase name, end in ns, thread id, args or None), in order.
_marks: list[tuple[str, int, int, dict | None]] = []
#: Spans outside the marks' chains: (name, begin ns, end ns, pid, tid, args).
_events: list[tuple[str, int, int, int, int, dict | None]] = []
#: Names of the threads and processes events were recorded on.
_threads: dict[int, str] = {}
_processes: dict[int, str] = {}
#: Where the main thread's first phase begins when it is not the process's
#: start (a launcher's VM: where the launcher handed over).
_main_begin = 0
#: --trace=FILE: the file's descriptor, open from the parse on (the
#: sandbox refuses opening files for writing once the guest runs).
_fd = -1
enabled = False


def now() -> int:
    return time.clock_gettime_ns(_CLOCK)


def early(name: str) -> None:
    """A mark taken before the options are parsed (always: one clock read)."""
    _marks.append((name, time.clock_gettime_ns(_CLOCK), _thread.get_native_id(), None))


def mark(name: str, args: dict | None = None) -> None:
    """End the phase ``name`` now (a no-op unless --trace is given)."""


def _mark(name: str, args: dict | None = None) -> None:
    _marks.append((name, time.clock_gettime_ns(_CLOCK), _thread.get_native_id(), args))


def event(name: str, begin_ns: int, args: dict | None = None) -> None:
    """A span on the calling thread from ``begin_ns`` until now, outside
    the thread's chain of phases (ignored unless --trace is given)."""
    if not enabled:
        return
    tid = _thread.get_native_id()
    if tid not in _threads:
        import threading

        _threads[tid] = threading.current_thread().name
    _events.append((name, begin_ns, now(), os.getpid(), tid, args))


def name_thread(name: str) -> None:
    """Name the calling thread in the trace: threads started without
    ``threading`` have no name of their own there (ignored unless --trace)."""
    if enabled:
        _threads[_thread.get_native_id()] = name


def tasks() -> frozenset[int]:
    """The ids of this process's threads (nothing unless --trace is given):
    taken before a thread is started, to find it afterwards."""
    if not enabled:
        return frozenset()
    return frozenset(int(t) for t in os.listdir("/proc/self/task"))


def thread_started(name: str, known: frozenset[int]) -> tuple[int, int] | None:
    """The thread started since ``known = tasks()`` (named ``name``), and
    now: what ``thread_ended`` needs. None unless --trace is given."""
    if not enabled:
        return None
    new = sorted(tasks() - known)
    if not new:
        return None
    _threads[new[0]] = name
    return new[0], now()


def thread_ended(started: tuple[int, int] | None, name: str, args: dict | None = None) -> None:
    """The span of a thread from ``thread_started`` until now, on its own
    thread id."""
    if started is not None:
        tid, begin = started
        _events.append((name, begin, now(), os.getpid(), tid, args))


def handed_over(name: str, end_ns: int, pid: int, process: str) -> None:
    """The phase ``name`` ran in another process (``pid``, single-threaded:
    the warm launcher) from the start until ``end_ns``; this process's main
    thread begins there."""
    global _main_begin
    _processes[pid] = process
    _threads[pid] = "launcher"
    _events.append((name, start_ns, end_ns, pid, pid, None))
    _main_begin = end_ns


def set_start(ns: int) -> None:
    """The process start time, as the launcher measured it."""
    global start_ns
    start_ns = ns


_stat_start_ns = 0  # process_start_ns(), once read


def process_start_ns() -> int:
    """The process start time from /proc/self/stat (10 ms steps), in ns:
    read once and kept, so that a call before the sandbox goes on (which
    refuses opening files) answers every later one."""
    global _stat_start_ns
    if not _stat_start_ns:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # The command name (field 2) may hold spaces and parentheses: the
        # fields after it start after the last ')'.
        fields = stat[stat.rindex(b")") + 2 :].split()
        ticks = int(fields[19])  # field 22, starttime
        _stat_start_ns = ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return _stat_start_ns


def enable(file: str = "") -> None:
    """Record every mark from now on; ``file`` (created now) gets the JSON
    at ``finish``. OSError if it cannot be created."""
    global mark, enabled, _fd
    if file:
        _fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    mark = _mark
    enabled = True


#: A span of the timeline: name, start ns, duration ns, pid, tid, args.
Span = tuple[str, int, int, int, int, "dict | None"]


def spans() -> list[Span]:
    """Every phase (each thread's marks, back to back) and event so far,
    in the order they began."""
    pid = os.getpid()  # the main thread's id too
    origin = start_ns or process_start_ns()
    begins: dict[int, int] = {}
    out: list[Span] = []
    for name, end, tid, args in _marks:
        if tid in begins:
            begin = begins[tid]
        elif tid == pid:  # the process's start, or where the launcher handed over
            begin = _main_begin or origin
            if not _main_begin and args is None:
                args = {"from": "the launcher's exec" if start_ns else "/proc/self/stat"}
        else:  # another thread's first phase: from the latest mark before it
            begin = out[-1][1] + out[-1][2] if out else origin
        out.append((name, begin, max(0, end - begin), pid, tid, args))
        begins[tid] = end
    out += [(n, b, max(0, e - b), p, t, a) for n, b, e, p, t, a in _events]
    return sorted(out, key=lambda span: span[1])


def phases() -> list[tuple[str, int, int]]:
    """(name, start ns, duration ns) of every span so far."""
    return [(name, begin, dur) for name, begin, dur, *_ in spans()]


def _thread_name(pid: int, tid: int) -> str:
    if tid in _threads:
        return _threads[tid]
    return "main: set-up, vCPU, tear-down" if tid == pid else f"thread {tid}"


def table(timeline: list[Span]) -> str:
    """The human form: one line per span, with its offset from the start
    and, for a span off the main thread, its thread in brackets."""
    if not timeline:
        return ""
    origin = min(begin for _, begin, *_ in timeline)
    pid = os.getpid()

    def label(span: Span) -> str:
        name, _, _, span_pid, tid, _ = span
        return name if tid == span_pid == pid else f"{name} [{_thread_name(span_pid, tid)}]"

    width = max(len(label(s)) for s in timeline)
    lines = [f"pyvmm: trace: {'phase':<{width}} {'at ms':>8} {'ms':>8}"]
    for span in timeline:
        begin, dur = span[1], span[2]
        lines.append(
            f"pyvmm: trace: {label(span):<{width}} {(begin - origin) / 1e6:>8.2f} {dur / 1e6:>8.2f}"
        )
    end = max(begin + dur for _, begin, dur, *_ in timeline)
    total = "total (to process exit)"
    lines.append(f"pyvmm: trace: {total:<{width}} {'':>8} {(end - origin) / 1e6:>8.2f}")
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    """A JSON string (json is not imported for this)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c >= " " else f"\\u{ord(c):04x}" for c in escaped) + '"'


def _value(value: object) -> str:
    """A JSON value of the few kinds args hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_quoted(str(k))}:{_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return "null" if value is None else _quoted(str(value))


def trace_json(timeline: list[Span]) -> str:
    """The Trace Event format: a complete event ("X") per span on its
    process and thread, times in us from the start (its CLOCK_BOOTTIME ns
    in ``otherData``), and the names of the processes and threads."""
    pid = os.getpid()
    origin = min((begin for _, begin, *_ in timeline), default=0)
    events = []
    for name, begin, dur, span_pid, tid, args in timeline:
        extra = f',"args":{_value(args)}' if args else ""
        events.append(
            f'{{"name":{_quoted(name)},"cat":"pyvmm","ph":"X","ts":{(begin - origin) / 1000:.3f},'
            f'"dur":{dur / 1000:.3f},"pid":{span_pid},"tid":{tid}{extra}}}'
        )
    processes = {pid: "pyvmm", **_processes}
    for p, name in processes.items():
        events.append(
            f'{{"name":"process_name","ph":"M","pid":{p},"tid":{p},'
            f'"args":{{"name":{_quoted(name)}}}}}'
        )
    threads = {(p, t) for _, _, _, p, t, _ in timeline} | {(pid, pid)}
    for p, t in sorted(threads):
        events.append(
            f'{{"name":"thread_name","ph":"M","pid":{p},"tid":{t},'
            f'"args":{{"name":{_quoted(_thread_name(p, t))}}}}}'
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
    timeline = spans()
    try:
        os.write(2, table(timeline).encode())
    except OSError:
        pass
    if _fd >= 0:
        data = trace_json(timeline).encode()
        try:
            while data:
                data = data[os.write(_fd, data) :]
        except OSError as err:
            try:
                os.write(2, f"pyvmm: --trace: cannot write the file: {err.strerror}\n".encode())
            except OSError:
                pass
