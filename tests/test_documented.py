"""One test per documented promise of the pyvmm command (README, --help,
docs/abi.md) that no other file pins, each through the command line and
checked against an oracle outside the code under test where there is one:
the guest's own report, /sys/module, /proc/<pid>/task/*/status."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, engine_env, guest, popen_pyvmm, run_pyvmm
from testkit import helpers
from testkit.netns import NetNamespace

PVM = os.path.exists("/sys/module/kvm_pvm")  # the host's KVM is kvm_pvm


def one_line(result: subprocess.CompletedProcess, status: int = 1) -> str:
    """pyvmm's one stderr line, after checking the exit status."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyvmm: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def mem_size(result: subprocess.CompletedProcess) -> int:
    """Guest memory as the guest's boot info gives it (guests/edges.c)."""
    assert result.returncode == 0, result.stdout + result.stderr
    return int(re.search(r"^mem_size: (0x[0-9a-f]+)$", result.stdout, re.M).group(1), 16)


# -- exit status and halt ---------------------------------------------------------


@pytest.mark.kvm
@pytest.mark.parametrize("cpl", ["0", "3"])
@pytest.mark.parametrize(
    "value, status",
    [(300, 44), (256, 0), (511, 255), (2**32 - 1, 255), (7, 7)],  # 2**32 - 1 is -1
)
def test_exit_status_is_the_low_8_bits_of_solo5_exit(cpl, value, status):
    result = run_pyvmm(f"--cpl={cpl}", guest("edges"), "exit", str(value))
    assert result.returncode == status, result.stdout + result.stderr
    assert result.stderr == ""


@pytest.mark.kvm
@pytest.mark.parametrize("cpl", ["0", "3"])
@pytest.mark.parametrize("case", ["cookie", "cookie_text"])
def test_halt_with_a_readable_cookie_exits_with_the_status(cpl, case):
    """docs/abi.md: a non-zero cookie must point to 512 readable bytes (the
    guest's data, or its read-only text)."""
    result = run_pyvmm(f"--cpl={cpl}", guest("edges"), case, "9")
    assert result.returncode == 9, result.stdout + result.stderr
    assert result.stderr == ""


@pytest.mark.kvm
@pytest.mark.parametrize("cpl", ["0", "3"])
def test_halt_with_a_cookie_past_the_end_of_memory_is_a_guest_error(cpl):
    line = one_line(run_pyvmm(f"--cpl={cpl}", guest("edges"), "cookie_out"))
    assert line.startswith("pyvmm: guest fault: bad pointer in halt cookie"), line
    assert "outside guest memory" in line


@pytest.mark.kvm
@pytest.mark.parametrize("cpl", ["0", "3"])
@pytest.mark.parametrize(
    "case, words",
    [
        ("port", "4-byte write to port 0x600"),
        ("width", "1-byte write to port 0x501"),
        ("direction", "4-byte read from port 0x501"),
    ],
)
def test_unknown_port_width_or_direction_ends_the_run(cpl, case, words):
    """docs/abi.md: any other port, size or direction is a guest error."""
    result = run_pyvmm(f"--cpl={cpl}", guest("edges"), case)
    line = one_line(result)
    assert line.startswith("pyvmm: guest fault: invalid"), line
    assert words in line
    assert "FAILURE" not in result.stdout


# -- --mem -------------------------------------------------------------------------


@pytest.mark.kvm
def test_mem_defaults_to_512_mib():
    assert mem_size(run_pyvmm(guest("edges"), "exit", "0")) == 512 << 20


@pytest.mark.kvm
@pytest.mark.parametrize("mib, size", [(3, 2 << 20), (5, 4 << 20), (64, 64 << 20)])
def test_mem_is_rounded_down_to_2_mib(mib, size):
    assert mem_size(run_pyvmm(f"--mem={mib}", guest("edges"), "exit", "0")) == size


@pytest.mark.kvm
def test_mem_is_at_most_4_gib():
    assert mem_size(run_pyvmm("--mem=4096", guest("edges"), "exit", "0")) == 4 << 30
    line = one_line(run_pyvmm("--mem=4097", guest("edges"), "exit", "0"))
    assert line == (
        "pyvmm: --mem=4097: guest memory size 4296015872 bytes exceeds the max size "
        "4294967296 bytes (at most 4096 MiB is supported)"
    )


# -- host facts --------------------------------------------------------------------


@pytest.mark.kvm
@pytest.mark.parametrize("option", ["--host-info", "--version"])
def test_host_info_reports_what_the_host_provides(option):
    result = run_pyvmm(option)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("pyvmm "), result.stdout
    flavour = re.search(r"KVM flavour (\S+)", result.stdout).group(1)
    # /sys/module/kvm_pvm, not pyvmm's own detection, says what it must be.
    assert (flavour == "pvm") == PVM, result.stdout
    assert re.search(r"ioeventfd: (yes|no), stats fd: (yes|no)", result.stdout), result.stdout


