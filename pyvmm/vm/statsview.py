"""Counters for people and programs: the live view, the summary, JSON lines.

``--stats`` prints a human summary on stderr at exit; ``--stats=1s`` also a
table of rates, one row per interval under a header that repeats (as
vmstat's does); ``--stats-json=FILE`` (``-``: standard error, since standard
output is the guest's console) writes the snapshot (stats.py, docs/stats.md)
at exit and, with an interval, one JSON object per line per interval.
SIGUSR1 prints the current counters in the human form and the guest runs on.

A sampling thread reads the counters while the vCPU thread is inside
KVM_RUN (cffi releases the GIL there): the fast path's and the IO thread's
counters are plain 64-bit fields written by one thread each, KVM's come
from its stats fd, a tap's from the kernel over netlink, so reading them
needs no lock.
"""

from __future__ import annotations

import _signal as signal  # the functions without signal.py's enums (a ms per start)
import _thread as threads
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from pyvmm.common import trace
from pyvmm.common.errors import UsageError
from pyvmm.vm.stats import DROP_CAUSES, by_meaning, dropped

Snapshot = dict[str, Any]

_INTERVAL = r"^([0-9]+(?:\.[0-9]+)?)(ms|s)?$"  # compiled when --stats has an interval

#: The live view prints its header again after this many rows.
HEADER_EVERY = 20
#: Every line of the live view (header and rows) starts with this.
LIVE_PREFIX = "pyvmm: "
#: A row or header line of the live view, to tell them from pyvmm's other lines.
LIVE_LINE = r"^pyvmm: (-|\s*s |\s*[0-9]+\.[0-9] )"


def parse_interval(option: str, text: str) -> float:
    """ "1s", "500ms" or "2" (seconds) -> seconds, at least 10 ms."""
    match = re.match(_INTERVAL, text)
    if not match:
        raise UsageError(f"{option}: '{text}' is not an interval such as 1s or 500ms")
    value = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
    if not 0.01 <= value <= 86400:
        raise UsageError(f"{option}: {text} is outside 10ms to 24h")
    return value


def is_live_line(line: str) -> bool:
    """Whether ``line`` (of pyvmm's stderr) belongs to the live view."""
    return re.match(LIVE_LINE, line) is not None


# -- reading a snapshot ------------------------------------------------------------


def _tap_drops(kernel: dict[str, int] | None) -> dict[str, int]:
    """A tap's own drops, by direction as the guest sees it."""
    return {k: v for k, v in by_meaning("taps", kernel).items() if k.startswith("tap_")}


def net_devices(snap: Snapshot) -> dict[str, dict[str, int]]:
    """Per net device: frames and bytes to the guest (``rx``) and from it
    (``tx``), pyvmm's own drops by cause (``drops_*``) and the tap's
    (``tap_to_guest``, ``tap_from_guest``), whichever path moved the frames:
    shmstream's rings (per device), Solo5's ring (one for every device) or
    the hypercalls (the tap's own counts: the frames pyvmm read and wrote).
    What each counter means is stats.NET_MEANING's."""
    taps = snap.get("taps") or {}
    shm = snap.get("shmstream")
    if shm:
        return {
            name: {**by_meaning("shmstream", c), **_tap_drops(taps.get(name))}
            for name, c in shm["devices"].items()
        }
    ring = snap.get("solo5_ring")
    if ring:
        kernel: dict[str, int] = {}
        for t in taps.values():
            for key, value in _tap_drops(t).items():
                kernel[key] = kernel.get(key, 0) + value
        return {
            next(iter(taps)) if len(taps) == 1 else "ring": {
                **by_meaning("solo5_ring", ring["ring"]),
                **kernel,
            }
        }
    # The hypercall path: pyvmm's drops are counted for all devices at once,
    # so they are a device's only when it is the only one.
    hypercall = snap.get("tap_drops") or {}
    own = by_meaning("tap_drops", hypercall) if hypercall and len(taps) == 1 else {}
    return {name: {**by_meaning("taps", t), **own} for name, t in taps.items()}


