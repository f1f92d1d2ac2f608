"""`ctr run --rm` start to exit: hello through pyvmm-oci (cold, and warm
from a running `pyvmm serve`) beside runc's static hello, in one run.

    python3 bench/ctr.py [-n PAIRS] [--no-warm]

A private containerd (testkit.containerd: its own directories and
socket, never the host's) runs the images through the standard runc shim:
the hello unikernel (`pyvmm-oci pack`'s code) with `--runc-binary`
pyvmm-oci's native front end, and a static C hello (compiled here with
`gcc -static`, packed as a one-layer image) with runc. Each round runs
every row once, the order rotating from round to round, so that no row
always goes first; the first round warms the snapshots and the page cache
and is not counted. Start to exit is `ctr run --rm` from fork to exit.

containerd runs at log level debug: its stamps of the run's steps (the
snapshot prepared, the container made, the shim started, the shim gone,
the container deleted) split the time before create and after delete.
Each round also runs every row once more, traced, for the breakdown:
each call from fork to exit through a small wrapper binary (built here)
that logs them, as the shim would see them, and for pyvmm-oci (cold and
warm) the VM's phases from the container's timeline (the annotation
org.pyvmm.trace, pyvmm.oci.timeline), with the cold create's interpreter
start. The time around the calls is ctr's, containerd's, the shim's and
the snapshot mount's, and for runc the workload's too (runc's container
process is not traced).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyvmm.oci import image as oci_image  # noqa: E402
from pyvmm.oci import timeline  # noqa: E402
from testkit.containerd import Containerd, find_tool  # noqa: E402
from testkit.cri import images  # noqa: E402

HELLO = "docker.io/pyvmm/hello:latest"
OUTPUT = "Hello, world"
WARM_ANNOTATION = "org.pyvmm.launcher"
COLD = "pyvmm-oci cold"
#: The runtime's global options that take a value (the shim's form).
VALUED = ("--root", "--log", "--log-format", "--criu", "--rootless")
#: The VM's phases (pyvmm --trace), grouped: the first phase of each group.
VM_GROUPS = (
    ("pyvmm start", ("interpreter start", "imports:", "argument parsing")),
    ("launcher hand-over", ("launcher:",)),
    (
        "VM set-up",
        (
            "plan",
            "load ELF",
            "devices",
            "open /dev/kvm",
            "create VM",
            "map ",
            "page ",
            "vCPU",
            "counters",
            "sandbox",
            "to the first KVM_RUN",
            "IO thread",
        ),
    ),
    ("guest", ("guest:",)),
    ("tear-down", ("tear-down", "flush and exit")),
)

#: Logs each call's CLOCK_MONOTONIC fork and exit (ns), status and argv;
#: the real runtime is its child, so the shim still finds what that
#: runtime leaves (runc's init is re-parented to the shim, a subreaper).
WRAPPER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(int argc, char **argv) {
    long long begin = now();
    pid_t pid = fork();
    if (pid == 0) {
        argv[0] = REAL;
        execv(REAL, argv);
        _exit(127);
    }
    int st = 0;
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    long long end = now();
    int status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    int fd = open(LOG, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
        char line[8192];
        int n = snprintf(line, sizeof line, "%lld %lld %d", begin, end, status);
        for (int i = 1; i < argc && n < (int)sizeof line - 2; i++)
            n += snprintf(line + n, sizeof line - n, "\x1f%s", argv[i]);
        if (n > (int)sizeof line - 2)
            n = sizeof line - 2;
        line[n++] = '\n';
        if (write(fd, line, n) != n) {
        }
        close(fd);
    }
    return status;
}
"""


def wrapper(real: str, log: Path, out: Path) -> str:
    source = f'#define REAL "{real}"\n#define LOG "{log}"\n' + WRAPPER_C
    return str(images.compile_static(source, out))


