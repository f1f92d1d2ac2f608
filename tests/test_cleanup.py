"""pyvmm releases everything it acquired on every exit path: file
descriptors (/dev/kvm, VM, vCPU, taps, block files, eventfds, stats fd),
the IO thread, guest memory. Checked in-process, where a leak would show."""

from __future__ import annotations

import gc
import os

import pytest

from conftest import guest
from pyvmm.common.errors import PyvmmError
from pyvmm.vm.config import VmConfig
from pyvmm.vm.vmm import Vmm
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = [
    pytest.mark.kvm,
    pytest.mark.netns,
]


def resources() -> tuple[int, int, int]:
    """Open fds, threads, and mapped bytes of this process.

    Garbage is collected first: an object an earlier test left in a
    reference cycle (a socket, a file) closes its fd whenever the collector
    happens to run, which once made "after" one fd short of "before"."""
    gc.collect()
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    with open("/proc/self/statm") as f:
        vm_pages = int(f.read().split()[0])
    return fds, threads, vm_pages


def run_in(ns: NetNamespace, config: VmConfig) -> int | str:
    with ns.inside():
        try:
            with Vmm(config) as vmm:
                devnull = os.open(os.devnull, os.O_WRONLY)
                saved = os.dup(1)
                os.dup2(devnull, 1)  # the guest's console
                try:
                    return vmm.run()
                finally:
                    os.dup2(saved, 1)
                    os.close(saved)
                    os.close(devnull)
        except PyvmmError as err:
            return str(err)


def nets() -> dict[str, str]:
    return {"service0": "tap100"}


CASES = {
    # The guest halts on its own.
    "halt": lambda shm: (VmConfig(kernel=str(guest("args")), guest_args=["3"]), 3),
    # A guest fault ends the run.
    "fault": lambda shm: (VmConfig(kernel=str(guest("fault_badptr"))), "guest fault"),
    # A net guest served by the IO thread through shmstream rings.
    "shmstream": lambda shm: (
        VmConfig(
            kernel=str(guest("hostile")),
            guest_args=["200"],
            devices={"net": nets(), "shm": {None: shm}},
        ),
        1 if shm == "off" else 0,  # with --shm=off it finds no ring to attack
    ),
    # A net guest whose IO thread serves Solo5's ring (none with --shm=off).
    "solo5-ring": lambda shm: (
        VmConfig(
            kernel=str(guest("hostile_s5")),
            guest_args=["200"],
            devices={"net": nets(), "shm": {None: shm}},
        ),
        1 if shm == "off" else 0,
    ),
    # Taps open, VM and memory exist, the IO thread runs, then set-up fails
    # (--user names nobody): nothing acquired so far may stay behind.
    "fails-after-tap": lambda shm: (
        VmConfig(
            kernel=str(guest("ping")),
            devices={"net": nets(), "shm": {None: shm}},
            user="pyvmm-no-such-user",
        ),
        "no user named",
    ),
}


MODES = ["off", "poll", "event", "hybrid"]
PATHS = [("halt", None), ("fault", None)]
PATHS += [(case, shm) for case in ("shmstream", "solo5-ring") for shm in MODES]
PATHS += [("fails-after-tap", shm) for shm in MODES if shm != "off"]


@pytest.mark.parametrize("case, shm", PATHS)
def test_every_exit_path_releases_everything(case, shm):
    config, expected = CASES[case](shm)
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        run_in(ns, CASES["halt"](shm)[0])  # warm up lazy imports and caches
        before = resources()
        for _ in range(3):
            result = run_in(ns, config)
        after = resources()
    if isinstance(expected, str):
        assert isinstance(result, str) and expected in result, result
    else:
        assert result == expected
    assert after[0] == before[0], f"file descriptors leaked: {before[0]} -> {after[0]}"
    assert after[1] == before[1], f"threads leaked: {before[1]} -> {after[1]}"
    assert after[2] - before[2] < 4096, "guest memory mappings leaked"


# -- stop signals, a vanished tap, a disk that fails: in-process --------------------


def run_stopped(ns: NetNamespace | None, config: VmConfig, ready, *, console=None) -> int | str:
    """Run in-process; once ``ready(vmm)`` holds (polled from another
    thread while the guest runs), a SIGTERM to this (the vCPU) thread."""
    import contextlib
    import signal
    import threading
    import time

    stop = threading.Event()
    main = threading.get_ident()
    holder: dict = {}

    def watch() -> None:
        deadline = time.monotonic() + 30  # then stopped anyway: a failure, not a hang
        while not stop.is_set():
            vmm = holder.get("vmm")
            if (
                vmm is not None
                and vmm.running.is_set()
                and (ready(vmm) or time.monotonic() > deadline)
            ):
                with vmm.running_lock:
                    if vmm.running.is_set():
                        signal.pthread_kill(main, signal.SIGTERM)
                        return
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    inside = ns.inside() if ns is not None else contextlib.nullcontext()
    try:
        with inside, Vmm(config) as vmm:
            holder["vmm"] = vmm
            out = console if console is not None else os.open(os.devnull, os.O_WRONLY)
            saved = os.dup(1)
            os.dup2(out, 1)
            try:
                return vmm.run()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
                if console is None:
                    os.close(out)
    except PyvmmError as err:
        return str(err)
    finally:
        stop.set()
        watcher.join()


