"""Received packets per second and VM exits, every network path side by side.

    python3 bench/pps.py [--seconds 3] [--repeat 3] [--size 1300] [--rate 0]
                         [--modes off-py,off,poll,event,hybrid] [--pin[=apart|same]]
                         [--guest PATH] [--cpl auto,0,deprivileged]
                         [--ring-guest PATH] [--ring-modes event] [--budgets 50,2000]
                         [--solo5] [--solo5-hvt-seconds 1]
                         [--tap-read readv,uring] [--checkout NAME=DIR]
                         [--peer NAME=PATH [--peer-guest PATH]]
                         [--sender packet|udp] [--no-tx] [--no-latency]
                         [--out PREFIX] [--quick]
    python3 bench/pps.py --redraw PREFIX.json

Receive (the table everyone reads). For each row this boots a receiving
guest in a fresh network namespace with a tap, floods it from inside the
namespace with UDP datagrams of --size payload bytes for --seconds and
counts at three places: what the sender offered (C sendmmsg sender,
testkit.traffic; by default AF_PACKET frames written straight to the tap's
transmit routine, --sender udp for UDP sockets through the host's stack),
what the tap delivered to its reader and dropped (the tap's own tx_packets
and tx_dropped, read over netlink inside the namespace: a UDP sender cannot
see those drops) and what the guest itself received and checked (udpsink
checks every payload byte; a frame with a bad pattern is an error). Rows:

- `process`, the baseline (--no-baseline to leave it out): the same
  udpsink, udpsend and udpecho programs compiled unchanged as one plain
  Linux process on the tap (bench/baseline.py, bench/csrc/hostrt.c: one
  thread, one read or write per frame, no VM). Every other row's rate is
  a `ratio` to it, taken per repeat (the rows of a repeat run back to
  back), and so is its CPU per frame (`CPU ratio`);
- pyvmm's modes with pyvmm's udpsink (--modes): `off` (one net_read
  hypercall, one exit, per frame, answered in C), `off-py` (the same
  answered by Python, PYVMM_PY_HYPERCALLS=1), `poll`, `event`, `hybrid`
  (shmstream, the IO thread in that mode);
- Solo5's ring path (--ring-guest: a receiver linked with Solo5's own
  bindings, which have no shmstream driver, so with a shm mode pyvmm's IO
  thread serves it Solo5's ring I/O), rows `s5ring-MODE` (--ring-modes);
- --solo5: one receiver written for the Solo5 API alone
  (bench/solo5/udpsink.c, guests/udpsink.c's pattern and report), built
  at run time by scripts/solo5_build.py with Solo5's toolchain from
  ../shared/upstream's release, offline, one object linked three ways,
  and run as: `s5pyvmm-MODE` for each of --modes (relinked with `-z
  solo5-abi=pyvmm`: pyvmm's runtime, shmstream rings); `s5ring-off` and
  `s5ring-MODE` for each shm mode of --modes (unmodified, `-z
  solo5-abi=hvt`: hypercalls, then Solo5's ring I/O served by the IO
  thread; this replaces --ring-guest); `solo5-spt` (`-z solo5-abi=spt`
  under Solo5's seccomp tender solo5-spt, a plain process); `solo5-hvt`
  (the unmodified binary under Solo5's own tender, whose guest runs at
  CPL 0: emulated on a kvm_pvm host, so its traffic lasts only
  --solo5-hvt-seconds; 0 leaves the row out). These rows receive only (no
  transmit or latency rows); the table is followed by their ratios:
  relinked over pyvmm's udpsink per mode, Solo5's ring over solo5-hvt, and
  each family's hybrid over its best mode. Without a Solo5 build (the
  archive, Solo5's build tools) it stops with one line saying why;
- another copy of pyvmm (--checkout NAME=DIR: DIR a checkout with its
  extension and launcher built): each pyvmm row again as `NAME:ROW`, run
  by DIR/pyvmm/_launcher, interleaved with this checkout's rows (a before
  and after of a change in one run);
- other tenders (--peer NAME=PATH, e.g. solo5-hvt=/path/to/solo5-hvt),
  run as `PATH --mem=512 --net:service0=tap100 --net-mac:service0=MAC --
  GUEST ARGS` with --peer-guest or pyvmm's udpsink.hvt (which runs on a
  stock solo5-hvt); a peer has no counters, so its row gives what the guest
  and the tap say and the process's CPU time from /proc.

Each row runs --repeat times (all rows once, then again, each repeat
starting at another row: drift and a row's place spread over every row
alike); the table gives the median and, for received pps, the
spread (max - min over the median). Columns: offered pps (sender), tap
pps (frames the tap handed to the tender) and tap drop/s, rx pps (the
guest's own count over its first-to-last frame), frames and errors (pattern
errors the guest found), KVM exits/s (KVM_GET_STATS_FD) and to pyvmm/s,
exits/1k fr (KVM exits per 1000 received frames), ring drops (shmstream's
full-ring and bad-index drops), lost % (datagrams offered that the guest
did not count: refused, tap drops, ring drops), CPU % of the vCPU thread,
the IO thread and the sender, over the traffic window (pyvmm's from its
interval JSON counters, a peer's and the sender's from the kernel).
`CPU us/fr`: the whole tender process's CPU time (every thread's run time
from /proc/PID/task/*/schedstat, i.e. utime + stime in nanoseconds) over
the traffic window, per frame the guest counted; `sender us/fr`: the
sender's own, per datagram it sent.

Transmit (--no-tx to skip): the udpsend guest sends --tx-count datagrams as
fast as it can to a C receiver in the namespace (testkit.traffic --recv);
rows give what the guest sent per second, what the tap took from the
tender, what the host socket received, exits and CPU; `CPU us/fr` is the
tender's whole CPU time (wait4's rusage, less what it had used by "ready")
per datagram sent.

Latency (--no-latency to skip): udpecho answers --lat-count request/response
round trips of 64 bytes, one outstanding, one every --lat-interval-us (low
load), timed by the C client; median, p99, max, and the IO thread's CPU
while doing it (hybrid's point: poll's latency at event's idle cost);
`tender %` is the whole tender's CPU over the round trips and `idle %` over
--idle-seconds before them, with the guest waiting and no traffic.

Every raw number goes to PREFIX.json, the chart to PREFIX.png (matplotlib,
in the test extra; without it, the JSON only; bench/pps_chart.py draws it
from the JSON alone, and --redraw draws a saved run's again without
measuring). Nothing leaves the namespaces, which are removed afterwards,
also on failure. --quick: short runs of every part, one repeat, well under
a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import baseline, pps_chart  # noqa: E402
from pyvmm.vm.statsview import is_live_line  # noqa: E402
from scripts import solo5_build  # noqa: E402
from testkit.helpers import STATS_SCHEMA, guest_report  # noqa: E402
from testkit.netns import NetNamespace, read_until  # noqa: E402

GUESTS = ROOT / "guests" / "bin"
GUEST = GUESTS / "udpsink.hvt"
GUEST_IP, HOST_IP, PORT = "10.0.0.2", "10.0.0.1", 5000
GUEST_MAC = "02:00:00:00:00:02"
MODES = ("off-py", "off", "poll", "event", "hybrid")
SHM_MODES = ("poll", "event", "hybrid")
CLK_TCK = os.sysconf("SC_CLK_TCK")
SNAPSHOT_INTERVAL = "100ms"
# Latency rows: pyvmm's interval counters cost ~0.8% of a core every 100 ms,
# more than an idle tender itself; once a second keeps the idle figure its own.
LATENCY_SNAPSHOT_INTERVAL = "1s"
# --pin's placements: the pyvmm rows' --pin (with and without an IO
# thread) and the sender's CPU. "apart": the vCPU shares CPU 0 with the
# sender, the IO thread has CPU 1; "same": the vCPU and the IO thread share
# CPU 1, the sender has CPU 0 (the co-scheduled case).
PLACEMENTS = {
    "apart": {"shm": "vcpu=0,io=1", "off": "vcpu=0", "sender": "0", "sender_off": "1"},
    "same": {"shm": "vcpu=1,io=1", "off": "vcpu=1", "sender": "0", "sender_off": "0"},
}

# The row every other is a ratio to: the guest programs as one plain process
# on the tap (bench/baseline.py).
BASELINE = "process"


# -- one run of one row -----------------------------------------------------------


class Tender:
    """A tender (pyvmm or a peer) running a guest inside a namespace."""

    def __init__(
        self,
        ns: NetNamespace,
        case: dict,
        guest_args: list[str],
        args,
        tmp: str,
        interval: str = SNAPSHOT_INTERVAL,
    ):
        self.case, self.ns = case, ns
        self.stats_path = Path(tmp) / "stats.jsonl"
        self.err_path = Path(tmp) / "stderr"
        guest = str(case["guest"])
        env = None
        if case["tender"] == "pyvmm":
            shm = case["shm"]
            # Another checkout's rows run through its own launcher (--checkout).
            launch = [case["launcher"]] if case.get("launcher") else [sys.executable, "-m", "pyvmm"]
            argv = [
                *launch,
                f"--stats={interval}",
                f"--stats-json={self.stats_path}",
                f"--cpl={case['cpl']}",
                f"--shm={shm}",
                "--net:service0=tap100",
                f"--net-mac:service0={GUEST_MAC}",
            ]
            if args.pin:
                argv += ["--pin", PLACEMENTS[args.pin]["off" if shm == "off" else "shm"]]
            if args.slots and shm != "off":
                argv += [f"--shm-slots={args.slots}"]
            budget = case.get("budget") or args.budget
            if budget and shm == "hybrid":
                argv += [f"--hybrid-budget={budget}"]
            if case.get("tap_read"):
                argv += [f"--tap-read={case['tap_read']}"]
            if case.get("kicks") and case["kicks"] != "thread":  # older checkouts: no flag
                argv += [f"--net-ring-kicks={case['kicks']}"]
            if args.no_sandbox:
                argv += ["--no-sandbox"]
            if case.get("py"):
                env = dict(os.environ, PYVMM_PY_HYPERCALLS="1")
            argv += [guest, *guest_args]
        elif case["tender"] == "process":
            argv = [guest, "tap100", GUEST_MAC, *guest_args]
        else:
            argv = [
                case["path"],
                "--mem=512",
                "--net:service0=tap100",
                f"--net-mac:service0={GUEST_MAC}",
                "--",
                guest,
                *guest_args,
            ]
        self.err = open(self.err_path, "w")  # noqa: SIM115 (closed in finish)
        self.proc = ns.popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            env=env,
            preexec_fn=niced(args.nice),
        )
        self.head, ready = read_until(self.proc.stdout, "ready")
        if ready:
            return
        self.proc.wait(timeout=30)
        raise RuntimeError(f"{case['label']}: ended before ready: {self.head}{self.stderr()}")

    def stderr(self) -> str:
        """The tender's stderr without pyvmm's live rate lines."""
        self.err.flush()
        text = self.err_path.read_text(errors="replace")
        return "".join(ln for ln in text.splitlines(True) if not is_live_line(ln))

    def snapshot(self, newer_than: float = -1.0, timeout: float = 2.0) -> dict | None:
        """pyvmm: the newest interval snapshot (one newer than ``newer_than``
        seconds of guest time, waiting for it up to ``timeout``)."""
        if self.case["tender"] != "pyvmm":
            return None
        deadline = time.monotonic() + timeout
        while True:
            last = None
            with contextlib.suppress(FileNotFoundError):
                for line in self.stats_path.read_text().splitlines():
                    if STATS_SCHEMA in line:
                        with contextlib.suppress(ValueError):
                            last = json.loads(line)
            if last and last["seconds"] > newer_than:
                return last
            if time.monotonic() > deadline:
                return last
            time.sleep(0.02)

    def cpu(self) -> dict[str, float]:
        """CPU seconds of the tender's process, per thread: the scheduler's
        run time (/proc/PID/task/TID/schedstat, nanoseconds: utime + stime
        without the clock tick's 10 ms granularity), else utime + stime."""
        out = {}
        task = f"/proc/{self.proc.pid}/task"
        with contextlib.suppress(OSError):
            for tid in os.listdir(task):
                with contextlib.suppress(OSError, ValueError):
                    with open(f"{task}/{tid}/schedstat") as f:
                        out[tid] = int(f.read().split()[0]) / 1e9
                    continue
                with contextlib.suppress(OSError), open(f"{task}/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                    out[tid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        return out

    def reap(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the process to end and keep its whole
        CPU time (every thread's, from wait4's rusage) in ``self.total_cpu_s``."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.total_cpu_s = ru.ru_utime + ru.ru_stime
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def finish(self, timeout: float) -> tuple[str, str, bool]:
        """Wait for the guest's end (stop it after ``timeout``); its stdout,
        the tender's stderr, and whether it ended by itself."""
        ended = True
        self.total_cpu_s = None
        try:
            if not self.reap(timeout):
                raise subprocess.TimeoutExpired(self.proc.args, timeout)
            out, _ = self.proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            ended = False
            self.proc.terminate()
            try:
                out, _ = self.proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, _ = self.proc.communicate()
        err = self.stderr()
        self.err.close()
        return self.head + (out or ""), err, ended

    def final_stats(self) -> dict | None:
        if self.case["tender"] != "pyvmm":
            return None
        lines = [ln for ln in self.stats_path.read_text().splitlines() if STATS_SCHEMA in ln]
        return json.loads(lines[-1]) if lines else None


def niced(value: int):
    """A preexec_fn that changes the child's nice value by ``value``."""
    return (lambda: os.nice(value)) if value else None


def namespace_with_tap() -> NetNamespace:
    ns = NetNamespace()
    ns.create()
    try:
        ns.add_tap("tap100", address=f"{HOST_IP}/24")
        # A static neighbour entry: the flood starts at once, no ARP.
        ns.run(
            ["ip", "neigh", "replace", GUEST_IP, "lladdr", GUEST_MAC, "dev", "tap100"], check=True
        )
    except BaseException:
        ns.close()
        raise
    return ns


def tap_mac(ns: NetNamespace) -> str:
    with ns.iproute() as ipr:
        return ipr.get_links(ifname="tap100")[0].get("address")


def sender_argv(args, shm: str, seconds: float) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "testkit.traffic",
        GUEST_IP,
        str(PORT),
        "--seconds",
        str(seconds),
        "--size",
        str(args.size),
        "--rate",
        str(args.rate),
        "--batch",
        str(args.batch),
        "--sndbuf",
        str(args.sndbuf),
    ]
    if args.sender == "packet":
        argv += ["--packet", "tap100", "--qdisc", "--src-ip", HOST_IP, "--dst-mac", GUEST_MAC]
    else:
        argv += ["--sockets", str(args.sockets)]
    if args.sender_cpu >= 0:
        argv += ["--cpu", str(args.sender_cpu)]
    elif args.pin:
        argv += ["--cpu", PLACEMENTS[args.pin]["sender_off" if shm == "off" else "sender"]]
    return argv


def notified(snap: dict, service: str) -> int:
    """The guest wake-ups the IO thread sent, over every device."""
    devices = (snap.get(service) or {}).get("devices") or {}
    return sum(d.get("notify_sent", 0) for d in devices.values())


def window_counters(a: dict | None, b: dict | None) -> dict:
    """pyvmm's counters between two snapshots: exits, CPU, drops."""
    if not a or not b:
        return {}
    dt = max(b["seconds"] - a["seconds"], 1e-6)

    def delta(path: tuple) -> float:
        x, y = a, b
        for key in path:
            x, y = (x or {}).get(key), (y or {}).get(key)
        return (y or 0) - (x or 0)

    out = {
        "seconds": dt,
        "kvm_exits": delta(("kvm", "exits")),
        "to_pyvmm": sum(b["exits_to_pyvmm"].values()) - sum(a["exits_to_pyvmm"].values()),
        "vcpu_cpu": delta(("vcpu_thread_cpu_ns",)) / 1e9 / dt * 100,
        "io_cpu": 0.0,
        # Context switches of each thread (voluntary: it blocked or yielded;
        # involuntary: it was preempted).
        "vcpu_vsw": delta(("vcpu_thread_voluntary_switches",)),
        "vcpu_isw": delta(("vcpu_thread_involuntary_switches",)),
    }
    for service in ("shmstream", "solo5_ring"):
        if b.get(service):
            out["io_cpu"] = delta((service, "thread", "cpu_ns")) / 1e9 / dt * 100
            out["wakeups"] = delta((service, "thread", "wakeups"))
            out["kicks"] = delta((service, "thread", "kicks"))
            out["io_vsw"] = delta((service, "thread", "voluntary_switches"))
            out["io_isw"] = delta((service, "thread", "involuntary_switches"))
            out["guest_wakeups"] = notified(b, service) - notified(a, service)
    return out


def ring_drops(stats: dict | None) -> int:
    drops = 0
    shm = (stats or {}).get("shmstream")
    if shm:
        for dev in shm["devices"].values():
            drops += dev["rx_drops_full"] + dev["rx_drops_oversize"] + dev["rx_bad_index"]
    ring = (stats or {}).get("solo5_ring")
    if ring:
        drops += ring["ring"]["read_drops_oversize"] + ring["ring"]["bad_entries"]
    return drops


def run_rx(case: dict, args) -> dict:
    guest_args = [GUEST_IP, str(PORT), "0", str(args.idle_ms)]
    with tempfile.TemporaryDirectory(prefix="pyvmm-pps-") as tmp:
        ns = namespace_with_tap()
        try:
            vm = Tender(ns, case, guest_args, args, tmp)
            a = vm.snapshot()
            cpu_a, tap_a = vm.cpu(), ns.link("tap100")["stats"]
            seconds = case.get("seconds") or args.seconds
            sent_run = ns.run(
                sender_argv(args, case.get("shm", "off"), seconds),
                capture_output=True,
                text=True,
                timeout=seconds + 60,
                preexec_fn=niced(args.sender_nice if args.sender_nice is not None else args.nice),
            )
            if sent_run.returncode != 0:
                raise RuntimeError(f"sender failed: {sent_run.stderr}")
            sent = json.loads(sent_run.stdout)
            time.sleep(0.1)  # the tender drains what the tap still holds
            cpu_b, tap_b = vm.cpu(), ns.link("tap100")["stats"]
            b = vm.snapshot(newer_than=(a or {}).get("seconds", 0) + seconds)
            # A peer tender may be far slower than the flood: give it time to
            # finish, then stop it (its guest's report is then lost).
            out, err, ended = vm.finish(timeout=args.idle_ms / 1000 + seconds + 20)
            stats = vm.final_stats()
        finally:
            ns.close()
    if ended and vm.proc.returncode != 0:
        raise RuntimeError(f"{case['label']}: guest failed ({vm.proc.returncode}): {out}{err}")
    return {
        "case": case_json(case),
        "sent": sent,
        "tap": {k: tap_b[k] - tap_a[k] for k in tap_b},
        "guest": guest_report(out) if ended else {},
        "guest_ended": ended,
        "window": window_counters(a, b),
        "tender_cpu_s": {t: cpu_b.get(t, 0) - cpu_a.get(t, 0) for t in cpu_b},
        "stats": stats,
    }


def summarize_rx(r: dict) -> dict:
    sent, tap, guest, w = r["sent"], r["tap"], r["guest"], r["window"]
    window = max(sent["elapsed_s"], 1e-6)
    offered = sent["sent"] + sent["refused"]
    delivered = tap["tx_packets"]
    if guest:
        frames = int(guest["frames"])
        received = frames / max(int(guest["elapsed_us"]), 1) * 1e6
        errors = int(guest["pattern_errors"])
    else:  # a stopped peer: what the tap handed it is what its guest read
        frames, received, errors = delivered, delivered / window, 0
    s = {
        "mode": r["case"]["label"],
        "offered": offered / window,
        "tap_pps": delivered / window,
        "tap_drops": tap["tx_dropped"] / window,
        "received": received,
        "frames": frames,
        "errors": errors,
        "ring_drops": ring_drops(r["stats"]),
        "lost": 100 * (1 - frames / max(offered, 1)),
        "sender_cpu": sent["cpu_s"] / window * 100,
        # CPU per frame the receiving side counted: the whole tender process
        # (every thread) and, separately, the sender per frame it sent.
        "cpu_us_frame": sum(r["tender_cpu_s"].values()) / max(frames, 1) * 1e6,
        "sender_us_frame": sent["cpu_s"] / max(sent["sent"], 1) * 1e6,
    }
    if w:
        s.update(
            kvm_exits_s=w["kvm_exits"] / w["seconds"],
            to_pyvmm_s=w["to_pyvmm"] / w["seconds"],
            exits_per_kframe=w["kvm_exits"] / max(frames, 1) * 1000,
            vcpu_cpu=w["vcpu_cpu"],
            io_cpu=w["io_cpu"],
            # Per frame, each thread (the cost breakdown's first cut).
            vcpu_us_frame=w["vcpu_cpu"] / 100 * w["seconds"] / max(frames, 1) * 1e6,
            io_us_frame=w["io_cpu"] / 100 * w["seconds"] / max(frames, 1) * 1e6,
        )
        # Switches per 1000 frames, each thread: what a frame costs in switches.
        for key in ("vcpu_vsw", "vcpu_isw", "io_vsw", "io_isw", "guest_wakeups"):
            if key in w:
                s[f"{key}_kframe"] = w[key] / max(frames, 1) * 1000
    else:
        cpu = sum(r["tender_cpu_s"].values())
        s.update(vcpu_cpu=cpu / (window + 0.1) * 100)
    return s


# -- transmit -----------------------------------------------------------------------


def run_tx(case: dict, args) -> dict:
    count = args.tx_count if case.get("shm") not in ("off", None) else args.tx_count // 10
    if case["tender"] == "peer":
        count = max(args.tx_count // args.peer_scale, 100)
    elif case["tender"] == "process":
        count = args.tx_count
    with tempfile.TemporaryDirectory(prefix="pyvmm-pps-") as tmp:
        ns = namespace_with_tap()
        try:
            mac = tap_mac(ns)
            recv = ns.popen(
                [sys.executable, "-m", "testkit.traffic", "--recv", HOST_IP, str(PORT + 1)]
                + ["--idle-ms", "1500", "--seconds", str(args.tx_timeout)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=niced(args.nice),
            )
            if recv.stderr.readline().strip() != "ready":
                raise RuntimeError(f"receiver failed: {recv.communicate()}")
            guest_args = [GUEST_IP, HOST_IP, mac, str(PORT + 1), str(count), str(args.size)]
            case = dict(case, guest=case["tx_guest"])
            tap_a = ns.link("tap100")["stats"]
            vm = Tender(ns, case, guest_args, args, tmp)
            cpu_ready = sum(vm.cpu().values())
            # The guest sends from "ready" on, so some frames may leave before
            # the CPU snapshot: the CPU per frame counts only those after it.
            sent_before_cpu = ns.link("tap100")["stats"]["rx_packets"] - tap_a["rx_packets"]
            a = vm.snapshot()
            t0 = time.monotonic()
            out, err, ended = vm.finish(timeout=args.tx_timeout)
            elapsed = time.monotonic() - t0
            stats = vm.final_stats()
            tap_b = ns.link("tap100")["stats"]
            got, rerr = recv.communicate(timeout=args.tx_timeout + 10)
        finally:
            ns.close()
    if ended and vm.proc.returncode != 0:
        raise RuntimeError(f"{case['label']}: udpsend failed ({vm.proc.returncode}): {out}{err}")
    return {
        "case": case_json(case),
        "count": count,
        "guest": guest_report(out) if ended else {},
        # Why a row has no figures: the guest did not end in --tx-timeout.
        "ended": ended,
        "output_tail": "" if ended else (out + err)[-2000:],
        "tap": {k: tap_b[k] - tap_a[k] for k in tap_b},
        "host": json.loads(got) if got.strip() else {},
        "window": window_counters(a, stats),
        # From "ready" to the process's end: the whole tender, every thread.
        "tender_cpu_s": None if vm.total_cpu_s is None else vm.total_cpu_s - cpu_ready,
        "sent_before_cpu": sent_before_cpu,
        "wall_s": elapsed,
        "stats": stats,
    }


def tx_cpu_us_frame(r: dict, sent: int) -> float | None:
    """The tender's CPU per frame sent after its CPU snapshot, or None where
    that cannot be told: too few frames left after it (a run shorter than
    reading "ready" takes) for the two clocks' disagreement (the scheduler's
    run time at the snapshot, wait4's rusage at the end) to stay small."""
    after = sent - r.get("sent_before_cpu", 0)
    cpu = r.get("tender_cpu_s")
    if cpu is None or after < max(sent // 2, 1) or cpu <= 0:
        return None
    return cpu / after * 1e6


def summarize_tx(r: dict) -> dict:
    guest, host, w, tap = r["guest"], r["host"], r["window"], r["tap"]
    sent = int(guest.get("sent", 0))
    secs = max(int(guest.get("elapsed_us", 0)), 1) / 1e6 if guest else r["wall_s"]
    hsecs = max(host.get("elapsed_s", 0), 1e-6)
    s = {
        "mode": r["case"]["label"],
        "guest_pps": sent / secs if guest else 0.0,
        "tap_pps": tap["rx_packets"] / secs,
        "tap_drops": tap["rx_dropped"],
        "host_pps": host.get("received", 0) / hsecs,
        "host_received": host.get("received", 0),
        "sent": sent,
        "errors": host.get("pattern_errors", 0),
        "lost": 100 * (1 - host.get("received", 0) / max(sent, 1)) if guest else None,
        "cpu_us_frame": tx_cpu_us_frame(r, sent),
    }
    if w:
        s.update(
            kvm_exits_s=w["kvm_exits"] / w["seconds"],
            exits_per_kframe=w["kvm_exits"] / max(sent, 1) * 1000,
            vcpu_cpu=w["vcpu_cpu"],
            io_cpu=w["io_cpu"],
        )
    return s


# -- latency --------------------------------------------------------------------------


def run_latency(case: dict, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="pyvmm-pps-") as tmp:
        ns = namespace_with_tap()
        try:
            case = dict(case, guest=case["lat_guest"])
            vm = Tender(ns, case, [GUEST_IP, str(PORT)], args, tmp, LATENCY_SNAPSHOT_INTERVAL)
            # Idle first: the whole tender's CPU while the guest waits for
            # a request that does not come (hybrid must cost next to nothing).
            time.sleep(0.2)
            idle_a, t_idle = vm.cpu(), time.monotonic()
            time.sleep(args.idle_seconds)
            idle_b, t_idle = vm.cpu(), time.monotonic() - t_idle
            a = vm.snapshot()
            cpu_a, t_busy = vm.cpu(), time.monotonic()
            n = args.lat_count
            if case["tender"] == "peer":
                n = max(n // args.peer_scale, 20)
            done = ns.run(
                [sys.executable, "-m", "testkit.traffic", "--rtt", str(n)]
                + [GUEST_IP, str(PORT), "--size", "64"]
                + ["--interval-us", str(args.lat_interval_us)],
                capture_output=True,
                text=True,
                timeout=n * (args.lat_interval_us / 1e6 + 0.2) + 60,
                preexec_fn=niced(args.nice),
            )
            cpu_b, t_busy = vm.cpu(), time.monotonic() - t_busy
            b = vm.snapshot(newer_than=(a or {}).get("seconds", 0) + 0.05)
            vm.finish(timeout=0.1)
        finally:
            ns.close()
    if done.returncode != 0:
        raise RuntimeError(f"{case['label']}: round trips failed: {done.stderr}")
    rtt = json.loads(done.stdout)
    return {
        "case": case_json(case),
        "rtt_us": rtt["rtt_us"],
        "idle_cpu_s": sum(idle_b.values()) - sum(idle_a.values()),
        "idle_s": t_idle,
        "busy_s": t_busy,
        "window": window_counters(a, b),
        "tender_cpu_s": {t: cpu_b.get(t, 0) - cpu_a.get(t, 0) for t in cpu_b},
    }


def summarize_latency(r: dict) -> dict:
    rtt = np.array([x for x in r["rtt_us"] if x > 0])
    w = r["window"]
    s = {
        "mode": r["case"]["label"],
        "answered": len(rtt),
        "lost": len(r["rtt_us"]) - len(rtt),
        "median_us": float(np.median(rtt)) if len(rtt) else None,
        "p99_us": float(np.percentile(rtt, 99)) if len(rtt) else None,
        "max_us": float(rtt.max()) if len(rtt) else None,
        "idle_cpu": 100 * r["idle_cpu_s"] / max(r["idle_s"], 1e-6),
        "busy_cpu": 100 * sum(r["tender_cpu_s"].values()) / max(r["busy_s"], 1e-6),
    }
    if w:
        s.update(
            kvm_exits_s=w["kvm_exits"] / w["seconds"],
            vcpu_cpu=w["vcpu_cpu"],
            io_cpu=w["io_cpu"],
        )
    return s


# -- rows, repeats, tables -----------------------------------------------------------


def case_json(case: dict) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in case.items()}


def cases(args) -> list[dict]:
    rows = []
    if not args.no_baseline:
        rows.append(
            {
                "label": BASELINE,
                "tender": "process",
                "guest": baseline.build("udpsink"),
                "tx_guest": baseline.build("udpsend"),
                "lat_guest": baseline.build("udpecho"),
            }
        )
    for cpl in args.cpl.split(","):
        suffix = "" if cpl == "auto" else f"/{cpl}"
        for mode in filter(None, args.modes.split(",")):
            if mode not in MODES:
                raise SystemExit(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
            shm = "off" if mode.startswith("off") else mode
            budgets = [int(b) for b in args.budgets.split(",") if b] if shm == "hybrid" else []
            readers = [r for r in args.tap_read.split(",") if r] if shm != "off" else []
            for budget, reader in [(b, r) for b in budgets or [0] for r in readers or [""]]:
                rows.append(
                    {
                        "label": mode
                        + (f"-{budget}us" if budget else "")
                        + (f"-{reader}" if reader else "")
                        + suffix,
                        "tender": "pyvmm",
                        "shm": shm,
                        "tap_read": reader,
                        "cpl": cpl,
                        "py": mode == "off-py",
                        "budget": budget,
                        "guest": args.guest,
                        "tx_guest": GUESTS / "udpsend.hvt",
                        "lat_guest": GUESTS / "udpecho.hvt",
                    }
                )
        if args.solo5:
            rows += solo5_rows(args, cpl, suffix)
        elif args.ring_guest:
            for mode in filter(None, args.ring_modes.split(",")):
                rows += ring_rows(args, mode, suffix, cpl, args.ring_guest)
    for checkout in args.checkout:
        name, _, path = checkout.partition("=")
        launcher = Path(path) / "pyvmm" / "_launcher"
        if not name or not launcher.exists():
            raise SystemExit(f"--checkout {checkout}: give NAME=DIR, DIR a built pyvmm checkout")
        for row in [r for r in rows if r["tender"] == "pyvmm" and not r.get("launcher")]:
            rows.append(dict(row, label=f"{name}:{row['label']}", launcher=str(launcher)))
    if args.solo5:
        rows += solo5_peers(args)
    for peer in args.peer:
        name, _, path = peer.partition("=")
        if not path:
            raise SystemExit(f"--peer {peer}: give NAME=PATH")
        rows.append(
            {
                "label": name,
                "tender": "peer",
                "path": path,
                "guest": args.peer_guest or GUEST,
                "tx_guest": args.peer_tx_guest or GUESTS / "udpsend.hvt",
                "lat_guest": args.peer_lat_guest or GUESTS / "udpecho.hvt",
            }
        )
    return rows


# -- --solo5: one Solo5-API receiver, relinked, unmodified, and under Solo5's tenders --


def solo5_programs() -> solo5_build.Solo5Build:
    """Solo5's build and bench/solo5's programs (scripts/solo5_build.py:
    built now, offline, if they are not), or one line saying why not."""
    try:
        return solo5_build.ensure(log=lambda m: print(f"# solo5-build: {m}", file=sys.stderr))
    except solo5_build.BuildError as err:
        raise SystemExit(f"pps.py: --solo5: {err}") from None


def solo5_rows(args, cpl: str, suffix: str) -> list[dict]:
    """--solo5's pyvmm rows at one --cpl: the relinked receiver in each of
    --modes, the unmodified one over hypercalls and in each shm mode."""
    build = args.solo5_build
    modes = [m for m in args.modes.split(",") if m]
    rows = [
        {
            "label": f"s5pyvmm-{mode}{suffix}",
            "tender": "pyvmm",
            "shm": "off" if mode.startswith("off") else mode,
            "cpl": cpl,
            "py": mode == "off-py",
            "guest": build.app("udpsink", "pyvmm"),
        }
        for mode in modes
    ]
    for shm in ["off", *(m for m in modes if m in SHM_MODES)]:
        rows += ring_rows(args, shm, suffix, cpl, build.app("udpsink", "hvt"))
    return rows


def ring_rows(args, shm: str, suffix: str, cpl: str, guest: Path) -> list[dict]:
    """s5ring rows of one mode: in event and hybrid mode one per
    --ring-kicks value (who serves a kick; `-exit` rows: the vCPU thread)."""
    kicks = [k for k in args.ring_kicks.split(",") if k] if shm in ("event", "hybrid") else []
    return [
        {
            "label": f"s5ring-{shm}" + (f"-{k}" if k and k != "thread" else "") + suffix,
            "tender": "pyvmm",
            "shm": shm,
            "cpl": cpl,
            "kicks": k,
            "guest": guest,
        }
        for k in kicks or [""]
    ]


def solo5_peers(args) -> list[dict]:
    """--solo5's rows under Solo5's own tenders: solo5-spt with the spt
    link; solo5-hvt with the unmodified binary, for --solo5-hvt-seconds."""
    build = args.solo5_build
    rows = [
        {
            "label": "solo5-spt",
            "tender": "peer",
            "path": str(build.solo5_spt),
            "guest": build.app("udpsink", "spt"),
        }
    ]
    if args.solo5_hvt_seconds > 0:
        rows.append(
            {
                "label": "solo5-hvt",
                "tender": "peer",
                "path": str(build.solo5_hvt),
                "guest": build.app("udpsink", "hvt"),
                "seconds": args.solo5_hvt_seconds,
            }
        )
    return rows


#: The relinked receiver's share of pyvmm's own, Solo5's ring's multiple of
#: solo5-hvt, a hybrid row's share of its family's best mode (the goals).
RELINKED_TARGET, RING_OVER_HVT_TARGET, HYBRID_TARGET = 0.9, 20.0, 0.8


def paired_ratio(a: list, b: list) -> tuple[float, float, float] | None:
    """a over b per repeat (rows of one repeat ran back to back, on the same
    machine): the median, lowest and highest ratio; None if no pair."""
    ratios = [x / y for x, y in zip(a, b, strict=False) if x and y]
    if not ratios:
        return None
    return float(np.median(ratios)), min(ratios), max(ratios)


def solo5_ratios(rates: dict[str, list]) -> list[str]:
    """The comparisons --solo5 is for, one line each, from each row's
    received pps per repeat (``rates``: label -> one value per repeat)."""
    lines = []

    def line(what: str, ratio: tuple | None, target: float, goal: str) -> None:
        if ratio is None:
            return
        med, low, high = ratio
        verdict = "ok" if med >= target else "below"
        lines.append(f"{what}: {med:.2f}x (per repeat {low:.2f}-{high:.2f}; {goal}: {verdict})")

    for label in rates:
        own = label.removeprefix("s5pyvmm-")
        if label.startswith("s5pyvmm-") and own in rates:
            line(
                f"relinked {label} over {own}",
                paired_ratio(rates[label], rates[own]),
                RELINKED_TARGET,
                f"target >= {RELINKED_TARGET}x",
            )
    for label in rates:
        if label.startswith("s5ring-") and "solo5-hvt" in rates:
            line(
                f"unmodified {label} over solo5-hvt",
                paired_ratio(rates[label], rates["solo5-hvt"]),
                RING_OVER_HVT_TARGET,
                f"target >= {RING_OVER_HVT_TARGET:.0f}x",
            )
    for family in ("", "s5pyvmm-", "s5ring-"):
        modes = {m: rates[family + m] for m in SHM_MODES if family + m in rates}
        if "hybrid" not in modes or len(modes) < 2:
            continue
        best = max(modes, key=lambda m: median_spread(modes[m])[0] or 0)
        line(
            f"{family}hybrid over the best mode, {family}{best}",
            paired_ratio(modes["hybrid"], modes[best]),
            HYBRID_TARGET,
            f"target within {100 - HYBRID_TARGET * 100:.0f}%",
        )
    return lines


def median_spread(values: list) -> tuple[float | None, float | None]:
    vals = np.array([v for v in values if v is not None], dtype=float)
    if not len(vals):
        return None, None
    med = float(np.median(vals))
    return med, float(vals.max() - vals.min())


def aggregate(summaries: list[dict]) -> dict:
    """Median and spread (max - min) of every numeric field over repeats."""
    out = {"mode": summaries[0]["mode"], "repeats": len(summaries)}
    keys = {k for s in summaries for k in s if k != "mode"}
    for k in sorted(keys):
        med, spread = median_spread([s.get(k) for s in summaries])
        out[k] = med
        out[k + "_spread"] = spread
    return out


def add_ratios(summaries: dict[str, list[dict]], key: str) -> None:
    """Each run's ``key`` over the baseline process's in the same repeat
    (rows run interleaved, so a repeat's rows saw the same machine), as
    ``ratio``; per-frame CPU likewise as ``cpu_ratio``."""
    base = summaries.get(BASELINE)
    if not base:
        return
    for runs in summaries.values():
        for i, s in enumerate(runs):
            b = base[min(i, len(base) - 1)]
            if s.get(key) is not None and b.get(key):
                s["ratio"] = s[key] / b[key]
            if s.get("cpu_us_frame") is not None and b.get("cpu_us_frame"):
                s["cpu_ratio"] = s["cpu_us_frame"] / b["cpu_us_frame"]


def fmt(v, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}{spec}}"


RX_COLUMNS = [  # (header, key, format)
    ("offered pps", "offered", ".0f"),
    ("tap pps", "tap_pps", ".0f"),
    ("tap drop/s", "tap_drops", ".0f"),
    ("rx pps", "received", ".0f"),
    ("rx ±%", "received_pct", ".1f"),
    ("ratio", "ratio", ".2f"),
    ("CPU us/fr", "cpu_us_frame", ".2f"),
    ("CPU ratio", "cpu_ratio", ".2f"),
    ("sender us/fr", "sender_us_frame", ".2f"),
    ("frames", "frames", ".0f"),
    ("errors", "errors", ".0f"),
    ("KVM exits/s", "kvm_exits_s", ".0f"),
    ("exits/1k fr", "exits_per_kframe", ".1f"),
    ("to pyvmm/s", "to_pyvmm_s", ".0f"),
    ("ring drops", "ring_drops", ".0f"),
    ("lost %", "lost", ".1f"),
    ("vCPU %", "vcpu_cpu", ".0f"),
    ("IO %", "io_cpu", ".0f"),
    ("vCPU us/fr", "vcpu_us_frame", ".2f"),
    ("IO us/fr", "io_us_frame", ".2f"),
    ("vCPU vsw/1k", "vcpu_vsw_kframe", ".1f"),
    ("vCPU isw/1k", "vcpu_isw_kframe", ".1f"),
    ("IO vsw/1k", "io_vsw_kframe", ".1f"),
    ("IO isw/1k", "io_isw_kframe", ".1f"),
    ("wakes/1k", "guest_wakeups_kframe", ".1f"),
    ("sender %", "sender_cpu", ".0f"),
    ("runs", "repeats", ".0f"),
]
TX_COLUMNS = [
    ("guest tx pps", "guest_pps", ".0f"),
    ("ratio", "ratio", ".2f"),
    ("CPU us/fr", "cpu_us_frame", ".2f"),
    ("CPU ratio", "cpu_ratio", ".2f"),
    ("tap pps", "tap_pps", ".0f"),
    ("host rx pps", "host_pps", ".0f"),
    ("sent", "sent", ".0f"),
    ("host rx", "host_received", ".0f"),
    ("errors", "errors", ".0f"),
    ("lost %", "lost", ".1f"),
    ("KVM exits/s", "kvm_exits_s", ".0f"),
    ("exits/1k fr", "exits_per_kframe", ".1f"),
    ("vCPU %", "vcpu_cpu", ".0f"),
    ("IO %", "io_cpu", ".0f"),
    ("runs", "repeats", ".0f"),
]
LAT_COLUMNS = [
    ("median us", "median_us", ".1f"),
    ("p99 us", "p99_us", ".1f"),
    ("max us", "max_us", ".1f"),
    ("lost", "lost", ".0f"),
    ("KVM exits/s", "kvm_exits_s", ".0f"),
    ("vCPU %", "vcpu_cpu", ".0f"),
    ("IO %", "io_cpu", ".0f"),
    ("tender %", "busy_cpu", ".1f"),
    ("idle %", "idle_cpu", ".2f"),
    ("runs", "repeats", ".0f"),
]


def print_table(rows: list[dict], columns: list) -> None:
    width = max([18] + [len(r["mode"]) + 1 for r in rows])
    print(f"{'mode':<{width}}" + "".join(f" {h:>{max(len(h), 6)}}" for h, _, _ in columns))
    for r in rows:
        line = f"{r['mode']:<{width}}"
        for h, key, spec in columns:
            line += " " + fmt(r.get(key), spec, max(len(h), 6))
        print(line, flush=True)


SUMMARIZERS = {"rx": summarize_rx, "tx": summarize_tx, "latency": summarize_latency}


def redraw(json_path: Path) -> int:
    """Draw the chart of a saved run again (beside it, as .png), measuring nothing."""
    try:
        raw = json.loads(json_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        print(f"pps.py: --redraw {json_path}: {err}", file=sys.stderr)
        return 1
    if not isinstance(raw, dict) or not isinstance(raw.get("summary"), dict):
        print(f"pps.py: --redraw {json_path}: not a bench/pps.py result", file=sys.stderr)
        return 1
    png = json_path.with_suffix(".png")
    note = pps_chart.chart(png, raw, SUMMARIZERS)
    if note:
        print(f"pps.py: --redraw {json_path}: {note}", file=sys.stderr)
        return 1
    print(f"# chart: {png}")
    return 0


def machine() -> dict:
    from pyvmm.kvm.system import kvm_flavour

    model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        model = m.group(1) if m else model
    return {
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "kvm": kvm_flavour(),
        "loadavg": os.getloadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="traffic per row")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (median, spread)")
    parser.add_argument("--size", type=int, default=1300, help="UDP payload bytes")
    parser.add_argument("--rate", type=int, default=0, help="offered datagrams/s (0: max)")
    parser.add_argument("--idle-ms", type=int, default=1500, help="udpsink's idle timeout")
    parser.add_argument(
        "--pin",
        nargs="?",
        const="apart",
        choices=sorted(PLACEMENTS),
        help="apart (the default with --pin): vCPU and sender on CPU 0, IO on 1; "
        "same: vCPU and IO on CPU 1, sender on 0",
    )
    parser.add_argument("--no-sandbox", action="store_true", help="pyvmm --no-sandbox")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help=f"no `{BASELINE}` row (the guest programs as a plain process on the tap)",
    )
    parser.add_argument("--slots", type=int, default=0, help="--shm-slots (0: default)")
    parser.add_argument(
        "--tap-read",
        default="",
        help="shm rows once per --tap-read value, e.g. readv,uring (rows MODE-READER)",
    )
    parser.add_argument("--budget", type=int, default=0, help="--hybrid-budget in us (0: default)")
    parser.add_argument(
        "--budgets",
        default="",
        help="a hybrid row per --hybrid-budget in this list (e.g. 20,50,200,1000: the sweep)",
    )
    parser.add_argument("--guest", type=Path, default=GUEST, help="receiving program")
    parser.add_argument("--cpl", default="auto", help="--cpl values to run each mode at")
    parser.add_argument(
        "--ring-guest",
        default="",
        help="a receiver linked with Solo5's own bindings (rows s5ring-MODE; default none: "
        "--solo5 builds one)",
    )
    parser.add_argument(
        "--ring-modes",
        default="event",
        help="s5ring rows' modes (poll, event, hybrid; default event: with poll a Solo5 "
        "ring guest receives ~1%% as much, docs/modes.md)",
    )
    parser.add_argument(
        "--ring-kicks",
        default="thread",
        help="s5ring rows in event and hybrid mode: a row per --net-ring-kicks value in this "
        "list (thread, exit; `-exit` rows)",
    )
    parser.add_argument(
        "--solo5",
        action="store_true",
        help="add the Solo5-API receiver's rows (relinked s5pyvmm-MODE, unmodified s5ring-MODE, "
        "solo5-spt, solo5-hvt), built by scripts/solo5_build.py",
    )
    parser.add_argument(
        "--solo5-hvt-seconds",
        type=float,
        default=1.0,
        help="--solo5: the solo5-hvt row's traffic (its guest is emulated on kvm_pvm; 0: no row)",
    )
    parser.add_argument(
        "--checkout",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run every pyvmm row with the pyvmm checkout in DIR (its own launcher)",
    )
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--peer-guest", type=Path, help="the peer's receiving guest")
    parser.add_argument("--peer-tx-guest", type=Path, help="the peer's sending guest")
    parser.add_argument("--peer-lat-guest", type=Path, help="the peer's echo guest")
    parser.add_argument(
        "--peer-scale",
        type=int,
        default=100,
        help="a peer's transmit and latency runs get COUNT / this (a CPL 0 guest is "
        "emulated on kvm_pvm hosts, ~1000x slower)",
    )
    parser.add_argument("--sender", choices=("packet", "udp"), default="packet")
    parser.add_argument("--batch", type=int, default=32, help="sender: datagrams per sendmmsg")
    parser.add_argument("--sockets", type=int, default=1, help="sender udp: sockets")
    parser.add_argument("--sndbuf", type=int, default=8 << 20, help="sender: socket buffer")
    parser.add_argument("--sender-cpu", type=int, default=-1, help="pin the sender")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the tender and the sender at this nice value (e.g. -10 on a machine others load)",
    )
    parser.add_argument("--sender-nice", type=int, help="the sender's own (default: --nice)")
    parser.add_argument("--no-tx", action="store_true", help="skip the transmit table")
    parser.add_argument("--tx-count", type=int, default=300000, help="udpsend datagrams")
    parser.add_argument("--tx-timeout", type=float, default=30.0, help="udpsend's run at most")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency table")
    parser.add_argument("--lat-count", type=int, default=1000)
    parser.add_argument("--lat-interval-us", type=int, default=1000)
    parser.add_argument(
        "--idle-seconds", type=float, default=1.0, help="latency rows: idle CPU window first"
    )
    parser.add_argument("--out", default="/tmp/pyvmm-pps", help="PREFIX for .json and .png")
    parser.add_argument("--no-chart", action="store_true", help="JSON only, no PNG")
    parser.add_argument("--quick", action="store_true", help="short runs, under a minute")
    parser.add_argument("--json", action="store_true", help="also print the raw JSON")
    parser.add_argument(
        "--redraw",
        type=Path,
        metavar="JSON",
        help="measure nothing: draw the chart of a saved run's JSON again, beside it as .png",
    )
    args = parser.parse_args()
    if args.redraw:
        return redraw(args.redraw)
    if args.quick:
        args.seconds = min(args.seconds, 1.0)
        args.repeat = 1
        args.idle_ms = min(args.idle_ms, 300)
        args.tx_count = min(args.tx_count, 30000)
        args.lat_count = min(args.lat_count, 100)
        args.idle_seconds = min(args.idle_seconds, 0.5)
    args.ring_guest = Path(args.ring_guest) if args.ring_guest else None
    if args.solo5 and args.ring_guest:
        raise SystemExit("pps.py: --solo5 builds the s5ring rows' receiver: give no --ring-guest")
    args.solo5_build = solo5_programs() if args.solo5 else None
    rows = cases(args)
    host = machine()
    title = (
        f"{host['arch']}, {host['cpus']} CPUs ({host['cpu_model']}), kernel {host['kernel']}, "
        f"KVM {host['kvm']}, load {host['loadavg'][0]:.2f}; {args.size}-byte UDP payloads, "
        f"{args.seconds:g} s per row, {args.repeat} runs, median; sender {args.sender}, "
        f"offered {'max' if not args.rate else args.rate} pps"
        + (f", pinned {args.pin}" if args.pin else "")
    )
    print(f"# {title}; {time.strftime('%Y-%m-%d %H:%M')}")
    if args.guest != GUEST:
        print(f"# guest: {args.guest}")
    if args.ring_guest:
        print(f"# s5ring rows: {args.ring_guest} (Solo5's ring I/O served by the IO thread)")
    if args.solo5_build:
        apps = args.solo5_build.apps
        print(
            f"# s5pyvmm rows: {apps}/udpsink-pyvmm.hvt (-z solo5-abi=pyvmm); s5ring rows: "
            f"{apps}/udpsink-solo5.hvt (-z solo5-abi=hvt), one bench/solo5/udpsink.c object"
        )
    for r in rows:
        if r["tender"] == "peer":
            print(f"# {r['label']}: {r['path']} with {r['guest']}")
    raw: dict = {"machine": host, "args": {k: str(v) for k, v in vars(args).items()}}
    raw["started"] = time.strftime("%Y-%m-%dT%H:%M:%S")

    def repeated(
        kind: str, run, summarize, selected: list[dict], ratio_of: str | None = None
    ) -> list[dict]:
        runs: dict[str, list] = {r["label"]: [] for r in selected}
        for rep in range(args.repeat):
            # Each repeat starts further down the list, so no row always
            # runs first (or right after the same neighbour).
            start = rep * len(selected) // args.repeat
            for case in selected[start:] + selected[:start]:
                try:
                    runs[case["label"]].append(run(case, args))
                except RuntimeError as err:
                    print(f"# {case['label']}: {err}", file=sys.stderr)
        raw[kind] = runs
        summaries = {label: [summarize(x) for x in got] for label, got in runs.items() if got}
        if ratio_of:
            add_ratios(summaries, ratio_of)
        return [aggregate(each) for each in summaries.values()]

    print("\n## receive")
    rx = repeated("rx", run_rx, summarize_rx, rows, ratio_of="received")
    for r in rx:
        med = r.get("received") or 0
        r["received_pct"] = 100 * (r.get("received_spread") or 0) / med if med else None
    print_table(rx, RX_COLUMNS)
    top = max((r for r in rx if r.get("received")), key=lambda r: r["received"], default=None)
    if top and not args.rate:
        best, offered = top["received"], top["offered"]
        lowest = min(r["offered"] for r in rx if r.get("offered"))
        verdict = "ok" if offered >= 2 * best else "NOT 2x: the sender may have limited it"
        print(
            f"# sender: the best row ({top['mode']}, {best:.0f} pps received) was offered "
            f"{offered:.0f} pps, {offered / best:.1f}x ({verdict}); lowest offered in any row "
            f"{lowest:.0f} pps"
        )
    if args.solo5:
        rates = {k: [summarize_rx(x)["received"] for x in got] for k, got in raw["rx"].items()}
        raw["solo5_ratios"] = solo5_ratios(rates)
        for line in raw["solo5_ratios"]:
            print(f"# {line}")
    tx_rows = [r for r in rows if "tx_guest" in r]
    tx = []
    if not args.no_tx and tx_rows:
        print("\n## transmit")
        tx = repeated("tx", run_tx, summarize_tx, tx_rows, ratio_of="guest_pps")
        print_table(tx, TX_COLUMNS)
    lat = []
    if not args.no_latency and tx_rows:
        print(
            f"\n## latency: {args.lat_count} round trips of 64 bytes, one every "
            f"{args.lat_interval_us} us"
        )
        lat = repeated("latency", run_latency, summarize_latency, tx_rows)
        print_table(lat, LAT_COLUMNS)
    raw["summary"] = {"rx": rx, "tx": tx, "latency": lat}
    raw["loadavg_end"] = os.getloadavg()
    raw["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"\n# load average at the end: {' '.join(f'{x:.2f}' for x in raw['loadavg_end'])}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(raw) + "\n")
    note = "not asked for (--no-chart)"
    if not args.no_chart:
        note = pps_chart.chart(Path(f"{out}.png"), raw, SUMMARIZERS)
    print(f"\n# raw numbers: {out}.json; chart: {note or f'{out}.png'}")
    if args.json:
        print(json.dumps(raw))
    # A row none of whose runs worked fails the benchmark (the reason is on stderr).
    failed = [
        label
        for kind in ("rx", "tx", "latency")
        for label, got in raw.get(kind, {}).items()
        if not got
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