def command_of(argv: list[str]) -> str:
    """The runtime command in a shim's argv (after the global options)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in VALUED
        else:
            return arg
    return "?"


def wrapped_calls(log: Path) -> list[tuple[str, int, int]]:
    """(command, begin ns, end ns) of each call the wrapper logged, then
    the log emptied for the next run."""
    if not log.exists():
        return []
    calls = []
    for line in log.read_text().splitlines():
        head, *argv = line.split("\x1f")
        begin, end, _status = head.split()
        calls.append((command_of(argv), int(begin), int(end)))
    log.unlink()
    return calls


class Row:
    """One way of running hello: its ctr options, and how to read its calls."""

    def __init__(self, name: str, ref: str, runtime: str, root: str, options=()) -> None:
        self.name, self.ref, self.runtime, self.root = name, ref, runtime, root
        self.options = tuple(options)
        self.totals: list[float] = []
        self.parts: list[dict[str, float]] = []
        self.traced_totals: list[float] = []


#: Runs whose output ctr lost, by row: run again, and said in the report.
LOST_OUTPUT: dict[str, int] = {}
#: How many times one run is tried when ctr loses its output.
TRIES = 3


def ctr_run(ctd: Containerd, row: Row, cid: str, runtime: str, options=()) -> tuple[int, int, str]:
    """One ``ctr run --rm``: its fork and exit (monotonic ns) and the
    container id it ran as.

    A run that exits 0 without the workload's output is run again under a
    new id: ctr can lose a short-lived container's output (its copy of the
    stdout FIFO races the exit; seen with runc's static hello on a loaded
    machine), which says nothing about the runtime. Any other failure, or
    output lost TRIES times in a row, ends the benchmark."""
    for attempt in range(TRIES):
        used = cid if attempt == 0 else f"{cid}r{attempt}"
        argv = ctd.run_argv(
            row.ref, used, options=row.options + tuple(options), runtime=runtime, runc_root=row.root
        )
        begin = time.monotonic_ns()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{row.name}: ctr run did not end within 120 s") from None
        end = time.monotonic_ns()
        if done.returncode != 0:
            raise SystemExit(
                f"{row.name}: ctr run: exit status {done.returncode}: {done.stderr.strip()[-500:]}"
            )
        if OUTPUT in done.stdout:
            return begin, end, used
        LOST_OUTPUT[row.name] = LOST_OUTPUT.get(row.name, 0) + 1
    raise SystemExit(
        f"{row.name}: ctr run exited 0 without {OUTPUT!r} on its output {TRIES} times in a row"
    )


class ContainerdLog:
    """containerd's debug log (wall-clock stamps, ns): where its own steps
    of one run fall, on CLOCK_MONOTONIC."""

    LINE = re.compile(r'time="([0-9T:.-]+)Z" level=\w+ msg="((?:[^"\\]|\\.)*)"(.*)')

    def __init__(self, path: str) -> None:
        self.path = path

    def offset(self) -> int:
        return os.path.getsize(self.path)

    @staticmethod
    def _ns(stamp: str) -> int:
        whole, _, frac = stamp.partition(".")
        seconds = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
        return int(seconds) * 1_000_000_000 + int((frac + "000000000")[:9])

    def steps(self, since: int, cid: str) -> dict[str, int]:
        """The run's snapshot prepared, container made, shim started, shim
        gone and container deleted; absent steps are left out."""
        with open(self.path) as f:
            f.seek(since)
            text = f.read()
        wall_to_mono = time.time_ns() - time.monotonic_ns()
        found: dict[str, int] = {}
        for line in text.splitlines():
            m = self.LINE.match(line)
            if m is None:
                continue
            at, msg, rest = self._ns(m.group(1)) - wall_to_mono, m.group(2), m.group(3)
            if msg == "prepare snapshot" and f"key={cid} " in rest + " ":
                found.setdefault("snapshot", at)
            elif "topic=/containers/create" in rest and "snapshot" in found:
                found.setdefault("container", at)
            elif msg == "starting signal loop" and f"/{cid} " in rest:
                found.setdefault("shim", at)
            elif msg == "shim disconnected" and f"id={cid}" in rest:
                found.setdefault("shim gone", at)
            elif "topic=/containers/delete" in rest and "shim gone" in found:
                found.setdefault("container deleted", at)
        return found


def breakdown(
    calls: list[tuple[str, int, int]],
    begin: int,
    end: int,
    vm: dict[str, float] | None = None,
    steps: dict[str, int] | None = None,
) -> dict[str, float]:
    """A traced run's parts, ms: the calls, the VM's phases, and the time
    around them (containerd's, the shim's, ctr's, and the workload's where
    it is not traced), from ctr's fork (``begin``) to its exit (``end``)."""
    # Only this run's: a run tried again (ctr_run) left the earlier try's calls.
    calls = sorted((c for c in calls if c[1] >= begin), key=lambda c: c[1])
    first = {name: (b, e) for name, b, e in reversed(calls)}
    if not {"create", "start", "delete"} <= first.keys():
        raise SystemExit(f"the calls of a run: {[c[0] for c in calls]} (create, start, delete?)")
    (cb, ce), (sb, se), (db, de) = first["create"], first["start"], first["delete"]
    ms = 1e6
    steps = steps or {}
    before = ("snapshot", "container", "shim")
    if all(k in steps for k in before) and begin <= steps["snapshot"] <= steps["shim"] <= cb:
        parts = {
            "ctr to the snapshot": (steps["snapshot"] - begin) / ms,
            "snapshot to the container": (steps["container"] - steps["snapshot"]) / ms,
            "container to the shim": (steps["shim"] - steps["container"]) / ms,
            "shim to create (rootfs mount)": (cb - steps["shim"]) / ms,
        }
    else:
        parts = {"ctr to create": (cb - begin) / ms}
    parts["create"] = (ce - cb) / ms
    parts["create to start"] = (sb - ce) / ms
    parts["start"] = (se - sb) / ms
    between = (db - se) / ms
    if vm is not None:
        parts.update(vm)
        between -= sum(vm.values())
    parts["start to delete" if vm is None else "start to delete, less the VM"] = between
    parts["delete"] = (de - db) / ms
    after = ("shim gone", "container deleted")
    if all(k in steps for k in after) and de <= steps["shim gone"] <= steps["container deleted"]:
        parts["delete to the shim's end"] = (steps["shim gone"] - de) / ms
        parts["shim's end to container deleted"] = (
            steps["container deleted"] - steps["shim gone"]
        ) / ms
        parts["container deleted to ctr's exit"] = (end - steps["container deleted"]) / ms
    else:
        parts["delete to exit"] = (end - de) / ms
    others = [(e - b) / ms for name, b, e in calls if (b, e) not in first.values()]
    parts["other calls (in the gaps)"] = sum(others)
    return parts