@pytest.mark.kvm
def test_an_extension_built_elsewhere_is_refused_through_the_command_line(tmp_path):
    """An aarch64 host with an extension built for x86_64: one line, exit 1.
    The host is faked in a child interpreter only (os.uname)."""
    kernel = helpers.patch(
        guest("hello"),
        tmp_path / "hello-arm.hvt",
        18,
        struct.pack("<H", 183),  # EM_AARCH64
    )
    script = textwrap.dedent(
        """
        import os, posix, runpy, sys
        host = os.uname()
        os.uname = lambda: posix.uname_result((*host[:4], "aarch64"))
        sys.argv = ["pyvmm", sys.argv[1]]
        runpy.run_module("pyvmm", run_name="__main__")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(kernel)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    line = one_line(result)
    assert line.startswith("pyvmm: the native extension was built for another"), line


def test_pyvmm_debug_shows_the_traceback_of_an_internal_error():
    """README: PYVMM_DEBUG=1 shows the traceback behind an internal error;
    without it the error is one line."""
    script = textwrap.dedent(
        """
        import sys
        from pyvmm.command import cli
        def broken(argv):
            raise RuntimeError("planted bug")
        cli.parse_command = broken
        sys.exit(cli.main(["hello.hvt"]))
        """
    )

    def run(debug: str | None):
        env = {k: v for k, v in os.environ.items() if k != "PYVMM_DEBUG"}
        if debug is not None:
            env["PYVMM_DEBUG"] = debug
        return subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
        )

    quiet = run(None)
    line = one_line(quiet)
    assert line.startswith("pyvmm: internal error: RuntimeError: planted bug"), line
    loud = run("1")
    assert loud.returncode == 1
    assert "Traceback (most recent call last)" in loud.stderr, loud.stderr
    assert "RuntimeError: planted bug" in loud.stderr
    assert "in broken" in loud.stderr  # the frame that raised


# -- --stats -----------------------------------------------------------------------

STATS_KEYS = {
    "schema",
    "record",
    "unix_time",
    "exit_status",
    "cpl",
    "exits_to_pyvmm",
    "hypercalls",
    "hypercalls_in_c",
    "kvm",
    "privilege",
    "seconds",
    "vcpu_thread_cpu_ns",
    "vcpu_thread_voluntary_switches",
    "vcpu_thread_involuntary_switches",
}


@pytest.mark.kvm
def test_stats_line_has_the_counters():
    """--stats-json: one JSON object at exit; docs/stats.md lists the keys:
    this pins them for a guest without net devices;
    test_stats_keys_with_shmstream for one with shmstream."""
    result = run_pyvmm(helpers.STATS, guest("hello"))
    assert result.returncode == 0, result.stderr
    stats = helpers.parse_stats(result.stderr)
    assert set(stats) == STATS_KEYS, sorted(stats)
    assert stats["cpl"] == (3 if PVM else 0)
    assert stats["exits_to_pyvmm"]["IoOut"] >= 2  # at least a console write and the halt
    assert stats["kvm"]["exits"] >= stats["exits_to_pyvmm"]["IoOut"]
    assert 0 < stats["seconds"] < 60 and stats["vcpu_thread_cpu_ns"] > 0


# -- block devices -----------------------------------------------------------------


@pytest.mark.kvm
@pytest.mark.parametrize("engine", ["c", "python"])
def test_host_io_error_reaches_the_guest_as_eunspec(tmp_path, engine):
    """docs/abi.md: a host I/O error returns EUNSPEC. The disk file shrinks
    under the running guest, so reading its last block fails on the host."""
    disk = tmp_path / "disk.img"
    disk.write_bytes(bytes(1 << 20))
    vm = popen_pyvmm(f"--block:storage={disk}", guest("blockerr"), env=engine_env(engine))
    try:
        assert vm.stdout.readline().startswith("ready"), vm.stderr.read()
        os.truncate(disk, 1 << 19)
        out, err = vm.communicate(timeout=60)
    finally:
        if vm.poll() is None:
            vm.kill()
            vm.wait()
    assert vm.returncode == 0, out + err
    assert "ret: 3" in out.splitlines(), out  # SOLO5_R_EUNSPEC
    assert err == ""


@pytest.mark.kvm
def test_block_option_takes_a_host_block_device(loop_device):
    """README: --block:NAME=PATH, PATH a file or a host block device."""
    device, image = loop_device
    result = run_pyvmm(f"--block:storage={device}", guest("blocktest"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    os.sync()
    assert image.read_bytes() != bytes(1 << 20)  # written through the device


# -- network options (inside a namespace) -----------------------------------------


def task_affinities(pid: int) -> dict[int, str]:
    """Cpus_allowed_list of each thread of ``pid`` that runs pyvmm's code
    (kernel helper threads such as kvm-nx-lpage-recovery left out)."""
    found = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                status = dict(
                    line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line
                )
        except FileNotFoundError:
            continue
        if not status["Name"].startswith("kvm"):
            found[int(task)] = status["Cpus_allowed_list"]
    return found


@pytest.mark.kvm
@pytest.mark.netns
@pytest.mark.parametrize("form", ["--pin=", "--pin "])
def test_pin_pins_the_vcpu_and_io_threads(form):
    """--pin=vcpu=N,io=M (or --pin vcpu=N,io=M): read back from /proc while
    the guest runs. The vCPU runs on pyvmm's main thread; the IO thread is
    the only other one pinned. Waits for the IO thread to reach its CPU: it pins
    itself once it runs (the bound only catches a thread that never does)."""
    cpus = sorted(os.sched_getaffinity(0))
    vcpu, io = cpus[0], cpus[-1]
    value = f"vcpu={vcpu},io={io}"
    pin = [form + value] if form.endswith("=") else [form.strip(), value]
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, _ = ns.start_pyvmm(
            *pin, "--shm=event", "--net=tap100", guest("ping"), "10.0.0.2", ready="ready"
        )
        want = {vm.pid: str(vcpu)}
        deadline = time.monotonic() + 30
        while True:
            seen = task_affinities(vm.pid)
            others = {tid: cpus for tid, cpus in seen.items() if tid != vm.pid}
            # One other thread on io: the IO thread (pyvmm's Python helper
            # threads, such as the SIGUSR1 watcher, stay unpinned).
            if seen.get(vm.pid) == str(vcpu) and list(others.values()).count(str(io)) == 1:
                break
            assert time.monotonic() < deadline, (want, seen)
            time.sleep(0.05)
        vm.send_signal(signal.SIGTERM)
        vm.communicate(timeout=30)
    assert vm.returncode == 128 + signal.SIGTERM


@pytest.mark.kvm
@pytest.mark.netns
@pytest.mark.parametrize(
    "options, slots",
    [(["--shm-slots=64"], 64), ([], 4096), (["--mem=16"], 512), (["--shm-slots=2"], 2)],
)
def test_shm_slots_is_the_ring_depth_the_guest_sees(options, slots):
    """--shm-slots=N: slots per ring; default: fit 1/8 of memory, <= 4096
    (512 MiB: 4096; 16 MiB: 2 rings of 512 2-KiB slots = 2 MiB). The hostile
    guest reads the depth from its shmstream region."""
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        result = ns.run_pyvmm("--shm=event", *options, "--net=tap100", guest("hostile"), "10")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"attacking shmstream rings ({slots} slots)" in result.stdout.splitlines()


@pytest.mark.kvm
@pytest.mark.netns
@pytest.mark.parametrize("budget", [None, "1", "1000000"])
def test_hybrid_budget_end_to_end(budget):
    """--hybrid-budget=US, default 2000, at most 1000000: the guest answers
    pings in hybrid mode with each. (The budget itself is invisible from
    outside but in the IO thread's spin counts; tests/unit/test_iothread.py
    drives it directly.)"""
    option = [] if budget is None else [f"--hybrid-budget={budget}"]
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, _ = ns.start_pyvmm(
            helpers.STATS, "--shm=hybrid", *option, "--net=tap100", guest("ping"), "10.0.0.2", "3"
        )
        helpers.ping(ns, "10.0.0.2", 3)
        out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0, out + err
    stats = helpers.parse_stats(err)
    assert stats["shmstream"]["mode"] == "hybrid"
    assert stats["shmstream"]["devices"]["service0"]["rx_frames"] >= 3


def test_help_gives_the_documented_defaults():
    result = run_pyvmm("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "(default 2000)" in text or "default: 2000" in text, result.stdout
    assert "512" in text


@pytest.mark.kvm
@pytest.mark.netns
def test_demo_boots_pings_and_shows_the_counters():
    """README's first command is scripts/demo (scripts/setup, then this)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "5 received" in out, out
    assert "# pyvmm exited with status 0" in out
    assert re.search(r"pyvmm\|   net service0: to the guest \d+ frames", out), out
    assert re.search(r"pyvmm\|   IO thread \(\w+\): guest kicks \d+", out), out
    name = re.search(r"^# namespace (\S+):", out, re.M).group(1)
    assert not os.path.exists(f"/var/run/netns/{name}"), "the demo left its namespace behind"
