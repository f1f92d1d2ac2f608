"""Density: N idle guests at once, what each costs in memory and start time.

    python3 bench/density.py [-n 100] [--mem 64] [--guest udpsink]
                             [--shm event] [--no-sharing] [--launcher SOCK]
                             [--breakdown 3] [--json FILE]

Creates one network namespace (testkit.netns) with a tap per guest, starts
the guests one after another with the cold command line (``python3 -m
pyvmm``, as a user would), each idle after boot (udpsink waiting for its
first datagram: no CPU), then reports:

- start latency per guest: from spawn to the guest's first output line
  (its boot is done and its code runs), median and p90;
- RSS and PSS per guest from /proc/PID/smaps_rollup (PSS divides each page
  by the processes mapping it: the interpreter's and libraries' file pages,
  and with image sharing the unikernel's, are shared), median and p90;
- host memory used: MemAvailable before the first start minus with all
  running;
- the idle CPU of all guests over a few seconds;
- for ``--breakdown`` guests, PSS per kind of mapping (guest memory,
  interpreter heap, pyvmm's cffi extension, libpython, libc and the other
  libraries, thread stacks, malloc arenas).

Then stops every guest (SIGTERM), removes the taps and the namespace, and
checks that nothing is left: no guest process, no tap, no namespace. A
failure or Ctrl-C on the way cleans up the same way.

``--no-sharing`` sets PYVMM_IMAGE_SHARING=0 (every image copied into
anonymous memory, as before image sharing) for a before/after comparison.
``--launcher`` starts a warm launcher (``pyvmm serve --api-sock``, inside
the namespace, so its children see the taps) and creates each guest with
``POST /vms``: latency is then from the request to the 201 answer (the
guest about to run its first instruction), with the launcher's own figure
(request -> first KVM_RUN) beside it; the VMs are the launcher's children,
their PSS is measured the same way, the launcher's own reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit import smaps  # noqa: E402
from testkit.netns import NetNamespace  # noqa: E402

GUESTS = ROOT / "guests" / "bin"
# The pyvmm command as scripts/setup installs it (the native launcher: no
# site start-up files, docs/startup.md), else the interpreter.
_LAUNCHER = ROOT / "pyvmm" / "_launcher"
PYVMM = [str(_LAUNCHER)] if os.access(_LAUNCHER, os.X_OK) else [sys.executable, "-m", "pyvmm"]
GUEST_IP, PORT = "10.0.0.2", "5000"
START_WITHIN = 60.0  # seconds for one guest's first line, on a loaded machine


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def cpu_ticks(pid: int) -> int:
    """utime + stime of every thread of ``pid``, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Guest:
    """One idle guest's process: started by the command line (``proc``) or
    by the launcher (``vm``, its API record)."""

    def __init__(self, pid: int, latency: float, proc: subprocess.Popen | None = None) -> None:
        self.pid = pid
        self.latency = latency
        self.proc = proc
        self.vm: dict = {}

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{self.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def wait_first_line(proc: subprocess.Popen, spawned: float) -> None:
    """Until the guest's first output line: its boot is done, its code runs."""
    out = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in out:
            left = spawned + START_WITHIN - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError(f"guest {proc.pid}: no output in {START_WITHIN} s")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                err = proc.stderr.read().decode(errors="replace")
                raise RuntimeError(f"guest {proc.pid} ended: {out!r} {err}")
            out += chunk


def guest_argv(index: int, args: argparse.Namespace) -> list[str]:
    return [
        "--mem",
        str(args.mem),
        f"--shm={args.shm}",
        f"--net=tap{index}",
        str(GUESTS / f"{args.guest}.hvt"),
        GUEST_IP,
        PORT,
    ]


def start(ns: NetNamespace, index: int, args: argparse.Namespace, env: dict[str, str]) -> Guest:
    """A cold command-line guest on its own new tap."""
    ns.add_tap(f"tap{index}", address=None)
    argv = [*PYVMM, *guest_argv(index, args)]
    spawned = time.monotonic()
    proc = ns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    wait_first_line(proc, spawned)
    return Guest(proc.pid, time.monotonic() - spawned, proc)


class Launcher:
    """``pyvmm serve`` inside the namespace, on a socket in a private directory."""

    def __init__(self, ns: NetNamespace, env: dict[str, str], instances: int) -> None:
        from pyvmm.serve.client import ClientError, call

        self.call = call
        self.dir = tempfile.mkdtemp(prefix="pyvmm-density-")
        self.sock = os.path.join(self.dir, "api.sock")
        argv = [*PYVMM, "serve", "--api-sock", self.sock, f"--max-vms={max(instances, 64)}"]
        self.proc: subprocess.Popen | None = None
        try:
            self.proc = ns.popen(argv, stdout=subprocess.DEVNULL, env=env)
            deadline = time.monotonic() + START_WITHIN
            while True:
                try:
                    if call(self.sock, "GET", "/")[0] == 200:
                        return
                except ClientError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise RuntimeError("pyvmm serve did not start") from None
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise

    def start(self, ns: NetNamespace, index: int, args: argparse.Namespace) -> Guest:
        ns.add_tap(f"tap{index}", address=None)
        body = {"argv": guest_argv(index, args), "cwd": str(ROOT), "stdout": os.devnull}
        t0 = time.monotonic()
        status, vm = self.call(self.sock, "POST", "/vms", body)
        latency = time.monotonic() - t0
        if status != 201:
            raise RuntimeError(f"POST /vms: {status} {vm}")
        guest = Guest(vm["pid"], latency)
        guest.vm = vm
        return guest

    def close(self) -> None:
        """SIGTERM: the launcher stops every VM, waits for them, exits."""
        if self.proc is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def classify(m: smaps.Mapping, guest_ranges: list[tuple[int, int]], image: str) -> str:
    """The kind of one mapping, for the PSS breakdown."""
    if any(lo <= m.start < hi for lo, hi in guest_ranges):
        return "guest memory: image pages (file)" if m.path == image else "guest memory: anonymous"
    path = m.path
    if path == "[heap]":
        return "interpreter heap ([heap], brk)"
    if path == "[stack]":
        return "main thread stack"
    if "_native" in path:
        return "pyvmm cffi extension (_native)"
    if "libpython" in path or path.endswith("/python3") or "/python3." in path.split("/")[-1]:
        return "python binary / libpython"
    if path.endswith(".so") or ".so." in path:
        return "libc and other libraries"
    if path.startswith("/") and path.endswith((".pyc", ".py")):
        return "python files"
    if path.startswith("["):
        return f"kernel ({path})"
    if path.startswith("/"):
        return "other files"
    if m.size in (8 * 1024 * 1024, 8 * 1024 * 1024 + 4096) or m.perms == "---p":
        return "thread stacks and guard pages"
    if m.size >= 16 * 1024 * 1024:
        return "malloc arenas (thread heaps)"
    return "anonymous (Python objects, cffi, rings' host side)"


def breakdown(pid: int, mem_bytes: int, image: str) -> dict[str, dict[str, int]]:
    maps = smaps.read(pid)
    guest = smaps.guest_memory(maps, mem_bytes)
    if not guest:
        print(f"  guest {pid}: guest memory not found in smaps", file=sys.stderr)
    kinds: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for m in maps:
        k = kinds[classify(m, guest, image)]
        for key in ("Pss", "Rss", "Private_Dirty", "AnonHugePages"):
            k[key] += m[key]
    return {k: dict(v) for k, v in kinds.items()}


def stats(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(np.median(a)), float(np.percentile(a, 90))


def leftovers(ns: NetNamespace, guests: list[Guest]) -> list[str]:
    left = [f"pid {g.pid}" for g in guests if g.alive()]
    if ns.exists():
        left.append(f"namespace {ns.name}")
    return left


def stop_all(guests: list[Guest]) -> list[int]:
    """SIGTERM to every command-line guest; their exit statuses."""
    cold = [g.proc for g in guests if g.proc is not None]
    for proc in cold:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in cold:
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    return [proc.returncode for proc in cold]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--instances", type=int, default=100)
    ap.add_argument("--mem", type=int, default=64, help="guest memory in MiB (default 64)")
    ap.add_argument("--guest", default="udpsink", help="an idle net guest taking IP PORT")
    ap.add_argument("--shm", default="event", choices=["off", "poll", "event", "hybrid"])
    ap.add_argument("--no-sharing", action="store_true", help="PYVMM_IMAGE_SHARING=0")
    ap.add_argument("--launcher", action="store_true", help="through pyvmm serve")
    ap.add_argument("--breakdown", type=int, default=3, help="guests whose smaps to break down")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds idle before measuring")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    if os.geteuid() != 0:
        ap.error("needs root (a network namespace with taps, /dev/kvm)")

    env = dict(os.environ)
    if args.no_sharing:
        env["PYVMM_IMAGE_SHARING"] = "0"
    image = os.path.realpath(GUESTS / f"{args.guest}.hvt")
    # A stop signal becomes KeyboardInterrupt: the same clean-up path. Only
    # here: a child forked by pyroute2 that gets it must just end (running
    # the clean-up there would remove the namespace under this process).
    main_pid = os.getpid()

    def stop(signum: int, _frame: object) -> None:
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)

    guests: list[Guest] = []
    ns = NetNamespace(prefix="pyvmmdens")
    launcher: Launcher | None = None
    result: dict = {}
    statuses: list[int] = []
    try:
        ns.create()
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")
        avail_before = mem_available_kib()
        if args.launcher:
            launcher = Launcher(ns, env, args.instances)
        t0 = time.monotonic()
        for i in range(args.instances):
            if launcher is not None:
                guests.append(launcher.start(ns, i, args))
            else:
                guests.append(start(ns, i, args, env))
            if (i + 1) % 10 == 0:
                print(f"  {i + 1} guests up", file=sys.stderr)
        wall = time.monotonic() - t0
        time.sleep(args.settle)
        dead = [g.pid for g in guests if not g.alive()]
        if dead:
            raise RuntimeError(f"guests ended while idle: {dead}")
        ticks0 = [cpu_ticks(g.pid) for g in guests]
        window = 5.0
        time.sleep(window)
        idle_cpu = sum(cpu_ticks(g.pid) - t for g, t in zip(guests, ticks0, strict=True))
        idle_cpu_pct = 100.0 * idle_cpu / os.sysconf("SC_CLK_TCK") / window
        rollups = [smaps.rollup(g.pid) for g in guests]
        launcher_rollup = smaps.rollup(launcher.proc.pid) if launcher else {}
        avail_after = mem_available_kib()
        parts = [breakdown(g.pid, args.mem << 20, image) for g in guests[: args.breakdown]]
        result = {
            "command": " ".join(sys.argv),
            "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.1f}",
            "instances": args.instances,
            "mem_mib": args.mem,
            "sharing": not args.no_sharing,
            "launcher": args.launcher,
            "start_latency_ms": [round(g.latency * 1000, 1) for g in guests],
            "launcher_latency_ms": [
                round(g.vm["start_latency_us"] / 1000, 2) for g in guests if g.vm
            ],
            "launcher_pss_kib": launcher_rollup.get("Pss", 0),
            "start_wall_s": round(wall, 2),
            "rss_kib": [r.get("Rss", 0) for r in rollups],
            "pss_kib": [r.get("Pss", 0) for r in rollups],
            "pss_anon_kib": [r.get("Pss_Anon", 0) for r in rollups],
            "pss_file_kib": [r.get("Pss_File", 0) for r in rollups],
            "host_used_kib": avail_before - avail_after,
            "idle_cpu_pct_all": round(idle_cpu_pct, 2),
            "breakdown": parts,
        }
    except KeyboardInterrupt:
        print("interrupted: stopping every guest", file=sys.stderr)
    finally:
        statuses = stop_all(guests)
        if launcher is not None:
            launcher.close()
            statuses.append(launcher.proc.returncode)
        ns.close()
        left = leftovers(ns, guests)
    if left:
        print(f"LEFT BEHIND: {', '.join(left)}", file=sys.stderr)
        return 1
    if not result:
        return 1
    result["stop_statuses"] = sorted(set(statuses))
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def report(r: dict) -> None:
    n = r["instances"]
    print(f"\n{r['command']}\n{r['machine']}")
    how = "through pyvmm serve" if r["launcher"] else "cold command line"
    print(
        f"{n} guests ({how}), --mem {r['mem_mib']}, image sharing "
        f"{'on' if r['sharing'] else 'off'}; started in {r['start_wall_s']} s one after another\n"
    )
    first = "request -> 201 created" if r["launcher"] else "spawn -> first guest line"
    rows = [(f"start latency (ms, {first})", r["start_latency_ms"], 1)]
    if r["launcher_latency_ms"]:
        rows.append(("  launcher's: request -> first KVM_RUN (ms)", r["launcher_latency_ms"], 1))
    rows += [
        ("RSS per guest (MiB)", r["rss_kib"], 1 / 1024),
        ("PSS per guest (MiB)", r["pss_kib"], 1 / 1024),
        ("  of which anonymous (MiB)", r["pss_anon_kib"], 1 / 1024),
        ("  of which file-backed (MiB)", r["pss_file_kib"], 1 / 1024),
    ]
    print(f"{'':48} {'median':>9} {'p90':>9}")
    for name, values, scale in rows:
        med, p90 = stats([v * scale for v in values])
        print(f"{name:48} {med:9.2f} {p90:9.2f}")
    print(f"{'host memory used (MiB, MemAvailable drop)':48} {r['host_used_kib'] / 1024:9.1f}")
    print(f"{'  per guest (MiB)':48} {r['host_used_kib'] / 1024 / n:9.2f}")
    print(f"{'idle CPU of all guests (% of one core)':48} {r['idle_cpu_pct_all']:9.2f}")
    if r["launcher"]:
        print(f"{'the launcher process itself, PSS (MiB)':48} {r['launcher_pss_kib'] / 1024:9.2f}")
    print(f"stop: exit statuses {r['stop_statuses']}; nothing left behind\n")
    if r["breakdown"]:
        kinds = sorted(
            {k for b in r["breakdown"] for k in b},
            key=lambda k: -r["breakdown"][0].get(k, {}).get("Pss", 0),
        )
        head = f"PSS breakdown (KiB, median of {len(r['breakdown'])} guests)"
        print(f"{head:46} {'Pss':>7} {'Rss':>8} {'PrivDirty':>10} {'AnonHuge':>9}")
        for k in kinds:
            vals = {
                key: stats([b.get(k, {}).get(key, 0) for b in r["breakdown"]])[0]
                for key in ("Pss", "Rss", "Private_Dirty", "AnonHugePages")
            }
            print(
                f"  {k:44} {vals['Pss']:7.0f} {vals['Rss']:8.0f}"
                f" {vals['Private_Dirty']:10.0f} {vals['AnonHugePages']:9.0f}"
            )


if __name__ == "__main__":
    sys.exit(main())
