"""One start-up timeline per container: pyvmm-oci's calls and the VM's phases.

Asked for by the spec's annotation ``org.pyvmm.trace=DIR`` (``ctr run
--annotation``, or a pod's, where the CRI plugin passes it) or by the
runtime's environment, ``PYVMM_OCI_TIMELINE=DIR`` (every container). The
image cannot ask: its metadata file's annotations are not read for this,
since the value names a host directory the runtime writes into.

While a container lives its timeline is two files in its state directory
(0700, root's): ``timeline``, a header line naming the destination and then
one Trace Event per line, appended by every call (create, start, state,
kill, delete; the native front end, csrc/oci_timeline.c, writes the same
lines), and ``vm-trace.json``, pyvmm's own ``--trace`` file. ``delete``
merges them into ``DIR/ID.trace.json``: owner-only, made under a temporary
name with O_EXCL and renamed over the old one, so never written through a
link. Every time is CLOCK_MONOTONIC in us (pyvmm's CLOCK_BOOTTIME shifted
by the difference of the two clocks at the merge); the gaps between calls
are events of their own, on the track of containerd and its shim, whose
time they are.

The merge is written twice, here and in C, because the native front end's
delete must not start an interpreter; both follow the rules below, which
``tests/test_oci_trace.py`` checks on the file containerd's run leaves.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time

#: The annotation, the environment variable and the files.
ANNOTATION = "org.pyvmm.trace"
ENVIRONMENT = "PYVMM_OCI_TIMELINE"
LOG = "timeline"
VM_TRACE = "vm-trace.json"
SUFFIX = ".trace.json"
MAGIC = "pyvmm-oci-timeline 1 "
#: Set by the native front end when it hands a call to Python: when the
#: call began (CLOCK_MONOTONIC ns), so its span covers the interpreter's start.
BEGIN_ENV = "PYVMM_OCI_T0"
#: The tracks: the runtime's calls (one thread per call's pid) and
#: containerd with its shim (the time between calls).
RUNTIME_PID, CONTAINERD_PID = 1, 2
CALL, GAP = "pyvmm-oci.call", "containerd"
#: Where this process's call began: the front end's clock, or (the Python
#: runtime started on its own) the process start, in clock ticks.
STAT_BEGIN = "/proc/self/stat (10 ms steps)"
READ_MAX = 1 << 20
_begin_from = "the native front end"
FILE_MODE = 0o600


class TimelineError(Exception):
    """A trace request that cannot be honoured (one line)."""


def monotonic_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def boottime_offset_ns() -> int:
    """CLOCK_BOOTTIME less CLOCK_MONOTONIC: the time suspended since boot."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) - monotonic_ns()


def _ticks_to_monotonic_ns(ticks: int) -> int:
    """A /proc/PID/stat start time (clock ticks of CLOCK_BOOTTIME)."""
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK") - boottime_offset_ns()


def _stat(pid: int | str) -> tuple[str, list[str]] | None:
    """The command name and the fields after it of /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()


def call_begin() -> int:
    """When this call began: where the native front end started it, else
    this process's start (10 ms steps). Taken from the environment so that
    nothing pyvmm-oci starts inherits it."""
    global _begin_from
    given = os.environ.pop(BEGIN_ENV, "")
    if given.isdecimal():
        return int(given)
    _begin_from = STAT_BEGIN
    found = _stat("self")
    return _ticks_to_monotonic_ns(int(found[1][19])) if found else monotonic_ns()


# -- the request -------------------------------------------------------------


def requested(annotations: object, environ: dict[str, str] | None = None) -> str | None:
    """The directory asked for, by the spec's annotation or the environment,
    checked: an absolute path of an existing directory that is no link."""
    env = os.environ if environ is None else environ
    where, value = ANNOTATION, None
    if isinstance(annotations, dict) and annotations.get(ANNOTATION) is not None:
        value = annotations[ANNOTATION]
    elif env.get(ENVIRONMENT):
        where, value = ENVIRONMENT, env[ENVIRONMENT]
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or "\n" in value:
        raise TimelineError(f"{where}: {value!r} is not an absolute path of a directory")
    try:
        st = os.lstat(value)
    except OSError as err:
        raise TimelineError(f"{where}: {value}: {err.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise TimelineError(f"{where}: {value} is not a directory (a link is not followed)")
    return os.path.normpath(value)


def destination(directory: str, cid: str) -> str:
    return os.path.join(directory, cid + SUFFIX)


def start(state_dir: str, dest: str) -> None:
    """The container's log, with its destination in the header."""
    _append(os.path.join(state_dir, LOG), MAGIC + dest + "\n", create=True)


def vm_trace(state_dir: str) -> str | None:
    """pyvmm's --trace file, when the container's timeline is kept."""
    if not os.path.exists(os.path.join(state_dir, LOG)):
        return None
    return os.path.join(state_dir, VM_TRACE)


# -- events -------------------------------------------------------------------


def _append(path: str, text: str, create: bool = False) -> bool:
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | (os.O_CREAT | os.O_EXCL if create else 0), FILE_MODE)
    except FileNotFoundError:
        return False
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return True


def event(
    name: str, cat: str, begin_ns: int, end_ns: int, pid: int, tid: int, args: dict | None = None
) -> str:
    """One complete event, as one line (the C writer's form)."""
    extra = f',"args":{json.dumps(args, separators=(",", ":"))}' if args else ""
    return (
        f'{{"name":{json.dumps(name)},"cat":"{cat}","ph":"X","ts":{begin_ns / 1000:.3f},'
        f'"dur":{max(0, end_ns - begin_ns) / 1000:.3f},"pid":{pid},"tid":{tid}{extra}}}'
    )


