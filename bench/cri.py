"""CRI pod-start latency: a pod's first output through containerd's CRI
plugin, pyvmm-oci (cold) beside runc, in one run.

    python3 bench/cri.py [-n RUNS]

A private containerd with its CRI plugin runs inside a network namespace
of its own, with CNI's bridge and host-local (``testkit.cri``, as
tests/test_cri.py). Each run, for each handler in turn (the order rotates
from run to run): RunPodSandbox (pause, through runc in both cases: pyvmm-oci
hands sandboxes to runc), CreateContainer, StartContainer, then the
container's CRI log file is polled (every 0.5 ms) until the first
``Hello, world`` line is there; the pod is then stopped and removed, not
timed. The ``pyvmm`` handler runs the hello unikernel through pyvmm-oci's
native front end and a cold pyvmm; the ``runc`` handler a static C hello
(built here with ``gcc -static``). One warm-up pod per handler first, not
counted (the first use of an image's snapshot). The table gives each
phase's median and 90th percentile in milliseconds and the ratio of the
medians.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyvmm.oci import image as oci_image  # noqa: E402
from testkit.cri import images  # noqa: E402
from testkit.cri.containerd import CriContainerd, CriError  # noqa: E402

PHASES = ("RunPodSandbox", "CreateContainer", "StartContainer", "start to output", "total")
HANDLERS = {  # handler: (column, image)
    "runc": ("runc, static hello", images.HELLO_REF),
    "pyvmm": ("pyvmm-oci cold, hello.hvt", "docker.io/pyvmm/hello:latest"),
}
POLL = 0.0005
OUTPUT = "Hello, world"


def _has_output(path: Path) -> bool:
    try:
        with open(path) as f:
            return any(line.rstrip("\n").endswith(f" {OUTPUT}") for line in f)
    except FileNotFoundError:
        return False


def pod_start(ctd: CriContainerd, handler: str, image: str, timeout: float = 30) -> dict:
    """One pod to its container's first output; the phases in ms."""
    t0 = time.perf_counter()
    pod = ctd.run_pod(f"bench-{handler}", handler)
    try:
        t1 = time.perf_counter()
        cid = pod.create("hello", image)
        t2 = time.perf_counter()
        pod.start(cid)
        t3 = time.perf_counter()
        log = pod.log_path("hello")
        while not _has_output(log):
            if time.perf_counter() - t3 > timeout:
                raise CriError(f"{handler}: no {OUTPUT!r} in {log} after {timeout} s")
            time.sleep(POLL)
        t4 = time.perf_counter()
        done = pod.wait_exited(cid)
        if done.exit_code != 0:
            raise CriError(f"{handler}: hello exited {done.exit_code} ({done.reason})")
    finally:
        pod.remove()
    times = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)
    return {phase: 1000 * t for phase, t in zip(PHASES, times, strict=True)}


def _cell(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"{statistics.median(values):.1f} ({p90:.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=10, help="pods per handler (default 10)")
    opts = parser.parse_args()
    if opts.runs < 1:
        parser.error("--runs must be at least 1")
    if os.geteuid() != 0:
        print("bench/cri.py: needs root (containerd, network namespaces, cgroups)", file=sys.stderr)
        return 2
    main_pid = os.getpid()

    def on_term(*_: object) -> None:
        # pyroute2 forks helpers (which inherit this handler) and ends them
        # with SIGTERM: only this process unwinds to its clean-up.
        if os.getpid() != main_pid:
            os._exit(128 + signal.SIGTERM)
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    native = ROOT / "pyvmm" / "_oci"
    ctd = CriContainerd(str(native))
    try:
        hello = ctd.dir / "hello.tar"
        oci_image.build(str(ROOT / "guests" / "bin" / "hello.hvt"), str(hello))
        static = images.static_image(images.HELLO_C, "static-hello", images.HELLO_REF, ctd.dir)
        ctd.start([hello, static])
        order = list(HANDLERS)
        for handler in order:  # warm-up: the snapshots' first use
            pod_start(ctd, handler, HANDLERS[handler][1])
        results: dict[str, list[dict]] = {h: [] for h in order}
        for run in range(opts.runs):
            for handler in order[run % 2 :] + order[: run % 2]:
                results[handler].append(pod_start(ctd, handler, HANDLERS[handler][1]))
    except (CriError, RuntimeError, OSError) as err:
        print(f"bench/cri.py: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        forced = ctd.stop()
        if forced:
            print(f"bench/cri.py: cleaned up by force: {forced}", file=sys.stderr)
    load = os.getloadavg()
    print(f"CRI pod start, {opts.runs} pods per handler, ms, median (p90); load {load[0]:.2f}")
    heads = [HANDLERS[h][0] for h in order]
    print(f"{'phase':<18}" + "".join(f"{h:>28}" for h in heads) + f"{'pyvmm/runc':>12}")
    for phase in PHASES:
        cells = [_cell([r[phase] for r in results[h]]) for h in order]
        med = {h: statistics.median(r[phase] for r in results[h]) for h in order}
        ratio = med["pyvmm"] / med["runc"] if med["runc"] else float("nan")
        print(f"{phase:<18}" + "".join(f"{c:>28}" for c in cells) + f"{ratio:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