def pyvmm_drops(snap: Snapshot) -> int:
    """Every frame pyvmm itself dropped, on any path and device."""
    total = dropped("tap_drops", snap.get("tap_drops"))
    for c in (snap.get("shmstream") or {}).get("devices", {}).values():
        total += dropped("shmstream", c)
    total += dropped("solo5_ring", (snap.get("solo5_ring") or {}).get("ring"))
    return total


def _thread(snap: Snapshot) -> dict[str, int]:
    for key in ("shmstream", "solo5_ring"):
        if key in snap:
            return snap[key]["thread"]
    return {}


def _flat(snap: Snapshot) -> dict[str, float]:
    """The monotonic counters a rate is taken of, by display name."""
    flat: dict[str, float] = {"seconds": snap.get("seconds", 0.0)}
    for name, dev in net_devices(snap).items():
        for key, value in dev.items():
            flat[f"{name}.{key}"] = value
    flat["drops.pyvmm"] = pyvmm_drops(snap)
    flat["drops.tap"] = sum(sum(_tap_drops(t).values()) for t in (snap.get("taps") or {}).values())
    reached = sum(snap.get("exits_to_pyvmm", {}).values())
    flat["exits.pyvmm"] = reached
    flat["exits.python"] = reached - (snap.get("hypercalls_in_c") or {}).get("answered", 0)
    kvm = snap.get("kvm") or {}
    if "exits" in kvm:
        flat["exits.kvm"] = kvm["exits"]
    for name, value in snap.get("hypercalls", {}).items():
        flat[f"hc.{name}"] = value
    thread = _thread(snap)
    for key, value in thread.items():  # struct io_stats's fields and cpu_ns
        flat[f"io.{key}"] = value
    if "shmstream" in snap:
        flat["io.guest_wakeups"] = sum(
            d["notify_sent"] for d in snap["shmstream"]["devices"].values()
        )
    flat["vcpu.cpu_ns"] = snap.get("vcpu_thread_cpu_ns", 0)
    return flat


