"""Counters for people and programs: the live view, the summary, JSON lines.

``--stats`` prints a human summary on stderr at exit; ``--stats=1s`` also
one line of rates per interval while the guest runs; ``--stats-json=FILE``
(``-``: stdout) writes the snapshot (stats.py, docs/stats.md) at exit and,
with an interval, one JSON object per line per interval. SIGUSR1 prints the
current counters in the human form and the guest runs on.

A sampling thread reads the counters while the vCPU thread is inside
KVM_RUN (cffi releases the GIL there): the fast path's and the IO thread's
counters are plain 64-bit fields written by one thread each, KVM's come
from its stats fd, so reading them needs no lock.
"""

from __future__ import annotations

import _signal as signal  # the functions without signal.py's enums (a ms per start)
import os
import re
import stat
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

from pyvmm.errors import UsageError

Snapshot = dict[str, Any]

_INTERVAL = r"^([0-9]+(?:\.[0-9]+)?)(ms|s)?$"  # compiled when --stats has an interval


def parse_interval(option: str, text: str) -> float:
    """ "1s", "500ms" or "2" (seconds) -> seconds, at least 10 ms."""
    match = re.match(_INTERVAL, text)
    if not match:
        raise UsageError(f"{option}: '{text}' is not an interval such as 1s or 500ms")
    value = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
    if not 0.01 <= value <= 86400:
        raise UsageError(f"{option}: {text} is outside 10ms to 24h")
    return value


# -- reading a snapshot ------------------------------------------------------------


def net_devices(snap: Snapshot) -> dict[str, dict[str, int]]:
    """Per net device: frames and bytes each way and drops by cause,
    whichever path moved them (shmstream rings or Solo5's ring; the
    hypercall path is counted per run under "hypercalls")."""
    shm = snap.get("shmstream")
    if shm:
        return {
            name: {
                "rx_frames": c["rx_frames"],
                "rx_bytes": c["rx_bytes"],
                "tx_frames": c["tx_frames"],
                "tx_bytes": c["tx_bytes"],
                "drops_full": c["rx_drops_full"],
                "drops_oversize": c["rx_drops_oversize"],
                "drops_bad": c["rx_bad_index"] + c["tx_bad_index"] + c["tx_drops_bad_len"],
                "drops_tap": c["tx_drops_backend"],
            }
            for name, c in shm["devices"].items()
        }
    ring = snap.get("solo5_ring")
    if ring:
        r = ring["ring"]
        return {
            "ring": {
                "rx_frames": r["reads"],
                "rx_bytes": r["read_bytes"],
                "tx_frames": r["writes"],
                "tx_bytes": r["write_bytes"],
                "drops_oversize": r.get("read_drops_oversize", 0),
                "drops_bad": r["bad_entries"] + r["bad_index"],
            }
        }
    return {}


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
    for name, value in snap.get("hypercalls", {}).items():
        flat[f"hc.{name}"] = value
    for reason, value in snap.get("exits_to_pyvmm", {}).items():
        flat[f"exit.{reason}"] = value
    kvm = snap.get("kvm") or {}
    for key in ("exits", "io_exits", "mmio_exits", "halt_exits", "signal_exits", "irq_exits"):
        if key in kvm:
            flat[f"kvm.{key}"] = kvm[key]
    thread = _thread(snap)
    for key in ("wakeups", "kicks", "sleeps", "busy_passes", "idle_spins", "cpu_ns"):
        if key in thread:
            flat[f"io.{key}"] = thread[key]
    for shm_dev in (snap.get("shmstream") or {}).get("devices", {}).values():
        flat["notify.sent"] = flat.get("notify.sent", 0) + shm_dev["notify_sent"]
        flat["notify.suppressed"] = flat.get("notify.suppressed", 0) + shm_dev["notify_suppressed"]
    flat["vcpu.cpu_ns"] = snap.get("vcpu_thread_cpu_ns", 0)
    return flat


def rates(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """Per-second rates of every counter between two snapshots."""
    a, b = _flat(before), _flat(after)
    dt = max(b["seconds"] - a["seconds"], 1e-9)
    return {k: (v - a.get(k, 0)) / dt for k, v in b.items() if k != "seconds"}


# -- human forms ---------------------------------------------------------------------


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


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def _pick(values: dict[str, float], prefix: str) -> dict[str, float]:
    return {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix) and v}


