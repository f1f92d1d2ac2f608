"""What each OCI runtime call costs: pyvmm-oci (its native front end, its
warm path, and the Python runtime alone) beside runc, call by call, as
containerd's shim makes them.

    python3 bench/oci_calls.py [-n RUNS]

Each run, for each runtime in turn: ``create``, ``state`` (created),
``start``, ``state`` (running), ``kill KILL``, the process reaped (this
script is a child subreaper, as the shim is), ``delete``. Every call is
timed from outside (fork to exit, wall clock); the table gives each
call's median and 90th percentile in milliseconds. pyvmm-oci runs the spin
unikernel; runc a ``sleep`` from the host's /usr (bind-mounted, read-only)
in a bundle made by ``runc spec``. Both get a cgroup (``/pyvmm-bench/ID``).
The warm rows are the native front end with the bundle's annotation
``org.pyvmm.launcher`` naming a ``pyvmm serve`` this script starts (and
stops): create asks it for the VM, start lets it run.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS = ("create", "state created", "start", "state running", "kill", "delete")
PR_SET_CHILD_SUBREAPER = 36


def runc_bundle(path: Path) -> None:
    rootfs = path / "rootfs"
    (rootfs / "usr").mkdir(parents=True)
    for name in ("bin", "lib", "lib64"):
        (rootfs / name).symlink_to(f"usr/{name}")
    subprocess.run(["runc", "spec"], cwd=path, check=True)
    config = json.loads((path / "config.json").read_text())
    config["process"].update(args=["sleep", "3600"], terminal=False)
    config["mounts"].append(
        {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]}
    )
    config["linux"]["cgroupsPath"] = "/pyvmm-bench/runc"
    (path / "config.json").write_text(json.dumps(config))


def pyvmm_bundle(path: Path, launcher: Path | None = None) -> None:
    (path / "rootfs" / "unikernel").mkdir(parents=True)
    shutil.copy(ROOT / "guests" / "bin" / "spin.hvt", path / "rootfs" / "unikernel" / "kernel.hvt")
    config = {
        "ociVersion": "1.0.2",
        "process": {"args": []},
        "root": {"path": "rootfs"},
        "linux": {"cgroupsPath": f"/pyvmm-bench/{path.name}"},
    }
    if launcher is not None:
        config["annotations"] = {"org.pyvmm.launcher": str(launcher)}
    (path / "config.json").write_text(json.dumps(config))


def timed(argv: list[str]) -> float:
    # Not a pipe: the container's process inherits create's stdio and keeps it.
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, timeout=60
        )
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv)}: {err.read().decode().strip()}")
    return elapsed * 1000


def clean_up(work: Path) -> None:
    """Whatever a failed run left: containers, and the cgroup parent
    (runc removes only a container's own directory)."""
    root = work / "runc-root"
    if root.is_dir():
        for cid in os.listdir(root):
            subprocess.run(["runc", "--root", str(root), "delete", "--force", cid], check=False)
    pyvmm_root = work / "pyvmm-root"
    if pyvmm_root.is_dir():
        for cid in os.listdir(pyvmm_root):
            subprocess.run(
                [sys.executable, "-m", "pyvmm.oci", "--root", str(pyvmm_root), "delete", "-f", cid],
                check=False,
            )
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        parent = hierarchy / "pyvmm-bench"
        for leftover in sorted(parent.glob("**/"), key=lambda d: -len(str(d))):
            with contextlib.suppress(OSError):
                leftover.rmdir()
    shutil.rmtree(work, ignore_errors=True)


def one_run(runtime: list[str], bundle: Path, cid: str) -> dict[str, float]:
    pid_file = bundle / "pid"
    times = {
        "create": timed(
            [*runtime, "create", "--bundle", str(bundle), "--pid-file", str(pid_file), cid]
        )
    }
    pid = int(pid_file.read_text())
    times["state created"] = timed([*runtime, "state", cid])
    times["start"] = timed([*runtime, "start", cid])
    times["state running"] = timed([*runtime, "state", cid])
    times["kill"] = timed([*runtime, "kill", cid, "KILL"])
    os.waitpid(pid, 0)
    times["delete"] = timed([*runtime, "delete", cid])
    return times


def start_launcher(sock: Path, log: Path) -> subprocess.Popen:
    """``pyvmm serve`` on ``sock``, listening once this returns."""
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyvmm", "serve", "--api-sock", str(sock)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=ROOT,
        )
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"pyvmm serve did not start: {log.read_text().strip()}")
        time.sleep(0.05)
    return proc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--runs", type=int, default=10)
    opts = p.parse_args()
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1)
    native = ROOT / "pyvmm" / "_oci"
    if not os.access(native, os.X_OK):
        raise SystemExit(f"{native} is missing: python3 setup.py build_ext --inplace")
    work = Path(tempfile.mkdtemp(prefix="oci-calls-"))
    launcher = None
    try:
        runc_bundle(work / "runc")
        pyvmm_bundle(work / "pyvmm")
        sock = work / "api.sock"
        pyvmm_bundle(work / "pyvmm-warm", sock)
        launcher = start_launcher(sock, work / "launcher.log")
        runtimes = {
            "runc": (["runc", "--root", str(work / "runc-root")], work / "runc"),
            "pyvmm-oci (native front end)": (
                [str(native), "--root", str(work / "pyvmm-root")],
                work / "pyvmm",
            ),
            "pyvmm-oci (warm)": (
                [str(native), "--root", str(work / "pyvmm-root")],
                work / "pyvmm-warm",
            ),
            "pyvmm-oci (Python only)": (
                [sys.executable, "-m", "pyvmm.oci", "--root", str(work / "pyvmm-root")],
                work / "pyvmm",
            ),
        }
        samples: dict[str, dict[str, list[float]]] = {
            name: {c: [] for c in CALLS} for name in runtimes
        }
        for i in range(opts.runs + 1):  # the first run warms the page cache, not counted
            for name, (runtime, bundle) in runtimes.items():
                times = one_run(runtime, bundle, f"bench{i}")
                if i:
                    for call, ms in times.items():
                        samples[name][call].append(ms)
        print(f"{opts.runs} runs, milliseconds, median (p90)")
        print(f"{'call':<16}" + "".join(f"{name:>30}" for name in runtimes))
        for call in CALLS:
            cells = []
            for name in runtimes:
                values = sorted(samples[name][call])
                p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
                cells.append(f"{statistics.median(values):.1f} ({p90:.1f})")
            print(f"{call:<16}" + "".join(f"{cell:>30}" for cell in cells))
    finally:
        if launcher is not None:
            launcher.terminate()
            launcher.wait(timeout=60)
        clean_up(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