def rates(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Per-second rates of every counter between two snapshots."""
    a, b = _flat(before), _flat(after)
    dt = max(b["seconds"] - a["seconds"], 1e-9)
    return {k: (v - a.get(k, 0)) / dt for k, v in b.items() if k != "seconds"}


# -- the live view -------------------------------------------------------------------


class Column:
    """One column of the live view: its group, its heading (with its unit)
    and the rate it shows (``key`` in ``rates()``, divided by ``scale``)."""

    def __init__(self, group: str, heading: str, key: str, scale: float = 1, width: int = 7):
        self.group = group
        self.heading = heading
        self.key = key
        self.scale = scale
        self.width = max(width, len(heading))

    def cell(self, r: dict[str, float]) -> str:
        # One number format for every column: a whole number, right-aligned.
        return f"{r.get(self.key, 0) / self.scale:>{self.width}.0f}"


def columns(snap: Snapshot) -> list[Column]:
    """The live view's columns for this run, fixed from its first snapshot:
    the same columns on every row, whether their values are zero or not."""
    cols = []
    for name in net_devices(snap):
        group = f"net {name}"
        cols += [
            Column(group, "rx fr/s", f"{name}.rx_frames"),
            Column(group, "rx kB/s", f"{name}.rx_bytes", 1000),
            Column(group, "tx fr/s", f"{name}.tx_frames"),
            Column(group, "tx kB/s", f"{name}.tx_bytes", 1000),
        ]
    if snap.get("taps") or net_devices(snap):
        cols += [
            Column("dropped", "pyvmm/s", "drops.pyvmm"),
            Column("dropped", "tap/s", "drops.tap"),
        ]
    if "kvm" in snap and "exits" in snap["kvm"]:
        cols.append(Column("VM exits", "KVM/s", "exits.kvm"))
    cols += [
        Column("VM exits", "to pyvmm/s", "exits.pyvmm"),
        Column("VM exits", "Python/s", "exits.python"),
    ]
    if _thread(snap):
        cols += [
            Column("IO thread", "kicks/s", "io.kicks"),
            Column("IO thread", "epoll/s", "io.wakeups"),
            Column("IO thread", "spins/s", "io.idle_spins", width=9),
        ]
        if "shmstream" in snap:
            cols.append(Column("IO thread", "wake guest/s", "io.guest_wakeups"))
    cols.append(Column("CPU", "vCPU %", "vcpu.cpu_ns", 1e7))
    if _thread(snap):
        cols.append(Column("CPU", "IO %", "io.cpu_ns", 1e7))
    return cols


_TIME_WIDTH = 8


def header(cols: list[Column]) -> str:
    """Two lines: the groups, as ``-----net service0-----`` over their
    columns, then each column's heading with its unit."""
    groups: list[tuple[str, int]] = [("time", _TIME_WIDTH)]
    for col in cols:
        if groups[-1][0] == col.group:
            groups[-1] = (col.group, groups[-1][1] + 1 + col.width)
        else:
            groups.append((col.group, col.width))
    top = " ".join(f" {name} ".center(width, "-") for name, width in groups)
    names = " ".join([f"{'s':>{_TIME_WIDTH}}"] + [f"{c.heading:>{c.width}}" for c in cols])
    return f"{LIVE_PREFIX}{top}\n{LIVE_PREFIX}{names}"


def row(cols: list[Column], r: dict[str, float], at: float) -> str:
    """One row: the time since the guest started, then each column's rate."""
    return LIVE_PREFIX + " ".join([f"{at:>{_TIME_WIDTH}.1f}"] + [c.cell(r) for c in cols])


class LiveView:
    """The live view's lines: its columns fixed from the run's first
    snapshot, a row of rates since the previous one per snapshot, and the
    header before the first row and again every HEADER_EVERY rows."""

    def __init__(self, first: Snapshot) -> None:
        self.cols = columns(first)
        self.before = first
        self.rows = 0

    def next(self, now: Snapshot) -> str:
        line = row(self.cols, rates(self.before, now), now.get("seconds", 0.0))
        if self.rows % HEADER_EVERY == 0:
            line = header(self.cols) + "\n" + line
        self.rows += 1
        self.before = now
        return line


# -- the summary ---------------------------------------------------------------------


#: KVM's own per-vCPU counts shown beside pyvmm's (KVM_GET_STATS_FD names).
KVM_EXIT_KINDS = (
    "io_exits",
    "mmio_exits",
    "halt_exits",
    "irq_exits",
    "signal_exits",
    "insn_emulation",
    "pf_taken",
)


def _bytes(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def _percent(cpu_ns: int, seconds: float) -> str:
    return f"{cpu_ns / 1e9:.3f} s ({cpu_ns / 1e9 / seconds * 100:.0f}% of the run)"


def summary(snap: Snapshot) -> str:
    """The counters of a run (or so far) in a few human lines."""
    seconds = max(snap.get("seconds", 0.0), 1e-9)
    lines = [
        f"pyvmm: counters after the guest ran {seconds:.3f} s (wall clock), "
        f"privilege {snap['privilege']} (CPL {snap['cpl']})"
    ]
    kvm = snap.get("kvm") or {}
    reached = snap.get("exits_to_pyvmm", {})
    in_c = (snap.get("hypercalls_in_c") or {}).get("answered", 0)
    exit_line = "  VM exits:"
    if "exits" in kvm:
        exit_line += f" {kvm['exits']} counted by KVM,"
    exit_line += f" {sum(reached.values())} reached pyvmm"
    if reached:
        exit_line += " (" + ", ".join(f"{k} {v}" for k, v in sorted(reached.items())) + ")"
    if in_c:
        exit_line += f", {in_c} of them answered in C"
    lines.append(exit_line)
    by_kvm = {k: kvm[k] for k in KVM_EXIT_KINDS if kvm.get(k)}
    if by_kvm:
        lines.append("  KVM counted: " + ", ".join(f"{k} {v}" for k, v in by_kvm.items()))
    calls = snap.get("hypercalls", {})
    if calls:
        lines.append("  hypercalls: " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
    if snap.get("traps"):
        lines.append("  traps: " + ", ".join(f"{k} {v}" for k, v in sorted(snap["traps"].items())))
    devices = net_devices(snap)
    for name, dev in devices.items():
        lines.append(
            f"  net {name}: to the guest {dev['rx_frames']} frames ({_bytes(dev['rx_bytes'])}), "
            f"from the guest {dev['tx_frames']} frames ({_bytes(dev['tx_bytes'])})"
        )
        own = {cause: dev[key] for key, cause in DROP_CAUSES.items() if dev.get(key)}
        drops = "    dropped by pyvmm: " + (
            ", ".join(f"{v} ({k})" for k, v in own.items()) or "none"
        )
        if "tap_to_guest" in dev:
            drops += (
                f"; by the tap (the kernel): {dev['tap_to_guest']} to the guest (not read "
                f"in time), {dev['tap_from_guest']} from it"
            )
        lines.append(drops)
    hypercall = snap.get("tap_drops") or {}
    # Shown per device already: on shmstream's rings (whose drops the
    # hypercall path's are not) and for the one tap of the hypercall path.
    attributed = "shmstream" in snap or ("solo5_ring" not in snap and len(devices) == 1)
    if any(hypercall.values()) and not attributed:
        lines.append(
            f"  dropped by pyvmm on the hypercall path (all devices): "
            f"{hypercall['rx_oversize']} too long for the guest's buffer, "
            f"{hypercall['tx']} refused by the tap"
        )
    for name, counted in (snap.get("devices") or {}).items():
        lines.append(f"  device {name}: " + ", ".join(f"{k} {v}" for k, v in counted.items()))
    thread = _thread(snap)
    cpu = f"  CPU time: vCPU thread {_percent(snap.get('vcpu_thread_cpu_ns', 0), seconds)}"
    if thread:
        mode = (snap.get("shmstream") or snap.get("solo5_ring"))["mode"]
        cpu += f", IO thread {_percent(thread['cpu_ns'], seconds)}"
        io_line = (
            f"  IO thread ({mode}): guest kicks {thread['kicks']}, returns from epoll "
            f"{thread['wakeups']}, sleeps {thread['sleeps']}, passes that moved frames "
            f"{thread['busy_passes']}, idle passes {thread['idle_spins']}"
        )
        if "shmstream" in snap:
            woke = sum(d["notify_sent"] for d in snap["shmstream"]["devices"].values())
            io_line += f"; woke the guest {woke} times"
        ring = (snap.get("solo5_ring") or {}).get("ring") or {}
        if ring.get("kicks_inline"):
            io_line += f"; kicks the vCPU thread served {ring['kicks_inline']}"
        lines.append(io_line)
    lines.append(cpu)
    return "\n".join(lines)


# -- output ----------------------------------------------------------------------------


def open_json(path: str) -> IO[str]:
    """``-`` is standard error: standard output is the guest's console, and
    a record in the middle of it would serve neither (docs/stats.md). A
    file is replaced, anything else (a pipe, a terminal, /dev/stdout)
    appended to, never truncated."""
    if path == "-":
        return os.fdopen(os.dup(2), "w", buffering=1)
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        regular = True
    except OSError as err:
        raise UsageError(f"--stats-json={path}: {err.strerror}") from None
    try:
        return open(path, "w" if regular else "a", buffering=1)
    except OSError as err:
        raise UsageError(f"--stats-json={path}: cannot open: {err.strerror}") from None


class _Thread:
    """A daemon thread whose start does not wait for it to run:
    ``threading.Thread.start`` does, a scheduling round trip (0.2 ms on a
    quiet host, 3 ms on a loaded one) on the way to the guest's first
    instruction. It may so begin after the sandbox is on; the calls a
    thread's start makes (rseq, set_robust_list) are allowed
    (pyvmm/host/sandbox.py)."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self.name = name
        #: Set by the thread itself, first thing (None until it runs).
        self.ident: int | None = None
        self._target = target
        self._done = threads.allocate_lock()
        self._done.acquire()
        threads.start_new_thread(self._bootstrap, ())

    def _bootstrap(self) -> None:
        self.ident = threads.get_ident()
        trace.name_thread(self.name)
        try:
            self._target()
        finally:
            self._done.release()

    def join(self) -> None:
        with self._done:
            pass


class StatsOutput:
    """Where a run's counters go, and the threads that put them there."""

    def __init__(
        self,
        sample: Callable[[], Snapshot],
        *,
        summary_at_exit: bool,
        interval: float | None,
        json_out: IO[str] | None,
        live: IO[str] | None = None,
    ) -> None:
        self.sample = sample
        self.summary_at_exit = summary_at_exit
        self.interval = interval
        self.live = live or sys.stderr
        self.json = json_out
        if json_out is not None:
            import json  # noqa: F401  (now, while imports may still open files)
        self._stop = threading.Event()
        self._threads: list[_Thread] = []

    # The live view and SIGUSR1 run on their own threads, started right
    # before the guest and stopped (joined) right after it.
    def start(self, *, usr1: bool = True) -> None:
        """The threads; ``usr1=False``: no SIGUSR1 watcher, the caller
        takes the signal and calls ``print_summary`` (a launcher's VM, whose
        channel thread does: pyvmm/serve/child.py)."""
        # SIGUSR1 blocked first: every thread started from here inherits the
        # mask, so the signal can only be taken by the watcher's sigwait
        # (a thread with it unblocked would take it and ignore it).
        if usr1 and threading.current_thread() is threading.main_thread():
            self._saved_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
            self._spawn(self._usr1_loop, "pyvmm-sigusr1")
        if self.interval is not None:
            # The first row's baseline is taken here, before the guest runs:
            # taken by the new thread, it could come after counters the
            # first row must show (frames the tap dropped meanwhile, say).
            first = self.sample()
            self._spawn(lambda: self._tick(first), "pyvmm-stats")

    def print_summary(self) -> None:
        """The counters so far, in the human form (what SIGUSR1 prints)."""
        began = trace.now() if trace.enabled else 0
        self._write_live(summary(self.sample()))
        if began:
            trace.event("SIGUSR1: the counters so far printed", began)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        self._threads.append(_Thread(target, name))

    def _tick(self, first: Snapshot) -> None:
        view = LiveView(first)
        while not self._stop.wait(self.interval):
            began = trace.now() if trace.enabled else 0
            now = self.sample()
            self._write_live(view.next(now))
            if self.json is not None:
                self._write_json(now, "interval")
            if began:
                trace.event("counters: one interval's row", began, {"row": view.rows})

    def _usr1_loop(self) -> None:
        """SIGUSR1: the counters so far, in the human form. The signal is
        blocked in every thread and taken by sigwait on this thread, so it
        never interrupts the vCPU or the IO thread. The stop is looked at
        before each wait too: stop() sends no signal to a thread that has
        not yet said who it is (``_Thread.ident``)."""
        while not self._stop.is_set():
            signal.sigwait({signal.SIGUSR1})
            if self._stop.is_set():
                return
            self.print_summary()

    def _write_live(self, text: str) -> None:
        try:
            self.live.write(text + "\n")
            self.live.flush()
        except (OSError, ValueError):
            pass  # stderr gone: counters are not worth failing the run

    def _write_json(self, snap: Snapshot, record: str, **extra: Any) -> None:
        """One JSON line: the snapshot, which record it is (``interval`` or
        ``final``) and the wall-clock time it was taken at."""
        import json

        line = {**snap, "record": record, "unix_time": round(time.time(), 6), **extra}
        try:
            self.json.write(json.dumps(line, sort_keys=True) + "\n")
            self.json.flush()
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.name == "pyvmm-sigusr1" and thread.ident is not None:
                signal.pthread_kill(thread.ident, signal.SIGUSR1)
            thread.join()
        self._threads.clear()
        if hasattr(self, "_saved_mask"):
            signal.pthread_sigmask(signal.SIG_SETMASK, self._saved_mask)
            del self._saved_mask

    def finish(self, snap: Snapshot, exit_status: int | None = None) -> None:
        """The final counters, once the guest has stopped, with pyvmm's exit
        status (None: not known here)."""
        self.stop()
        if self.summary_at_exit:
            self._write_live(summary(snap))
        if self.json is not None:
            self._write_json(snap, "final", exit_status=exit_status)
            self.json.close()
            self.json = None