def rate_line(r: dict[str, float], at: float) -> str:
    """One line of rates (per second) for the live view."""
    parts = [f"t={at:.1f}s"]
    devices = sorted({k.split(".", 1)[0] for k in r if k.endswith(".rx_frames")})
    for name in devices:
        parts.append(
            f"{name} rx {_si(r[f'{name}.rx_frames'])} fr/s {_si(r[f'{name}.rx_bytes'])}B/s"
            f" tx {_si(r[f'{name}.tx_frames'])} fr/s {_si(r[f'{name}.tx_bytes'])}B/s"
        )
        drops = sum(v for k, v in r.items() if k.startswith(f"{name}.drops"))
        if drops:
            parts.append(f"{name} drops {_si(drops)}/s")
    exits = _pick(r, "exit.")
    kvm = r.get("kvm.exits")
    parts.append(
        "exits/s"
        + (f" KVM {_si(kvm)}" if kvm is not None else "")
        + "".join(f" {k} {_si(v)}" for k, v in sorted(exits.items()))
    )
    calls = _pick(r, "hc.")
    if calls:
        parts.append("hc/s" + "".join(f" {k} {_si(v)}" for k, v in sorted(calls.items())))
    if "notify.sent" in r:
        parts.append(f"wake-ups sent {_si(r['notify.sent'])}/s")
    if "io.kicks" in r:
        parts.append(
            f"IO kicks {_si(r['io.kicks'])}/s wake {_si(r['io.wakeups'])}/s "
            f"spins {_si(r['io.idle_spins'])}/s"
        )
    cpu = f"CPU vCPU {r.get('vcpu.cpu_ns', 0) / 1e7:.0f}%"
    if "io.cpu_ns" in r:
        cpu += f" IO {r['io.cpu_ns'] / 1e7:.0f}%"
    parts.append(cpu)
    return "pyvmm: " + " | ".join(parts)


def summary(snap: Snapshot) -> str:
    """The counters of a run (or so far) in a few human lines."""
    seconds = max(snap.get("seconds", 0.0), 1e-9)
    lines = [f"pyvmm: {seconds:.3f} s, privilege {snap['privilege']} (CPL {snap['cpl']})"]
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
    for name, dev in net_devices(snap).items():
        drops = {k[6:]: v for k, v in dev.items() if k.startswith("drops_") and v}
        lines.append(
            f"  net {name}: rx {dev['rx_frames']} frames ({_si(dev['rx_bytes'])}B), "
            f"tx {dev['tx_frames']} frames ({_si(dev['tx_bytes'])}B); drops: "
            + (", ".join(f"{k} {v}" for k, v in drops.items()) or "none")
        )
    if any((snap.get("tap_drops") or {}).values()):
        t = snap["tap_drops"]
        lines.append(f"  hypercall path drops: rx too long {t['rx_oversize']}, tx {t['tx']}")
    thread = _thread(snap)
    cpu = f"  CPU: vCPU thread {snap.get('vcpu_thread_cpu_ns', 0) / 1e9 / seconds * 100:.0f}%"
    if thread:
        mode = (snap.get("shmstream") or snap.get("solo5_ring"))["mode"]
        cpu += f", IO thread ({mode}) {thread['cpu_ns'] / 1e9 / seconds * 100:.0f}%"
        lines.append(
            f"  IO thread: wake-ups {thread['wakeups']}, kicks {thread['kicks']}, "
            f"sleeps {thread['sleeps']}, busy passes {thread['busy_passes']}, "
            f"idle spins {thread['idle_spins']}"
        )
    lines.append(cpu)
    return "\n".join(lines)


# -- output ----------------------------------------------------------------------------


def open_json(path: str) -> IO[str]:
    """``-`` is stdout; a file is replaced, anything else (a pipe, a
    terminal, /dev/stderr) appended to, never truncated."""
    if path == "-":
        return os.fdopen(os.dup(1), "w", buffering=1)
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
        self._threads: list[threading.Thread] = []

    # The live view and SIGUSR1 run on their own threads, started right
    # before the guest and stopped (joined) right after it.
    def start(self, *, usr1: bool = True) -> None:
        """The threads; ``usr1=False``: no SIGUSR1 watcher, the caller
        takes the signal and calls ``print_summary`` (a launcher's VM, whose
        channel thread does: pyvmm/serve/child.py)."""
        if self.interval is not None:
            self._spawn(self._tick, "pyvmm-stats")
        if usr1 and threading.current_thread() is threading.main_thread():
            self._usr1_watch()

    def print_summary(self) -> None:
        """The counters so far, in the human form (what SIGUSR1 prints)."""
        self._write_live(summary(self.sample()))

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _tick(self) -> None:
        before = self.sample()
        while not self._stop.wait(self.interval):
            now = self.sample()
            self._write_live(rate_line(rates(before, now), now.get("seconds", 0.0)))
            if self.json is not None:
                self._write_json(now)
            before = now

    def _usr1_watch(self) -> None:
        """SIGUSR1: the counters so far, in the human form. The signal is
        blocked in every thread and taken by sigwait on a watcher thread, so
        it never interrupts the vCPU or the IO thread."""
        self._saved_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        self._spawn(self._usr1_loop, "pyvmm-sigusr1")

    def _usr1_loop(self) -> None:
        while True:
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

    def _write_json(self, snap: Snapshot) -> None:
        import json

        try:
            self.json.write(json.dumps(snap, sort_keys=True) + "\n")
            self.json.flush()
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.name == "pyvmm-sigusr1":
                signal.pthread_kill(thread.ident, signal.SIGUSR1)
            thread.join()
        self._threads.clear()
        if hasattr(self, "_saved_mask"):
            signal.pthread_sigmask(signal.SIG_SETMASK, self._saved_mask)
            del self._saved_mask

    def finish(self, snap: Snapshot) -> None:
        """The final counters, once the guest has stopped."""
        self.stop()
        if self.summary_at_exit:
            self._write_live(summary(snap))
        if self.json is not None:
            self._write_json(snap)
            self.json.close()
            self.json = None