def timeline_parts(path: Path) -> tuple[dict[str, float], float, float]:
    """From a container's timeline: the VM's phases by group (ms),
    create's own span (ms), which ends before the interpreter's exit, and
    the interpreter's start inside it (ms)."""
    trace = json.loads(path.read_text())
    path.unlink()
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    create = next(e for e in spans if e["cat"] == timeline.CALL and e["name"] == "create")
    if not any(e["cat"] == "pyvmm" for e in spans):
        raise SystemExit(f"{path}: no VM phases in the timeline")
    interpreter = sum(
        e["dur"] for e in spans if e["cat"] == "pyvmm-oci" and e["name"] == "interpreter start"
    )
    main = [e for e in spans if e["cat"] == "pyvmm" and e["tid"] == e["pid"]]
    vm = {}
    for group, prefixes in VM_GROUPS:
        mine = [e["dur"] for e in main if e["name"].startswith(prefixes)]
        if mine:  # (the warm VM has no interpreter start, the cold no hand-over)
            vm[group] = sum(mine) / 1000
    return vm, create["dur"] / 1000, interpreter / 1000


def start_launcher(sock: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [str(ROOT / "pyvmm" / "_launcher"), "serve", f"--api-sock={sock}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"pyvmm serve did not start: {proc.stderr.read().decode()[-500:]}")
        time.sleep(0.05)
    return proc


def stop_launcher(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]


def report(rows: list[Row], pairs: int, warm_note: str | None) -> None:
    print(f"ctr run --rm, start to exit: {pairs} rounds, ms, median (p90)")
    runc = next(r for r in rows if r.name.startswith("runc"))
    runc_median = statistics.median(runc.totals)
    print(f"{'row':<28}{'start to exit':>18}{'ratio to runc':>15}{'traced':>18}")
    for row in rows:
        median, p90 = quantiles(row.totals)
        tmed, tp90 = quantiles(row.traced_totals)
        print(
            f"{row.name:<28}{f'{median:.1f} ({p90:.1f})':>18}{median / runc_median:>15.2f}"
            f"{f'{tmed:.1f} ({tp90:.1f})':>18}"
        )
    for row in rows:  # the goals: warm no slower than runc, cold at most 1.5x
        goal = {COLD: 1.5, "pyvmm-oci warm": 1.0}.get(row.name)
        if goal is not None:
            ratio = statistics.median(row.totals) / runc_median
            verdict = "met" if ratio <= goal else "missed"
            print(f"{row.name}: {ratio:.2f}x runc against a goal of <= {goal}x: {verdict}")
    for name, lost in LOST_OUTPUT.items():
        print(f"{name}: ctr lost the output of {lost} run(s) (exit 0, no output): run again")
    if warm_note == "--no-warm":
        print("warm: left out (--no-warm)")
    elif warm_note:
        print(f"warm: not available ({warm_note})")
    order = [
        "ctr to create",
        "ctr to the snapshot",
        "snapshot to the container",
        "container to the shim",
        "shim to create (rootfs mount)",
        "create",
        "create: interpreter start",
        "create: its exit, after its span",
        "create to start",
        "start",
        *(g for g, _ in VM_GROUPS),
        "start to delete",
        "start to delete, less the VM",
        "delete",
        "delete to exit",
        "delete to the shim's end",
        "shim's end to container deleted",
        "container deleted to ctr's exit",
        "other calls (in the gaps)",
    ]
    keys = [k for k in order if any(k in p for row in rows for p in row.parts)]
    print("\nbreakdown of the traced runs, ms, median of each part")
    print(f"{'part':<33}" + "".join(f"{row.name:>20}" for row in rows))
    for key in keys:
        cells = []
        for row in rows:
            values = [p[key] for p in row.parts if key in p]
            cells.append(f"{statistics.median(values):.1f}" if values else "-")
        print(f"{key:<33}" + "".join(f"{cell:>20}" for cell in cells))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--pairs", type=int, default=10, help="rounds counted (default 10)")
    p.add_argument("--no-warm", action="store_true", help="leave the warm path's row out")
    opts = p.parse_args()
    if opts.pairs < 1:
        p.error("--pairs: at least 1")
    native = ROOT / "pyvmm" / "_oci"
    if not os.access(native, os.X_OK):
        raise SystemExit(f"{native} is missing: python3 setup.py build_ext --inplace")
    find_tool("containerd-shim-runc-v2")
    runc = find_tool("runc")
    work = Path(tempfile.mkdtemp(prefix="bench-ctr-"))
    ctd = Containerd(str(native), log_level="debug")  # its steps' stamps, for the breakdown
    launcher = None
    warm_note = "--no-warm" if opts.no_warm else None
    try:
        ctd.start()
        archive = work / "hello-hvt.tar"
        oci_image.build(str(ROOT / "guests" / "bin" / "hello.hvt"), str(archive))
        ctd.ctr("image", "import", str(archive))
        static = images.static_image(images.HELLO_C, "hello", images.HELLO_REF, work)
        ctd.ctr("image", "import", str(static))
        ctd_log = ContainerdLog(os.path.join(ctd.dir, "containerd.log"))
        traces = work / "traces"
        traces.mkdir(mode=0o700)
        runc_log, warm_log = work / "runc-calls.log", work / "warm-calls.log"
        rows = [
            Row(COLD, HELLO, str(native), os.path.join(ctd.dir, "pyvmm-root")),
            Row("runc, static hello", images.HELLO_REF, runc, os.path.join(ctd.dir, "runc-root")),
        ]
        cold_log = work / "cold-calls.log"
        wrapped = {
            rows[0].name: (wrapper(str(native), cold_log, work / "cold-wrap"), cold_log),
            rows[1].name: (wrapper(runc, runc_log, work / "runc-wrap"), runc_log),
        }
        if not opts.no_warm:
            sock = work / "launcher.sock"
            launcher = start_launcher(sock)
            warm = Row(
                "pyvmm-oci warm",
                HELLO,
                str(native),
                os.path.join(ctd.dir, "warm-root"),
                options=("--annotation", f"{WARM_ANNOTATION}={sock}"),
            )
            wrapped[warm.name] = (wrapper(str(native), warm_log, work / "warm-wrap"), warm_log)
            try:  # the warm path is the native create's: it says so in the shim's log
                ctr_run(ctd, warm, "warmprobe", str(native))
                rows.insert(1, warm)
            except SystemExit as err:
                warm_note = str(err)
        for i in range(opts.pairs + 1):  # round 0 warms up, not counted
            order = rows[i % len(rows) :] + rows[: i % len(rows)]
            for row in order:
                cid = f"b{i}-{row.name.split()[-1].strip(',')}"
                begin, end, _ = ctr_run(ctd, row, cid, row.runtime)
                traced = row.ref == HELLO  # pyvmm-oci keeps the timeline, cold or warm
                options = ("--annotation", f"{timeline.ANNOTATION}={traces}") if traced else ()
                runtime, log = wrapped[row.name]
                since = ctd_log.offset()
                t_begin, t_end, traced_cid = ctr_run(ctd, row, cid + "t", runtime, options)
                steps = ctd_log.steps(since, traced_cid)
                vm = None
                if traced:
                    vm, create_span, interpreter = timeline_parts(
                        traces / f"{traced_cid}{timeline.SUFFIX}"
                    )
                parts = breakdown(wrapped_calls(log), t_begin, t_end, vm, steps)
                if row.name == COLD:
                    parts["create: its exit, after its span"] = parts["create"] - create_span
                    parts["create: interpreter start"] = interpreter
                if i:
                    row.totals.append((end - begin) / 1e6)
                    row.traced_totals.append((t_end - t_begin) / 1e6)
                    row.parts.append(parts)
        print(f"load average before the report: {os.getloadavg()[0]:.2f}")
        report(rows, opts.pairs, warm_note)
    finally:
        stop_launcher(launcher)
        leftovers = ctd.stop()
        shutil.rmtree(work, ignore_errors=True)
        if leftovers:
            print(f"bench/ctr.py: cleaned up after containerd: {leftovers}", file=sys.stderr)
    return 0


class Stopped(Exception):
    """SIGTERM or SIGHUP: the clean-up in main's finally runs."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


if __name__ == "__main__":
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop)
    try:
        sys.exit(main())
    except (KeyboardInterrupt, Stopped) as err:
        sys.exit(
            f"bench/ctr.py: stopped ({err or 'SIGINT'}); containerd and the launcher taken down"
        )