def after(seconds: float):
    import time

    start: list[float] = []

    def ready(vmm) -> bool:
        if not start:
            start.append(time.monotonic())
        return time.monotonic() - start[0] >= seconds

    return ready


def test_a_stop_signal_while_console_output_blocks_releases_everything():
    import fcntl

    def pipe_full(read_end: int):
        size = fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ)

        def ready(vmm) -> bool:
            import termios

            buf = bytearray(4)
            fcntl.ioctl(read_end, termios.FIONREAD, buf)
            return int.from_bytes(buf, "little") >= size

        return ready

    config = VmConfig(kernel=str(guest("chatty")), mem_mib=32)
    results = []
    r, w = os.pipe()
    try:
        results.append(run_stopped(None, config, pipe_full(r), console=w))  # warm-up
        os.read(r, 1 << 20)
        before = resources()
        for _ in range(2):
            results.append(run_stopped(None, config, pipe_full(r), console=w))
            while True:  # empty the pipe for the next run
                try:
                    os.set_blocking(r, False)
                    if not os.read(r, 1 << 16):
                        break
                except BlockingIOError:
                    break
        after_ = resources()
    finally:
        os.close(r)
        os.close(w)
    assert all("stopped by SIGTERM" in str(res) for res in results), results
    assert after_[:2] == before[:2], f"leaked: {before} -> {after_}"


@pytest.mark.parametrize("shm", MODES)
def test_a_stop_signal_while_polling_releases_everything(shm):
    config = VmConfig(kernel=str(guest("ping")), devices={"net": nets(), "shm": {None: shm}})
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        run_stopped(ns, config, after(0.2))  # warm-up
        before = resources()
        results = [run_stopped(ns, config, after(0.2)) for _ in range(2)]
        after_ = resources()
    assert all("stopped by SIGTERM" in str(res) for res in results), results
    assert after_[:2] == before[:2], f"leaked: {before} -> {after_}"


@pytest.mark.parametrize("shm", MODES)
def test_a_tap_deleted_under_a_running_guest_leaves_nothing_behind(shm):
    """The link is gone: the hypercall path answers EUNSPEC (ping then ends
    with 1 by itself), the IO thread finds nothing to move and the guest runs
    on without network until stopped; either way every fd and thread goes."""
    config = VmConfig(kernel=str(guest("ping")), devices={"net": nets(), "shm": {None: shm}})
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        run_stopped(ns, config, after(0.1))  # warm-up
        before = resources()
        results = []
        for _ in range(2):
            ns.add_tap("tap100", address="10.0.0.1/24") if "tap100" not in ns.links() else None
            deleted: list[bool] = []
            later = after(0.5)

            def delete_then_stop(vmm, deleted=deleted, later=later) -> bool:
                if not deleted:
                    # ip(8), not pyroute2, whose helper threads would count here.
                    ns.run(["ip", "link", "del", "tap100"], check=True)
                    deleted.append(True)
                    return False
                return later(vmm)

            results.append(run_stopped(ns, config, delete_then_stop))
        after_ = resources()
        assert ns.links() == ["lo"]  # pyvmm re-created nothing
    expected = 1 if shm == "off" else "stopped by SIGTERM"
    assert all(res == expected or expected in str(res) for res in results), results
    assert after_[:2] == before[:2], f"leaked: {before} -> {after_}"


def test_a_block_file_that_fails_under_the_guest_leaves_nothing_behind(tmp_path):
    """blockerr reads its last block until that fails (the file shrinks
    under it): EUNSPEC, the guest ends with 0, everything is released."""
    disk = tmp_path / "disk.img"
    disk.write_bytes(bytes(64 * 1024))
    config = VmConfig(kernel=str(guest("blockerr")), devices={"block": {"storage": str(disk)}})

    def shrink(vmm) -> bool:
        os.truncate(disk, 0)
        return False  # no signal: the guest ends by itself

    run_stopped(None, config, shrink)  # warm-up
    before = resources()
    results = []
    for _ in range(2):
        disk.write_bytes(bytes(64 * 1024))
        results.append(run_stopped(None, config, shrink))
    after_ = resources()
    assert results == [0, 0]
    assert after_[:2] == before[:2], f"leaked: {before} -> {after_}"


# -- the command: a stop signal at any moment, with the sandbox ------------------------


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.1, 0.2, 0.4, 0.8])
def test_a_stop_signal_at_any_moment_of_a_net_run_ends_it_cleanly(delay):
    """From pyvmm's handlers in through set-up (taps, KVM, the IO thread,
    the sandbox) into the run: 143, one line, no process left, the tap free
    again (a new pyvmm attaches it at once)."""
    import signal
    import subprocess
    import sys
    import time

    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        argv = [sys.executable, "-m", "pyvmm", "--shm=event", "--net:service0=tap100"]
        proc = ns.popen(
            argv + [str(guest("ping"))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while not helpers.handles_stop_signals(proc.pid) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, err
        assert err.splitlines() == ["pyvmm: stopped by SIGTERM (Exiting on signal 15)"]
        assert ns.pids() == []
        again, _ = ns.start_pyvmm("--net:service0=tap100", guest("ping"))
        again.terminate()
        again.communicate(timeout=30)