def _call_event(name: str, begin_ns: int, end_ns: int, status: int) -> str:
    pid = os.getpid()
    args = {"pid": pid, "status": status, "runtime": "python", "begin": _begin_from}
    return event(name, CALL, begin_ns, end_ns, RUNTIME_PID, pid, args)


def call_end(state_dir: str, name: str, begin_ns: int, status: int, main_ns: int = 0) -> None:
    """This call's span, if the container keeps a timeline (nothing else:
    no file is made here); ``main_ns``: when the runtime's main began."""
    path = os.path.join(state_dir, LOG)
    if not os.path.exists(path):
        return
    lines = [_call_event(name, begin_ns, monotonic_ns(), status)]
    if name == "create":
        lines += _create_extras(begin_ns, main_ns)
    with contextlib.suppress(OSError):
        _append(path, "".join(line + "\n" for line in lines))


def _create_extras(begin_ns: int, main_ns: int) -> list[str]:
    """Inside create: the interpreter's start; before it: the caller's
    (the shim's) life since it started, the part of containerd's work
    the runtime can see (its start time is in clock ticks, 10 ms)."""
    pid, out = os.getpid(), []
    if main_ns > begin_ns:
        out.append(event("interpreter start", "pyvmm-oci", begin_ns, main_ns, RUNTIME_PID, pid))
    parent = _stat(os.getppid())
    if parent is not None:
        started = _ticks_to_monotonic_ns(int(parent[1][19]))
        if started < begin_ns:
            args = {"pid": os.getppid(), "comm": parent[0], "resolution_ms": 10}
            out.append(
                event(f"{parent[0]} started", GAP, started, begin_ns, CONTAINERD_PID, 1, args)
            )
    return out


# -- the merge ------------------------------------------------------------------


class Pending:
    """A container's timeline read before delete removes its state."""

    __slots__ = ("dest", "lines")

    def __init__(self, dest: str, lines: list[str]) -> None:
        self.dest, self.lines = dest, lines


def collect(state_dir: str) -> Pending | None:
    """The log and the VM's phases (shifted to CLOCK_MONOTONIC), or None
    when no timeline was asked for."""
    try:
        with open(os.path.join(state_dir, LOG), "rb") as f:
            text = f.read(READ_MAX).decode(errors="replace")
    except OSError:
        return None
    header, _, body = text.partition("\n")
    if not header.startswith(MAGIC):
        return None
    lines = [line for line in body.split("\n") if line.startswith("{")]
    return Pending(header[len(MAGIC) :], lines + _vm_lines(state_dir))


def _vm_lines(state_dir: str) -> list[str]:
    try:
        with open(os.path.join(state_dir, VM_TRACE), "rb") as f:
            vm = json.loads(f.read(READ_MAX))
        start_ns = int(vm["otherData"]["start_ns"])
    except (OSError, ValueError, KeyError, TypeError):
        return []  # the VM was killed before it wrote its timeline
    shift = (start_ns - boottime_offset_ns()) / 1000
    out = []
    for ev in vm.get("traceEvents", []):
        if "ts" in ev:
            ev["ts"] = round(ev["ts"] + shift, 3)
        out.append(json.dumps(ev, separators=(",", ":")))
    return out


def _gaps(lines: list[str]) -> list[str]:
    """The time between one call's end and the next one's begin."""
    calls = []
    for line in lines:
        ev = json.loads(line)
        if ev.get("cat") == CALL:
            calls.append(ev)
    out = []
    for before, after in zip(calls, calls[1:], strict=False):
        end = before["ts"] + before["dur"]
        if after["ts"] > end:
            args = {"after": before["name"], "before": after["name"]}
            out.append(
                event(
                    "between calls",
                    GAP,
                    int(end * 1000),
                    int(after["ts"] * 1000),
                    CONTAINERD_PID,
                    2,
                    args,
                )
            )
    return out


def _names() -> list[str]:
    meta = []
    for pid, tid, kind, name in (
        (RUNTIME_PID, RUNTIME_PID, "process_name", "pyvmm-oci (the runtime's calls)"),
        (CONTAINERD_PID, CONTAINERD_PID, "process_name", "containerd and its shim"),
        (CONTAINERD_PID, 1, "thread_name", "the shim's start"),
        (CONTAINERD_PID, 2, "thread_name", "between calls"),
    ):
        meta.append(
            json.dumps({"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        )
    return meta


def document(lines: list[str]) -> str:
    """The Trace Event file: the events, the gaps, the tracks' names."""
    events = lines + _gaps(lines) + _names()
    return (
        '{"traceEvents":[\n' + ",\n".join(events) + '\n],"displayTimeUnit":"ms",'
        '"otherData":{"clock":"CLOCK_MONOTONIC","unit":"us"}}\n'
    )


def write(pending: Pending, name: str, begin_ns: int, status: int) -> None:
    """The merged file, with the last call's (delete's) span; owner-only,
    made under a fresh name and renamed over DEST (no link followed)."""
    lines = [*pending.lines, _call_event(name, begin_ns, monotonic_ns(), status)]
    tmp = f"{pending.dest}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        data = document(lines).encode()
        while data:
            data = data[os.write(fd, data) :]
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, pending.dest)
