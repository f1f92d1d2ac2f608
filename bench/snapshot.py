"""Snapshots and templates: what a snapshot costs, how fast a restore
starts, and what a clone of a template costs in memory, beside a boot.

    python3 bench/snapshot.py [--runs 10] [--clones 100] [--mem 16] [--json FILE]

One run, one warm launcher (``pyvmm serve``, started here with room for
every VM), the guest guests/bigsink_idle.c (4 MiB of read-only table read
at boot, 256 KiB of heap written at boot, then it waits):

- snapshot: ``POST /vms/ID/snapshot`` of a booted guest in its first
  wait, --runs times: the launcher's time from the request to the files
  synced, the pages written, the memory file's apparent size and its
  blocks on disk;
- restore to the guest's first instruction, --runs times each, rows
  interleaved: cold ``pyvmm --trace --restore=DIR`` (from the snapshot's
  opening, and from the interpreter's start), through the launcher with a
  fork per request and from a pool of one (request's first byte -> right
  before the first KVM_RUN, the launcher's own figure), and beside them
  the same guest booted from scratch the same three ways;
- memory: --clones clones of one template restored through the launcher
  and --clones guests of the same image booted through it, all idle at
  once in their first wait: PSS and private memory per process
  (/proc/PID/smaps_rollup), the host's MemAvailable spent per guest, and
  one clone's PSS by kind of mapping.

Everything it starts is stopped and its directory removed on every exit
(an error, Ctrl-C, SIGTERM). No network: the guest has no net device.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
KERNEL = ROOT / "guests" / "bin" / "bigsink_idle.hvt"
PYVMM = [sys.executable, "-m", "pyvmm"]
HEAP_KIB = "256"
#: The first wait of an idle guest (ms): longer than the bench.
IDLE_MS = "3600000"

from pyvmm.serve.client import call  # noqa: E402
from testkit import smaps  # noqa: E402


class Stop(Exception):
    """SIGTERM: cleaned up as Ctrl-C is."""


def stats(values: list[float]) -> dict[str, float]:
    arr = np.array(values, dtype=float)
    return {"median": float(np.median(arr)), "p90": float(np.percentile(arr, 90))}


class Launcher:
    """``pyvmm serve`` on a socket in ``tmp``, every VM it starts known."""

    def __init__(self, tmp: Path, max_vms: int) -> None:
        self.path = str(tmp / "api.sock")
        self.log = open(tmp / "launcher.err", "w")
        self.proc = subprocess.Popen(
            [*PYVMM, "serve", "--api-sock", self.path, f"--max-vms={max_vms}"],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            cwd=ROOT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if call(self.path, "GET", "/")[0] == 200:
                    return
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the launcher did not start ({tmp / 'launcher.err'})"
                    ) from None
            time.sleep(0.05)

    def api(self, method: str, target: str, body=None):
        return call(self.path, method, target, body)

    def create(self, body: dict, expect: int = 201) -> dict:
        status, vm = self.api("POST", "/vms", {"cwd": str(ROOT), **body})
        if status != expect:
            raise RuntimeError(f"create {body}: {status} {vm}")
        return vm

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # it stops every VM and waits
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def wait_for(path: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path}: no {text!r} in {timeout} s")
        time.sleep(0.01)


def boot_argv(mem: int, wait_ms: str) -> list[str]:
    return [f"--mem={mem}", str(KERNEL), HEAP_KIB, wait_ms, "0"]


def first_wait_template(directory: Path, mem: int) -> Path:
    """A template taken by the cold command at the guest's first wait, of a
    guest that waits 1 ms: its clones run on at once, rewrite their heap
    and end (the latency rows wait for that end)."""
    taken = subprocess.run(
        [*PYVMM, "--snapshot-at=first-wait", f"--snapshot-dir={directory}", "--snapshot-stop",
         *boot_argv(mem, "1")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    if taken.returncode != 0:
        raise RuntimeError(f"the first-wait template: {taken.stderr.strip()}")
    return directory


_WRITTEN = re.compile(r"snapshot: .* written \((\d+) pages of memory, ([\d.]+) ms\)")


def by_the_command(directory: Path, mem: int) -> float:
    """ms the command's own writer takes (``-v`` says it), at the guest's
    first wait: all of guest memory compared with zero in its process."""
    taken = subprocess.run(
        [*PYVMM, "-v", "--snapshot-at=first-wait", f"--snapshot-dir={directory}",
         "--snapshot-stop", *boot_argv(mem, "1")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    found = _WRITTEN.search(taken.stderr)
    if taken.returncode != 0 or found is None:
        raise RuntimeError(f"the command's snapshot: {taken.stderr.strip()[-300:]}")
    shutil.rmtree(directory)
    return float(found.group(2))


def take_template(launcher: Launcher, tmp: Path, name: str, mem: int) -> dict:
    """A guest booted through the launcher, snapshotted through the API in
    its first wait (its initialisation done, the wait longer than the
    bench), stopped: the template of the idle clones."""
    out = tmp / f"{name}.out"
    vm = launcher.create({"argv": boot_argv(mem, IDLE_MS), "stdout": str(out)})
    wait_for(out, "heap:")
    time.sleep(0.05)  # from its last line to its wait
    directory = tmp / name
    status, answer = launcher.api(
        "POST", f"/vms/{vm['id']}/snapshot", {"dir": str(directory), "stop": True}
    )
    if status != 200:
        raise RuntimeError(f"snapshot: {status} {answer}")
    launcher.api("GET", f"/vms/{vm['id']}/wait")
    launcher.api("DELETE", f"/vms/{vm['id']}")
    memory = os.stat(directory / "memory")
    answer["disk_kib"] = memory.st_blocks * 512 / 1024
    answer["apparent_mib"] = memory.st_size / (1 << 20)
    answer["path"] = directory
    return answer


_TRACE_ROW = re.compile(r"pyvmm: trace: (.+?)\s+(-?[\d.]+)\s+(-?[\d.]+)$")


def trace_rows(stderr: str) -> dict[str, tuple[float, float]]:
    rows = {}
    for line in stderr.splitlines():
        m = _TRACE_ROW.match(line)
        if m:
            rows.setdefault(m.group(1), (float(m.group(2)), float(m.group(3))))
    return rows


def cold(argv: list[str]) -> dict[str, float]:
    """A cold command with --trace: ms from the interpreter's start (and,
    for a restore, from the snapshot's opening) to the first KVM_RUN."""
    result = subprocess.run(
        [*PYVMM, "--trace", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{argv}: status {result.returncode}: {result.stderr[-400:]}")
    rows = trace_rows(result.stderr)
    first = rows["to the first KVM_RUN (first guest instruction)"]
    out = {"start": first[0] + first[1]}
    opened = rows.get("snapshot opened and checked")
    if opened is not None:
        out["opened"] = out["start"] - opened[0]
    imports = next((v for k, v in rows.items() if k.startswith("imports: snapshot restore")), None)
    if imports is not None:  # the restore's own code, loaded before the opening
        out["imports"] = imports[1]
    return out


def through(launcher: Launcher, body: dict) -> float:
    """ms from the request's first byte to right before the first KVM_RUN."""
    vm = launcher.create({**body, "stdout": os.devnull})
    end = launcher.api("GET", f"/vms/{vm['id']}/wait")[1]
    launcher.api("DELETE", f"/vms/{vm['id']}")
    if end["exit_status"] != 0:
        raise RuntimeError(f"{body}: {end}")
    return end["start_us"]["running"] / 1000


def pool_ready(launcher: Launcher) -> None:
    deadline = time.monotonic() + 60
    while True:
        pools = launcher.api("GET", "/pool")[1]["pools"]
        if pools and pools[0]["ready"] >= 1:
            break
        if pools and pools[0]["error"]:
            raise RuntimeError(f"pool: {pools[0]['error']}")
        if time.monotonic() > deadline:
            raise RuntimeError("the pool never got ready")
        time.sleep(0.01)
    time.sleep(0.2)  # the prepared child idle


def pooled(launcher: Launcher, body: dict) -> float:
    pool_ready(launcher)
    return through(launcher, body)


def latencies(launcher: Launcher, template: Path, mem: int, runs: int) -> dict[str, object]:
    """Each way --runs times, the ways interleaved (the host's load weighs
    on every row alike); the first round thrown away (warming)."""
    restore = {"restore": str(template)}
    boot = {"argv": boot_argv(mem, "1")}
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    for i in range(runs + 1):
        restored = cold([f"--restore={template}"])
        booted = cold(boot["argv"])
        forked_restore, forked_boot = through(launcher, restore), through(launcher, boot)
        if not i:
            continue
        add("cold pyvmm --restore: snapshot opened -> first instruction", restored["opened"])
        add("cold pyvmm --restore: its imports, before the opening", restored["imports"])
        add("cold pyvmm --restore: interpreter start -> first instruction", restored["start"])
        add("cold pyvmm (boot): interpreter start -> first instruction", booted["start"])
        add("serve, fork per request: restore", forked_restore)
        add("serve, fork per request: boot", forked_boot)
    for name, body in (("restore", restore), ("boot", boot)):
        status, pool = launcher.api("POST", "/pool", {**body, "cwd": str(ROOT), "size": 1})
        if status != 201:
            raise RuntimeError(f"pool: {status} {pool}")
        values = [pooled(launcher, body) for _ in range(runs + 1)][1:]
        rows[f"serve, from a pool: {name}"] = values
        launcher.api("DELETE", "/pool")
    return {name: stats(values) for name, values in rows.items()}


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def memory_of(pids: list[int]) -> dict[str, dict[str, float]]:
    rollups = [smaps.rollup(pid) for pid in pids]
    return {
        "pss_mib": stats([r["Pss"] / 1024 for r in rollups]),
        "private_mib": stats([(r["Private_Clean"] + r["Private_Dirty"]) / 1024 for r in rollups]),
        "rss_mib": stats([r["Rss"] / 1024 for r in rollups]),
    }


def kind_of(m: smaps.Mapping, memory_file: str) -> str:
    if m.path == memory_file:
        return "guest memory: the snapshot's file (MAP_PRIVATE)"
    if m.path == str(KERNEL):
        return "the unikernel's file"
    if ".so" in m.path or m.path.endswith("python3") or "python3." in m.path:
        return "libraries and the interpreter's file"
    if m.path in ("", "[heap]") or m.path.startswith("[anon"):
        return "anonymous: interpreter heap, arenas, stacks, guest pages"
    return "other"


def breakdown(pid: int, memory_file: str) -> dict[str, float]:
    kinds: dict[str, float] = {}
    for m in smaps.read(pid):
        kind = kind_of(m, memory_file)
        kinds[kind] = kinds.get(kind, 0.0) + m["Pss"] / 1024
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def density(launcher: Launcher, template: Path, mem: int, clones: int) -> dict[str, object]:
    """--clones clones of the template and --clones booted guests, all at
    once, idle in their first wait; measured with both groups running."""
    free_before = mem_available_kib()
    restored = [
        launcher.create({"restore": str(template), "stdout": os.devnull}) for _ in range(clones)
    ]
    time.sleep(1)
    free_clones = mem_available_kib()
    booted = [
        launcher.create({"argv": boot_argv(mem, IDLE_MS), "stdout": os.devnull})
        for _ in range(clones)
    ]
    time.sleep(2)  # each booted guest through its boot, into its wait
    free_all = mem_available_kib()
    for vm in restored + booted:
        if launcher.api("GET", f"/vms/{vm['id']}")[1]["state"] != "running":
            raise RuntimeError(f"VM {vm['id']} is not running")
    memory_file = os.path.realpath(template / "memory")
    out = {
        "clones": memory_of([vm["pid"] for vm in restored]),
        "booted": memory_of([vm["pid"] for vm in booted]),
        "clone_host_kib": (free_before - free_clones) / clones,
        "booted_host_kib": (free_clones - free_all) / clones,
        "clone_breakdown": breakdown(restored[0]["pid"], memory_file),
        "booted_breakdown": breakdown(booted[0]["pid"], memory_file),
        "launcher_pss_mib": smaps.rollup(launcher.proc.pid)["Pss"] / 1024,
    }
    for vm in restored + booted:
        launcher.api("DELETE", f"/vms/{vm['id']}", {"signal": "SIGKILL"})
    return out


def report(r: dict) -> None:
    print(f"pyvmm snapshots and templates: {r['machine']}, load {r['load']}")
    print(f"guest: {KERNEL.name} (4 MiB table, {HEAP_KIB} KiB heap at boot), --mem={r['mem']}")
    print(f"runs: {r['runs']} per row, clones: {r['clones']}")
    print()
    s = r["snapshot"]
    print("snapshot (POST /vms/ID/snapshot, a guest in its first wait)      median      p90")
    print(
        f"  request -> files written and synced (ms)                  {s['ms']['median']:8.2f} "
        f"{s['ms']['p90']:8.2f}"
    )
    print(
        f"  the command's writer, --snapshot-at=first-wait -v (ms)      "
        f"{s['command_ms']['median']:8.2f} {s['command_ms']['p90']:8.2f}"
    )
    print(
        f"  pages written: {s['pages']}, memory file {s['apparent_mib']:.0f} MiB apparent, "
        f"{s['disk_kib']:.0f} KiB on disk"
    )
    print()
    print("to the guest's first instruction (ms)                            median      p90")
    for name, v in r["latency"].items():
        print(f"  {name:<62} {v['median']:7.2f} {v['p90']:8.2f}")
    print()
    d = r["density"]
    print(f"memory per guest, {r['clones']} clones and {r['clones']} booted at once (MiB)")
    print("                                   PSS med   p90   private med   RSS med  host/guest")
    for name, key in (("template clones (restore)", "clones"), ("booted from scratch", "booted")):
        v = d[key]
        host = d[f"{'clone' if key == 'clones' else 'booted'}_host_kib"] / 1024
        print(
            f"  {name:<30} {v['pss_mib']['median']:8.2f} {v['pss_mib']['p90']:6.2f} "
            f"{v['private_mib']['median']:12.2f} {v['rss_mib']['median']:9.2f} {host:10.2f}"
        )
    print(f"  the launcher itself: PSS {d['launcher_pss_mib']:.2f} MiB")
    for name in ("clone", "booted"):
        print(f"  one {name}'s PSS by kind of mapping (MiB):")
        for kind, mib in d[f"{name}_breakdown"].items():
            if mib >= 0.005:
                print(f"    {kind:<58} {mib:6.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--clones", type=int, default=100)
    parser.add_argument("--mem", type=int, default=16, help="guest memory, MiB")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.runs < 1 or args.clones < 1:
        parser.error("--runs and --clones must be at least 1")
    if not KERNEL.exists():
        subprocess.run(
            ["make", "-C", str(ROOT / "guests"), "-s", "bin/bigsink_idle.hvt"], check=True
        )

    def stop(signum: int, frame: object) -> None:
        raise Stop()

    signal.signal(signal.SIGTERM, stop)
    tmp = Path(tempfile.mkdtemp(prefix="pyvmm-bench-snapshot-"))
    launcher = None
    try:
        launcher = Launcher(tmp, max_vms=2 * args.clones + 8)
        snaps, command = [], []
        for i in range(args.runs):  # the two writers alternated
            snaps.append(take_template(launcher, tmp, f"s{i}", args.mem))
            command.append(by_the_command(tmp / f"c{i}", args.mem))
        quick = first_wait_template(tmp / "quick", args.mem)
        results = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.release()}",
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "mem": args.mem,
            "runs": args.runs,
            "clones": args.clones,
            "snapshot": {
                "ms": stats([s["ms"] for s in snaps]),
                "command_ms": stats(command),
                "pages": snaps[0]["pages"],
                "apparent_mib": snaps[0]["apparent_mib"],
                "disk_kib": snaps[0]["disk_kib"],
            },
            "latency": latencies(launcher, quick, args.mem, args.runs),
            "density": density(launcher, snaps[0]["path"], args.mem, args.clones),
        }
        results["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        report(results)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
        return 0
    except (KeyboardInterrupt, Stop):
        print("bench/snapshot.py: stopped; cleaned up", file=sys.stderr)
        return 130
    except RuntimeError as err:
        print(f"bench/snapshot.py: {err}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if launcher is not None:
            launcher.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
