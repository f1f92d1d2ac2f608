"""SIGINT, SIGTERM and SIGHUP end a guest cleanly: pyvmm exits promptly with 128 +
signal, one line on stderr, and releases what it held (here: the tap, which
another process can attach at once afterwards). A console nobody reads any
more ends it as SIGPIPE ends a Unix filter: status 141, nothing said."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, guest, popen_pyvmm
from testkit.netns import NetNamespace

pytestmark = pytest.mark.kvm

STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]  # README: 128 + signal


def start_waiting_guest(ns: NetNamespace, shm: str = "event") -> subprocess.Popen:
    """The ping guest with no count waits in the poll hypercall forever
    (answered by Python with shmstream, by the C fast path with --shm=off)."""
    vm, _ = ns.start_pyvmm(f"--shm={shm}", "--net:service0=tap100", guest("ping"), "10.0.0.2")
    return vm


@pytest.mark.netns
@pytest.mark.parametrize("shm", ["event", "off"])
@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_signal_stops_guest_and_releases_tap(sig, shm):
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm = start_waiting_guest(ns, shm)
        vm.send_signal(sig)
        _, err = vm.communicate(timeout=30)
        assert vm.returncode == 128 + sig, err
        assert err.strip() == f"pyvmm: stopped by {sig.name} (Exiting on signal {sig.value})"
        # The tap was released: a new pyvmm can attach it right away.
        again = start_waiting_guest(ns)
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=30)
        assert again.returncode == 128 + signal.SIGTERM


@pytest.mark.parametrize("sig", STOP_SIGNALS)
@pytest.mark.parametrize("cpl", ["0", "3"])
def test_stop_signal_stops_a_cpu_bound_guest(cpl, sig):
    """A guest that never exits to pyvmm is still stopped: the signal
    interrupts KVM_RUN (or immediate_exit catches it just before)."""
    vm = popen_pyvmm(f"--cpl={cpl}", guest("spin"))
    assert vm.stdout.readline().strip() == "spinning"
    vm.send_signal(sig)
    _, err = vm.communicate(timeout=30)
    assert vm.returncode == 128 + sig
    assert err.strip() == f"pyvmm: stopped by {sig.name} (Exiting on signal {sig.value})"


@pytest.mark.parametrize("how", ["launcher", "python -m", "pyvmm run"])
def test_a_console_whose_reader_left_ends_pyvmm_with_141(tmp_path, how):
    """``pyvmm chatty.hvt | head -1`` returns once head has its line, and
    pyvmm's own status is 141 (128 + SIGPIPE), as solo5-hvt's and any
    filter's, after the whole clean-up (here: every tear-down phase, the
    final counters) and without a word."""
    timeline, stats = tmp_path / "trace.json", tmp_path / "stats.jsonl"
    server = None
    if how == "launcher":
        pyvmm = [str(ROOT / "pyvmm" / "_launcher")]
    elif how == "python -m":
        pyvmm = [sys.executable, "-m", "pyvmm"]
    else:  # through the warm launcher: its VM shares the client's console
        from test_serve import Launcher

        server = Launcher(tmp_path)
        pyvmm = [sys.executable, "-m", "pyvmm", "run", "--api-sock", server.path]
    argv = [*pyvmm, f"--trace={timeline}", f"--stats-json={stats}", str(guest("chatty"))]
    script = '"$@" | head -1; echo "status ${PIPESTATUS[0]}" >&2'
    shell = subprocess.Popen(
        ["bash", "-c", script, "bash", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        out, err = shell.communicate(timeout=60)  # only catches the hang this is about
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)  # pyvmm too, not left spinning
        shell.communicate()
        raise
    finally:
        if server is not None:
            assert server.stop() == 128 + signal.SIGTERM
    done = subprocess.CompletedProcess(shell.args, shell.returncode, out, err)
    assert done.stdout == "".join(chr(ord("a") + i % 26) for i in range(1023)) + "\n"
    *said, status = done.stderr.splitlines()
    assert status == "status 141", done.stderr
    assert [x for x in said if not x.startswith("pyvmm: trace: ")] == []
    names = [e["name"] for e in json.loads(timeline.read_text())["traceEvents"] if e["ph"] == "X"]
    assert names[-2:] == ["tear-down: devices (taps, disks)", "flush and exit"]
    (final,) = [json.loads(x) for x in stats.read_text().splitlines()]
    assert final["record"] == "final" and final["exit_status"] == 141
    assert final["hypercalls"]["puts"] >= 1
