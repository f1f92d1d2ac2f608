"""Soak: N guests in parallel under traffic, every network mode, for a while.

    python3 bench/soak.py [--guests 4] [--minutes 30] [--cycle 300]
                          [--rate 20000] [--burst 5] [--out soak.json]

Each guest slot runs in its own network namespace (testkit.netns, removed
afterwards) with a tap, and goes through the modes in turn: `off`
(hypercalls answered in C), `poll`, `event`, `hybrid` (shmstream, udpecho
answering every datagram, so frames flow both ways) and, when Solo5's own
udpsink can be built (bench/solo5/udpsink.c linked with Solo5's bindings
by scripts/solo5_build.py), `s5ring` (Solo5's ring served by the IO
thread). A run lasts --cycle seconds under bursts of --burst
seconds of --rate datagrams/s (the C sender, AF_PACKET into the tap) with a
second's pause between, then gets SIGTERM; slot i starts at mode i, so the
modes run side by side. The sandbox is on, as by default.

Reported, per run and in total: how each run ended (crash = anything but
SIGTERM's 143 and its one line, or an end before the SIGTERM), the fd count
and RSS of the pyvmm process after its first burst and before its stop
(growth), and frames: offered by the sender, handed to pyvmm by the tap,
dropped by the tap (its queue full: pyvmm too slow), and pyvmm's own drops
by cause (--stats-json: every counter pyvmm.vm.stats.NET_MEANING calls a drop:
ring full, oversize, bad index, bad TX length, refused by the tap). Not a CI
test: it takes as long as asked.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyvmm.vm.stats import drop_counters  # noqa: E402
from pyvmm.vm.statsview import is_live_line  # noqa: E402
from scripts import solo5_build  # noqa: E402
from testkit.netns import NetNamespace  # noqa: E402

GUESTS = ROOT / "guests" / "bin"
GUEST_IP, HOST_IP, PORT = "10.0.0.2", "10.0.0.1", 5000
GUEST_MAC = "02:00:00:00:00:02"


@functools.cache
def solo5_sink() -> Path | None:
    """Solo5's udpsink (bench/solo5/udpsink.c, Solo5's own bindings), built
    by scripts/solo5_build.py if it can be; None if not (the reason said)."""
    try:
        return solo5_build.ensure(log=lambda m: None).app("udpsink", "hvt")
    except solo5_build.BuildError as err:
        print(f"soak: no s5ring runs: {err}", file=sys.stderr)
        return None


def modes() -> list[str]:
    found = ["off", "poll", "event", "hybrid"]
    return found + (["s5ring"] if solo5_sink() else [])


def fds_and_rss(pid: int) -> tuple[int, int]:
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return fds, rss
    except (OSError, StopIteration):
        return -1, -1


def drops(snap: dict) -> dict[str, int]:
    """pyvmm's own drops by cause, from a --stats-json snapshot: the
    hypercall path's as ``tap_path_*``, the rings' by their counters' names
    (stats.NET_MEANING says which counters are drops)."""
    out: dict[str, int] = {}
    for key, n in (snap.get("tap_drops") or {}).items():
        if key in drop_counters("tap_drops") and n:
            out[f"tap_path_{key}"] = out.get(f"tap_path_{key}", 0) + n
    for service in ("shmstream", "solo5_ring"):
        part = snap.get(service) or {}
        groups = list((part.get("devices") or {}).values()) + [part.get("ring") or {}]
        for group in groups:
            for key in drop_counters(service):
                if group.get(key):
                    out[key] = out.get(key, 0) + group[key]
    return out


def last_snapshot(path: Path) -> dict:
    snap: dict = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                snap = json.loads(line)
    return snap


def one_run(ns: NetNamespace, mode: str, args, tmp: Path, stop: threading.Event) -> dict:
    stats = tmp / f"{mode}.jsonl"
    with contextlib.suppress(FileNotFoundError):
        stats.unlink()
    argv = ["--stats=1s", f"--stats-json={stats}", "--net:service0=tap100"]
    argv += [f"--net-mac:service0={GUEST_MAC}", "--mem=64"]
    if mode == "s5ring":
        argv += ["--shm=event", str(solo5_sink()), GUEST_IP, str(PORT), "0", "3600000"]
    else:
        argv += [f"--shm={mode}", str(GUESTS / "udpecho.hvt"), GUEST_IP, str(PORT), "0"]
    tap_before = ns.link("tap100")["stats"]
    proc, _ = ns.start_pyvmm(*argv)
    # Keep stdout drained (udpsink prints at its end only; udpecho little).
    drain = threading.Thread(target=proc.stdout.read, daemon=True)
    drain.start()
    offered = bursts = 0
    first = None
    ended_early = False
    deadline = time.monotonic() + args.cycle
    while time.monotonic() < deadline and not stop.is_set():
        sender = ns.run(
            [sys.executable, "-m", "testkit.traffic", GUEST_IP, str(PORT)]
            + ["--seconds", str(args.burst), "--rate", str(args.rate), "--size", "1000"]
            + ["--packet", "tap100", "--qdisc", "--src-ip", HOST_IP, "--dst-mac", GUEST_MAC],
            capture_output=True,
            text=True,
        )
        with contextlib.suppress(ValueError, IndexError):
            offered += json.loads(sender.stdout.strip().splitlines()[-1])["sent"]
        bursts += 1
        if first is None:
            first = fds_and_rss(proc.pid)
        if proc.poll() is not None:
            ended_early = True
            break
        time.sleep(1)
    before_stop = fds_and_rss(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        err += "\n(no end 30 s after SIGTERM: killed)"
    tap_after = ns.link("tap100")["stats"]
    status = proc.returncode
    lines = [line for line in err.splitlines() if not is_live_line(line)]
    clean = (
        not ended_early
        and status == 143
        and lines[-1:] == ["pyvmm: stopped by SIGTERM (Exiting on signal 15)"]
    )
    snap = last_snapshot(stats)
    return {
        "mode": mode,
        "status": status,
        "crash": not clean,
        "stderr_tail": lines[-3:] if not clean else [],
        "bursts": bursts,
        "offered": offered,
        "tap_to_pyvmm": tap_after.get("tx_packets", 0) - tap_before.get("tx_packets", 0),
        "tap_dropped": tap_after.get("tx_dropped", 0) - tap_before.get("tx_dropped", 0),
        "pyvmm_drops": drops(snap),
        "fds": [first[0] if first else -1, before_stop[0]],
        "rss_kib": [first[1] if first else -1, before_stop[1]],
        "seconds": snap.get("seconds"),
    }


def slot(index: int, args, end: float, results: list, stop: threading.Event) -> None:
    order = modes()
    turn = index
    with NetNamespace() as ns, tempfile.TemporaryDirectory() as tmp:
        ns.add_tap("tap100", address=f"{HOST_IP}/24")
        while time.monotonic() + 10 < end and not stop.is_set():
            mode = order[turn % len(order)]
            turn += 1
            try:
                run = one_run(ns, mode, args, Path(tmp), stop)
            except Exception as err:  # a soak reports, it does not stop
                run = {"mode": mode, "crash": True, "stderr_tail": [repr(err)]}
            run["slot"] = index
            results.append(run)
            print(json.dumps(run), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guests", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--cycle", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--rate", type=int, default=20000, help="datagrams/s per guest")
    parser.add_argument("--burst", type=float, default=5.0, help="seconds of traffic per burst")
    parser.add_argument("--out", type=Path, help="every run and the totals as JSON")
    args = parser.parse_args()
    args.cycle = min(args.cycle, args.minutes * 60)
    end = time.monotonic() + args.minutes * 60
    results: list[dict] = []
    stop = threading.Event()
    threads = [
        threading.Thread(target=slot, args=(i, args, end, results, stop))
        for i in range(args.guests)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join()
    total: dict = {
        "minutes": round((time.monotonic() - started) / 60, 1),
        "guests": args.guests,
        "runs": len(results),
        "runs_by_mode": {},
        "crashes": [r for r in results if r.get("crash")],
        "offered": sum(r.get("offered", 0) for r in results),
        "tap_to_pyvmm": sum(r.get("tap_to_pyvmm", 0) for r in results),
        "tap_dropped": sum(r.get("tap_dropped", 0) for r in results),
        "pyvmm_drops": {},
        "max_fd_growth": max((r["fds"][1] - r["fds"][0] for r in results if "fds" in r), default=0),
        "max_rss_growth_kib": max(
            (r["rss_kib"][1] - r["rss_kib"][0] for r in results if "rss_kib" in r), default=0
        ),
    }
    for r in results:
        total["runs_by_mode"][r["mode"]] = total["runs_by_mode"].get(r["mode"], 0) + 1
        for key, n in r.get("pyvmm_drops", {}).items():
            total["pyvmm_drops"][key] = total["pyvmm_drops"].get(key, 0) + n
    print(json.dumps({"total": total}, indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"runs": results, "total": total}, indent=1))
    return 1 if total["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
