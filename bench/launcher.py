"""Start latency and memory of guests through the warm launcher (pyvmm serve),
against the cold command, on the same guest.

    python3 bench/launcher.py [--runs 30] [--instances 4] [--json FILE]

Rows (median and 90th percentile over --runs, one warm-up first):

- request -> first KVM_RUN: what the launcher measures for each VM, from
  the request's first byte to right before the child's first KVM_RUN
  (CLOCK_MONOTONIC on both sides), with its parts: parse, plan and fork
  in the launcher, Vmm set-up in the child, threads and sandbox;
- the CPU time behind it (the launcher's and the child's): wall time grows
  with the host's load, CPU time much less;
- request -> created (201) and request -> exit status, as a client in
  this process sees them (hello.hvt, guest console to /dev/null);
- the same through a pool of one (POST /pool): each create takes a VM
  prepared ahead up to its first instruction (the pool is refilled after
  each, and the next run waits until it is ready again);
- `pyvmm run --api-sock` and the cold `pyvmm` command, boot to exit, as
  processes (both pay the interpreter's start-up: the client's is the
  floor of that row);
- PSS and RSS per idle VM process (--instances spin.hvt guests, measured
  from /proc/PID/smaps_rollup while they all run) through the launcher and
  for as many cold commands.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GUESTS = ROOT / "guests" / "bin"
HELLO = str(GUESTS / "hello.hvt")
SPIN = str(GUESTS / "spin.hvt")
PYVMM = [sys.executable, "-m", "pyvmm"]

from pyvmm.serve.client import call  # noqa: E402


def start_launcher(path: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*PYVMM, "serve", "--api-sock", path], stdout=subprocess.DEVNULL, cwd=ROOT
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if call(path, "GET", "/")[0] == 200:
                return proc
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise
        time.sleep(0.05)


def stats(values: list[float]) -> dict[str, float]:
    arr = np.array(values)
    return {"median": float(np.median(arr)), "p90": float(np.percentile(arr, 90))}


def through_launcher(path: str, runs: int, pooled: bool = False) -> dict[str, object]:
    """hello.hvt --runs times through the launcher; with ``pooled``, each
    create takes a VM a pool of one prepared ahead (refilled after each)."""
    parts: dict[str, list[float]] = {}
    created, ended = [], []
    argv = ["--mem=64", HELLO]
    if pooled:
        call(path, "POST", "/pool", {"argv": argv, "cwd": str(ROOT), "size": 1})
    for i in range(runs + 1):
        if pooled:
            wait_ready(path)
        start = time.perf_counter()
        body = {"argv": argv, "cwd": str(ROOT), "stdout": os.devnull}
        status, vm = call(path, "POST", "/vms", body)
        created_at = time.perf_counter()
        if status != 201 or vm.get("pooled", False) != pooled:
            raise RuntimeError(f"create: {status} {vm}")
        end = call(path, "GET", f"/vms/{vm['id']}/wait")[1]
        done = time.perf_counter()
        call(path, "DELETE", f"/vms/{vm['id']}")
        if end["exit_status"] != 0 or not i:
            continue
        created.append((created_at - start) * 1000)
        ended.append((done - start) * 1000)
        times = end["start_us"]
        steps = {"request -> first KVM_RUN": times["running"]}
        if pooled:
            steps["  launcher: match, hand over"] = times["go"]
            steps["  child: console, threads, sandbox"] = times["running"] - times["go"]
        else:
            steps["  launcher: parse, plan, fork"] = times["forked"]
            steps["  child: Vmm set-up"] = times["ready"] - times["child"]
            steps["  child: threads, sandbox"] = times["running"] - times["ready"]
        steps["CPU: launcher"] = end["start_cpu_us"]["launcher"]
        steps["CPU: child to first KVM_RUN"] = end["start_cpu_us"]["child"]
        for name, value in steps.items():
            parts.setdefault(name, []).append(value / 1000)
    if pooled:
        call(path, "DELETE", "/pool")
    out: dict[str, object] = {name: stats(v) for name, v in parts.items()}
    out["client: request -> 201 created"] = stats(created)
    out["client: request -> exit status (hello)"] = stats(ended)
    return out


def wait_ready(path: str) -> None:
    deadline = time.monotonic() + 60
    while call(path, "GET", "/pool")[1]["pools"][0]["ready"] < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the pool never got ready")
        time.sleep(0.01)
    time.sleep(0.2)  # the prepared child's last writes settle: it waits, idle


def processes(argvs: dict[str, list[str]], runs: int) -> dict[str, object]:
    """Each command --runs times, the commands interleaved (so that a change
    of the host's load during the bench weighs on every row alike)."""
    times: dict[str, list[float]] = {name: [] for name in argvs}
    for i in range(runs + 1):
        for name, argv in argvs.items():
            start = time.perf_counter()
            result = subprocess.run(argv, stdout=subprocess.DEVNULL, cwd=ROOT)
            if result.returncode != 0:
                raise RuntimeError(f"{name}: status {result.returncode}")
            if i:
                times[name].append((time.perf_counter() - start) * 1000)
    return {name: stats(values) for name, values in times.items()}


def memory(pid: int) -> tuple[float, float]:
    """(PSS, RSS) of ``pid`` in MiB."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Pss", "Rss"):
                values[key] = int(rest.split()[0]) / 1024
    return values["Pss"], values["Rss"]


def idle_memory(path: str, instances: int) -> dict[str, object]:
    """PSS/RSS per VM process with ``instances`` spinning guests at once."""
    vms = []
    for _ in range(instances):
        status, vm = call(path, "POST", "/vms", {"argv": ["--mem=64", SPIN], "stdout": os.devnull})
        assert status == 201, vm
        vms.append(vm)
    time.sleep(0.5)
    warm = [memory(vm["pid"]) for vm in vms]
    for vm in vms:
        call(path, "DELETE", f"/vms/{vm['id']}")
    cold_procs = [
        subprocess.Popen([*PYVMM, "--mem=64", SPIN], stdout=subprocess.DEVNULL, cwd=ROOT)
        for _ in range(instances)
    ]
    time.sleep(3)
    cold = [memory(p.pid) for p in cold_procs]
    for p in cold_procs:
        p.send_signal(signal.SIGTERM)
        p.wait()
    return {
        "launcher child": {
            "pss_mib": stats([m[0] for m in warm]),
            "rss_mib": stats([m[1] for m in warm]),
        },
        "cold pyvmm": {
            "pss_mib": stats([m[0] for m in cold]),
            "rss_mib": stats([m[1] for m in cold]),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "api.sock")
        launcher = start_launcher(path)
        try:
            results = {
                "launcher": through_launcher(path, args.runs),
                "launcher, pooled": through_launcher(path, args.runs, pooled=True),
            }
            results["processes"] = processes(
                {
                    "pyvmm run --api-sock ... hello.hvt": [
                        *PYVMM,
                        "run",
                        "--api-sock",
                        path,
                        "--mem=64",
                        HELLO,
                    ],
                    "pyvmm hello.hvt (cold)": [*PYVMM, "--mem=64", HELLO],
                    "python3 -c pass": [sys.executable, "-c", "pass"],
                },
                args.runs,
            )
            results["memory"] = idle_memory(path, args.instances)
        finally:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait()
    print(f"{'ms (median, p90)':<44}{'median':>9}{'p90':>9}")
    for group in ("launcher", "launcher, pooled", "processes"):
        print(f"{group}:")
        for name, value in results[group].items():
            print(f"{name:<44}{value['median']:>9.2f}{value['p90']:>9.2f}")
    for name, value in results["memory"].items():
        pss, rss = value["pss_mib"]["median"], value["rss_mib"]["median"]
        print(f"{name + ': PSS, RSS per idle VM (MiB)':<44}{pss:>9.2f}{rss:>9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
