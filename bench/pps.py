"""Received packets per second and VM exits, every network mode side by side.

    python3 bench/pps.py [--seconds 5] [--size 1300] [--rate 0] [--pin]
                         [--guest PATH] [--cpl auto,0,deprivileged]

For each mode (--shm=off: one hypercall per frame, answered in C by the
fast path; off-py: the same answered by Python, PYVMM_PY_HYPERCALLS=1;
poll, event, hybrid: the shmstream IO thread) this boots the udpsink guest in a fresh network
namespace with a tap, floods it from inside the namespace with UDP
datagrams of --size payload bytes (C sendmmsg sender, testkit.traffic) for
--seconds, and reports what the guest itself received and checked (frames
with a bad payload pattern count as errors), the VM exits KVM counted
(KVM_GET_STATS_FD) and those that reached pyvmm, the host-side drops, and
"lost %" is every datagram sent that the guest did not count (ring drops
plus the tap's own queue overflowing, which is how --shm=off loses them),
the CPU time of the vCPU thread and the IO thread (as % of the whole run,
boot and idle timeout included). rx pps is the guest's own count over its
first-to-last frame time; exit rates are over the sender's window. Nothing
leaves the namespace, which is removed afterwards.

--guest runs another receiving program with udpsink's arguments and output,
for example udpsink.c built against Solo5's own bindings (no pyvmm note:
it runs deprivileged on PVM hosts, at CPL 0 elsewhere; with the shm modes
pyvmm's IO thread serves Solo5's ring instead of shmstream). --cpl repeats
every mode at each listed privilege setting (docs/pvm.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit.helpers import STATS, parse_stats  # noqa: E402
from testkit.netns import NetNamespace  # noqa: E402

GUEST = ROOT / "guests" / "bin" / "udpsink.hvt"
GUEST_IP, HOST_IP, PORT = "10.0.0.2", "10.0.0.1", 5000
GUEST_MAC = "02:00:00:00:00:02"
MODES = ("off-py", "off", "poll", "event", "hybrid")


def run_mode(mode: str, cpl: str, args) -> dict:
    with NetNamespace() as ns:
        ns.add_tap("tap100", address=f"{HOST_IP}/24")
        # A static neighbour entry: the flood starts at once, no ARP.
        ns.run(
            ["ip", "neigh", "replace", GUEST_IP, "lladdr", GUEST_MAC, "dev", "tap100"], check=True
        )
        shm = "off" if mode.startswith("off") else mode
        env = dict(os.environ, PYVMM_PY_HYPERCALLS="1") if mode == "off-py" else None
        argv = [
            STATS,
            f"--cpl={cpl}",
            f"--shm={shm}",
            "--net:service0=tap100",
            f"--net-mac:service0={GUEST_MAC}",
        ]
        if args.pin:
            argv += ["--pin", "vcpu=0,io=1" if shm != "off" else "vcpu=0"]
        if args.slots and shm != "off":
            argv += [f"--shm-slots={args.slots}"]
        if args.budget and shm == "hybrid":
            argv += [f"--hybrid-budget={args.budget}"]
        argv += [str(args.guest), GUEST_IP, str(PORT), "0", str(args.idle_ms)]
        try:
            vm, head = ns.start_pyvmm(*argv, cwd=ROOT, env=env)
        except RuntimeError as err:
            raise SystemExit(f"{mode}: {err}") from None
        sender = [
            sys.executable,
            "-m",
            "testkit.traffic",
            GUEST_IP,
            str(PORT),
            "--seconds",
            str(args.seconds),
            "--size",
            str(args.size),
            "--rate",
            str(args.rate),
        ]
        if args.pin:
            sender = ["taskset", "-c", "1" if shm == "off" else "0"] + sender
        sent = json.loads(ns.run(sender, capture_output=True, text=True, check=True).stdout)
        out, err = vm.communicate(timeout=args.seconds + 60)
        out = head + out
    if vm.returncode != 0:
        raise SystemExit(f"{mode}: udpsink failed ({vm.returncode}): {out}{err}")
    guest = dict(re.findall(r"^(\w+): (\S+)$", out, re.M))
    stats = parse_stats(err)
    label = mode if cpl == "auto" else f"{mode}/{cpl}"
    return {"mode": label, "sent": sent, "guest": guest, "stats": stats}


def summarize(r: dict) -> dict:
    guest, stats, sent = r["guest"], r["stats"], r["sent"]
    frames = int(guest["frames"])
    elapsed = max(int(guest["elapsed_us"]), 1) / 1e6
    # Rates over the traffic window (the sender's), not the whole run,
    # which also holds boot and the guest's idle timeout.
    window = max(sent["elapsed_s"], 1e-6)
    seconds = stats["seconds"]
    kvm_exits = stats.get("kvm", {}).get("exits", 0)
    to_pyvmm = sum(stats["exits_to_pyvmm"].values())
    shm = stats.get("shmstream")
    drops = 0
    io_cpu = 0.0
    if shm:
        for dev in shm["devices"].values():
            drops += dev["rx_drops_full"] + dev["rx_drops_oversize"] + dev["rx_bad_index"]
        io_cpu = shm["thread"]["cpu_ns"] / 1e9 / seconds * 100
    return {
        "mode": r["mode"],
        "offered": sent["pps"],
        "received": frames / elapsed,
        "frames": frames,
        "errors": int(guest["pattern_errors"]),
        "kvm_exits_s": kvm_exits / window,
        "to_pyvmm_s": to_pyvmm / window,
        "exits_per_kframe": kvm_exits / max(frames, 1) * 1000,
        "kvm_exits": kvm_exits,
        "drops": drops,
        "lost": 100 * (1 - frames / max(sent["sent"], 1)),
        "vcpu_cpu": stats["vcpu_thread_cpu_ns"] / 1e9 / seconds * 100,
        "window": window,
        "io_cpu": io_cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=1300, help="UDP payload bytes")
    parser.add_argument("--rate", type=int, default=0, help="offered datagrams/s (0: max)")
    parser.add_argument("--idle-ms", type=int, default=1500)
    parser.add_argument("--pin", action="store_true", help="vCPU on CPU 0, IO thread on 1")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--slots", type=int, default=0, help="--shm-slots (0: default)")
    parser.add_argument("--budget", type=int, default=0, help="--hybrid-budget in us (0: default)")
    parser.add_argument("--json", action="store_true", help="also dump raw results")
    parser.add_argument("--guest", type=Path, default=GUEST, help="receiving program")
    parser.add_argument("--cpl", default="auto", help="--cpl values to run each mode at")
    args = parser.parse_args()

    from pyvmm.kvm.system import kvm_flavour

    print(
        f"# {platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
        f"KVM {kvm_flavour()}; {args.size}-byte UDP payloads for {args.seconds:g} s per mode, "
        f"offered {'max' if not args.rate else args.rate} pps{', pinned' if args.pin else ''}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    header = (
        f"{'mode':<18} {'offered pps':>11} {'rx pps':>9} {'frames':>9} {'errors':>6} "
        f"{'KVM exits/s':>11} {'exits/1k fr':>11} {'to pyvmm/s':>10} {'ring drops':>10} "
        f"{'lost %':>6} {'vCPU %':>6} {'IO %':>5}"
    )
    print(header)
    raw = []
    if args.guest != GUEST:
        print(f"# guest: {args.guest}")
    for mode, cpl in [(m, c) for c in args.cpl.split(",") for m in args.modes.split(",")]:
        result = run_mode(mode, cpl, args)
        raw.append(result)
        s = summarize(result)
        print(
            f"{s['mode']:<18} {s['offered']:>11.0f} {s['received']:>9.0f} {s['frames']:>9} "
            f"{s['errors']:>6} {s['kvm_exits_s']:>11.0f} {s['exits_per_kframe']:>11.1f} "
            f"{s['to_pyvmm_s']:>10.0f} {s['drops']:>10} {s['lost']:>6.1f} {s['vcpu_cpu']:>6.0f} "
            f"{s['io_cpu']:>5.0f}",
            flush=True,
        )
    if args.json:
        print(json.dumps(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
