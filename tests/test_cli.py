"""The command line as a user meets it: stop signals at any
moment of start-up, both option syntaxes, suggestions, repeats, the --mem
note, hints, output errors, locked disks, log levels, --query-manifest,
and --help, the man page and completion made from one option table."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import random
import re
import select
import signal
import subprocess
import sys
import termios
import time

import pytest

from conftest import ROOT, guest, popen_pyvmm, run_pyvmm
from testkit import helpers
from testkit.netns import NetNamespace

PVM = os.path.exists("/sys/module/kvm_pvm")
ROUNDED = (
    "pyvmm: adjusting memory to 2097152 bytes (--mem=3 rounded down to 2 MiB: "
    "guest memory comes in 2 MiB steps)"
)


def one_line(result: subprocess.CompletedProcess, status: int = 1) -> str:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyvmm: "), result.stderr
    return lines[0]


def mem_size(result: subprocess.CompletedProcess) -> int:
    assert result.returncode == 0, result.stdout + result.stderr
    return int(re.search(r"^mem_size: (0x[0-9a-f]+)$", result.stdout, re.M).group(1), 16)


# -- stop signals at any moment of start-up --------------------------------------


def _wait_for_handlers(pid: int) -> None:
    deadline = time.monotonic() + 30
    while not helpers.handles_stop_signals(pid):
        assert time.monotonic() < deadline, "pyvmm never installed its stop handlers"
        time.sleep(0.0005)


# Delays after the handlers are in: through imports, option parsing, the
# plan, /dev/kvm and the VM set-up, into the guest's run (spin never ends).
DELAYS = [i * 0.01 for i in range(0, 16)]


@pytest.mark.kvm
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stop_signal_at_any_moment_of_start_up_gives_one_line(sig):
    """Every try ends with 128 + signal and exactly one line, whether the
    signal lands during imports, parsing, set-up or the run."""
    want = f"pyvmm: stopped by {sig.name} (Exiting on signal {sig.value})\n"
    for delay in [*DELAYS, "running"]:
        vm = popen_pyvmm("--mem=8", guest("spin"))
        _wait_for_handlers(vm.pid)
        if delay == "running":  # and once the guest surely runs
            assert vm.stdout.readline() == "spinning\n"
        else:
            time.sleep(delay)
        vm.send_signal(sig)
        out, err = vm.communicate(timeout=30)
        assert vm.returncode == 128 + sig, (delay, vm.returncode, err)
        assert err == want, (delay, err)


@pytest.mark.kvm
def test_ctrl_c_on_a_terminal_at_any_moment_of_start_up():
    """Ctrl-C typed on pyvmm's controlling terminal (a pty): the terminal
    driver sends SIGINT to the foreground group; status 130, one line."""
    for delay in DELAYS[::2]:

        def start(**kwargs) -> subprocess.Popen:
            argv = [sys.executable, "-m", "pyvmm", "--mem=8", str(guest("spin"))]
            return subprocess.Popen(argv, cwd=ROOT, **kwargs)

        _ctrl_c_on_a_terminal(start, _wait_for_handlers, delay)


def _ctrl_c_on_a_terminal(start, ready, delay: float) -> None:
    """Start pyvmm (``start(**popen_kwargs)``) on a new pty as its controlling
    terminal, wait until ``ready(pid)``, then ``delay`` seconds, type Ctrl-C:
    status 130 and the one line."""
    master, slave = pty.openpty()

    def own_terminal(slave=slave):
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    vm = start(stdin=slave, stdout=slave, stderr=slave, preexec_fn=own_terminal)
    os.close(slave)
    try:
        ready(vm.pid)
        time.sleep(delay)
        os.write(master, b"\x03")  # the terminal's VINTR character
        status = vm.wait(timeout=30)
        text = _read_all(master)
    finally:
        if vm.poll() is None:
            vm.kill()
            vm.wait()
        os.close(master)
    assert status == 130, (delay, status, text)
    assert _pyvmm_lines(text) == [INTERRUPTED], (delay, text)


# -- the interpreter's own start-up: the native launcher ---------------------------

LAUNCHER = ROOT / "pyvmm" / "_launcher"  # the pyvmm command (scripts/setup links it)


def _past_the_launchers_block(pid: int) -> bool:
    """The launcher has blocked the stop signals (SigBlk), or pyvmm's
    handlers are in (after the unblock): from either on, a stop signal must
    give the documented status and one line. Before that the process is
    still in execve, where any program takes the default action."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith("Sig"))
    except (OSError, ValueError):
        return False
    bit = 1 << (signal.SIGTERM - 1)
    return bool(int(fields["SigBlk"], 16) & bit or int(fields["SigCgt"], 16) & bit)


def _wait_for_launcher(pid: int) -> None:
    deadline = time.monotonic() + 30
    while not _past_the_launchers_block(pid):
        assert time.monotonic() < deadline, "the launcher never blocked the stop signals"
        time.sleep(0.0001)


def _launch(*args: str, **kwargs) -> subprocess.Popen:
    assert os.access(LAUNCHER, os.X_OK), f"{LAUNCHER} is missing: scripts/setup builds it"
    return subprocess.Popen([str(LAUNCHER), *map(str, args)], cwd=ROOT, **kwargs)


@pytest.mark.kvm
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stop_signal_during_the_interpreters_start_up_gives_one_line(sig):
    """Through the launcher, a signal at a random moment of the first 60 ms
    (the interpreter's own start-up, site, imports, the handlers' install):
    128 + signal and exactly one line, every time."""
    want = f"pyvmm: stopped by {sig.name} (Exiting on signal {sig.value})\n"
    rng = random.Random(int(sig))
    for _ in range(25):
        delay = rng.uniform(0, 0.06)
        vm = _launch("--mem=8", guest("spin"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _wait_for_launcher(vm.pid)
        time.sleep(delay)
        vm.send_signal(sig)
        out, err = vm.communicate(timeout=30)
        assert vm.returncode == 128 + sig, (delay, vm.returncode, err)
        assert err.decode() == want, (delay, err)


@pytest.mark.kvm
def test_ctrl_c_on_a_terminal_during_the_interpreters_start_up():
    """Ctrl-C on the launcher's controlling terminal at a random moment of
    its first 60 ms: status 130 and one line."""
    rng = random.Random(2)
    for _ in range(15):
        delay = rng.uniform(0, 0.06)
        _ctrl_c_on_a_terminal(
            lambda **kwargs: _launch("--mem=8", guest("spin"), **kwargs), _wait_for_launcher, delay
        )


INTERRUPTED = "pyvmm: stopped by SIGINT (Exiting on signal 2)"


def _pyvmm_lines(text: str) -> list[str]:
    """What a terminal shows besides the guest's own line (spin prints
    "spinning" once it runs, which a later Ctrl-C may follow) and the
    driver's echo of Ctrl-C ("^C", alone or before the next line)."""
    lines = [line.removeprefix("^C") for line in text.splitlines()]
    guest = [line for line in lines if line == "spinning"]
    assert len(guest) <= 1, text
    return [line for line in lines if line.strip() and line != "spinning"]


def _read_all(master: int) -> str:
    output = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the slave side is closed
            break
        if not chunk:
            break
        output += chunk
    return output.decode(errors="replace").replace("\r", "")


@pytest.mark.kvm
def test_the_launcher_runs_the_guest_and_passes_its_arguments():
    result = subprocess.run(
        [str(LAUNCHER), guest("args"), "--one", "two"], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert "--one" in result.stdout and "two" in result.stdout, result.stdout
    assert result.stderr == ""


def test_the_launcher_names_an_interpreter_it_cannot_start(tmp_path):
    missing = tmp_path / "python3"
    result = subprocess.run(
        [str(LAUNCHER), "--version"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYVMM_PYTHON=str(missing)),
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr == (
        f"pyvmm: cannot start the interpreter {missing}: No such file or directory "
        "(PYVMM_PYTHON names another)\n"
    )
    chosen = subprocess.run(
        [str(LAUNCHER), "--help"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYVMM_PYTHON=sys.executable),
        timeout=30,
    )
    assert chosen.returncode == 0 and chosen.stdout.startswith("usage: pyvmm"), chosen.stderr


def _as_nobody(*argv: str) -> subprocess.CompletedProcess:
    """cli.main(argv) in a process that became nobody (uid and gid 65534, no
    groups) after importing what --version needs: the interpreter's own
    files may be unreadable to nobody, /dev/kvm must be."""
    code = (
        "import os, sys, grp, pwd, textwrap\n"
        "from pyvmm.command import cli, hostinfo as host\n"
        "from pyvmm import kvm\n"
        "from pyvmm.common import errors\n"
        "import pyvmm.kvm.access\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        f"sys.exit(cli.main({list(argv)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="becomes nobody: needs root")
def test_version_where_kvm_cannot_be_opened_says_why_with_status_1():
    from pyvmm import __version__
    from pyvmm.kvm import access

    st = os.stat("/dev/kvm")
    if st.st_mode & 0o006 == 0o006:
        pytest.skip("/dev/kvm is open to everyone here")
    result = _as_nobody("--version")
    assert result.returncode == 1, result
    assert result.stdout == f"pyvmm {__version__} (Solo5 hvt ABI 2)\n"
    advice = access.advice("/dev/kvm", groups=[65534], user="nobody")
    assert result.stderr == (
        "pyvmm: no host facts: KVM cannot be used by this process (nor can guests run): "
        f"Could not open: /dev/kvm: no permission: {advice}\n"
    )
    if st.st_gid == 0 or not st.st_mode & 0o060:
        assert "join group" not in advice and "run as root" in advice, advice


# -- option syntax ---------------------------------------------------------------


@pytest.mark.kvm
@pytest.mark.parametrize("form", [["--mem=64"], ["--mem", "64"]])
def test_value_with_equals_or_as_the_next_argument(form):
    assert mem_size(run_pyvmm(*form, guest("edges"), "exit", "0")) == 64 << 20


@pytest.mark.kvm
def test_device_option_value_as_the_next_argument(disk):
    result = run_pyvmm("--block:storage", disk, "--cpl", "0", guest("blocktest"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.kvm
def test_arguments_after_kernel_belong_to_the_guest():
    result = run_pyvmm(guest("args"), "--mem", "64")
    assert result.returncode == 0, result.stderr
    assert "--mem 64" in result.stdout, result.stdout


X = "'x' is not a positive integer"
NR = "--no-net-ring=1"


def MEAN(name: str) -> str:
    return f"(did you mean {name}? see pyvmm --help)"


@pytest.mark.parametrize(
    "args, line",
    [
        (["--mem"], "pyvmm: --mem: missing value (--mem=N)"),
        (["--block:storage"], "pyvmm: --block:storage: missing value (--block:storage=PATH)"),
        (["--mem", "x", "k.hvt"], f"pyvmm: Malformed argument to --mem: {X}"),
        (["--stats-x", "k.hvt"], f"pyvmm: Invalid option: `--stats-x' {MEAN('--stats')}"),
        (["--vers"], f"pyvmm: Invalid option: `--vers' {MEAN('--version')}"),
        (["--hel"], f"pyvmm: Invalid option: `--hel' {MEAN('--help')}"),
        (["--mme=64", "k.hvt"], f"pyvmm: Invalid option: `--mme=64' {MEAN('--mem')}"),
        (["--nett:a=b", "k.hvt"], f"pyvmm: Invalid option: `--nett:a=b' {MEAN('--net:NAME')}"),
        (["--frobnicate", "k.hvt"], "pyvmm: Invalid option: `--frobnicate' (see pyvmm --help)"),
        (["--no-net-ring=1", "k.hvt"], f"pyvmm: --no-net-ring takes no value (given: {NR})"),
        (["--verbos", "k.hvt"], f"pyvmm: Invalid option: `--verbos' {MEAN('--verbose')}"),
    ],
)
def test_option_syntax_errors(args, line):
    assert one_line(run_pyvmm(*args)) == line


def test_verbose_is_the_long_form_of_v():
    from pyvmm.command.cli import parse_command

    assert parse_command(["--verbose", "k.hvt"]).log_level == "info"
    assert one_line(run_pyvmm("--verbose", "-v", "k.hvt")) == (
        "pyvmm: --verbose and -v both set the log level: give one of them"
    )


MISSING = "Could not open: No such file or directory"


@pytest.mark.parametrize(
    "args, line",
    [
        (["--stats", "1s", "k.hvt"], f"pyvmm: 1s: {MISSING} (did you mean --stats=1s?)"),
        (["--stats", "500ms"], f"pyvmm: 500ms: {MISSING} (did you mean --stats=500ms?)"),
        (
            ["--trace", "/nonexistent/t.json", "k.hvt"],
            f"pyvmm: /nonexistent/t.json: {MISSING} (did you mean --trace=/nonexistent/t.json?)",
        ),
        # Not an interval: no hint; the value given with '=': no hint.
        (["--stats", "k.hvt"], f"pyvmm: k.hvt: {MISSING}"),
        (["--stats=1s", "k.hvt"], f"pyvmm: k.hvt: {MISSING}"),
        (["--stats", "--mem=8", "1s"], f"pyvmm: 1s: {MISSING}"),
    ],
)
def test_an_optional_value_as_the_next_word_gets_a_hint(args, line):
    """--stats[=INTERVAL] takes its value only with '=' (the next word is
    KERNEL); when that word fails as a kernel and looks like the value,
    the line says how to write it (--trace's own timeline follows it)."""
    result = run_pyvmm(*args)
    assert result.returncode == 1, result
    assert result.stderr.splitlines()[0] == line


def test_an_optional_value_hint_also_when_the_word_is_a_file_but_no_kernel(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    result = run_pyvmm("--trace", trace, guest("hello"))
    assert result.returncode == 1, result
    assert result.stderr.splitlines()[0] == (
        f"pyvmm: {trace}: not an ELF file (did you mean --trace={trace}?)"
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["--mem=64", "--mem=128"], "--mem given twice (--mem=64, then --mem=128)"),
        (["--mem=64", "--mem", "64"], "--mem given twice (--mem=64, then --mem=64)"),
        (["--net=tap100", "--net=tap100"], "--net given twice (--net=tap100, then --net=tap100)"),
        (
            ["--net:service0=tap100", "--net:service0", "tap100"],
            "--net:service0 given twice (--net:service0=tap100, then --net:service0=tap100)",
        ),
        (["--stats", "--stats"], "--stats given twice (--stats, then --stats)"),
        (["--no-lock", "--no-lock"], "--no-lock given twice (--no-lock, then --no-lock)"),
        (["--cpl=0", "--cpl", "3"], "--cpl given twice (--cpl=0, then --cpl=3)"),
    ],
)
def test_every_option_may_be_given_once(args, line):
    got = one_line(run_pyvmm(*args, "k.hvt"))
    assert got == f"pyvmm: {line}: each option may be given once"


def test_two_options_for_one_setting_are_refused():
    got = one_line(run_pyvmm("-v", "--quiet", "k.hvt"))
    assert got == "pyvmm: -v and --quiet both set the log level: give one of them"


@pytest.mark.kvm
@pytest.mark.parametrize("cpl", ["0", "3"])
def test_mem_rounding_is_noted_on_stderr(cpl):
    result = run_pyvmm("--mem=3", f"--cpl={cpl}", guest("edges"), "exit", "0")
    assert mem_size(result) == 2 << 20
    assert result.stderr == ROUNDED + "\n"
    quiet = run_pyvmm("-q", "--mem=3", f"--cpl={cpl}", guest("edges"), "exit", "0")
    assert mem_size(quiet) == 2 << 20 and quiet.stderr == ""
    exact = run_pyvmm("--mem=4", f"--cpl={cpl}", guest("edges"), "exit", "0")
    assert mem_size(exact) == 4 << 20 and exact.stderr == ""


# -- hints -----------------------------------------------------------------------


def test_undeclared_device_lists_the_declared_names():
    line = one_line(run_pyvmm("--net:eth0=tap100", guest("ping")))
    assert line == (
        f"pyvmm: Resource not declared in manifest: 'eth0' ({guest('ping')} declares: service0)"
    )


def test_mem_too_small_for_shmstream_names_the_minimum_and_shm_off():
    line = one_line(run_pyvmm("--mem=2", "--net=tap100", guest("ping")))
    assert line == (
        "pyvmm: --mem=2 is too small for the shmstream region (2 MiB): give --mem=4 or more "
        "(the region and at least 2 MiB for the guest), or --shm=off for plain hypercalls"
    )


@pytest.mark.kvm
@pytest.mark.netns
def test_tap_in_another_namespace_names_it():
    with NetNamespace() as ns:
        ns.add_tap("tapelsewhere")
        line = one_line(run_pyvmm("--net=tapelsewhere", guest("ping")))
        assert line == (
            "pyvmm: Could not attach interface: tapelsewhere: tap device 'tapelsewhere' does "
            f"not exist in pyvmm's network namespace but in network namespace '{ns.name}' "
            f"(run pyvmm there: ip netns exec {ns.name} pyvmm ...; or pass an open tap fd: "
            "--net=@FD)"
        )


# -- output errors -----------------------------------------------------------------


@pytest.mark.kvm
def test_closed_stdout_is_refused_at_once():
    result = subprocess.run(
        [sys.executable, "-m", "pyvmm", str(guest("hello"))],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        timeout=60,
        preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 1
    assert result.stderr == (
        "pyvmm: standard output is closed: the guest's console output would be lost "
        "(redirect it to a file or /dev/null instead)\n"
    )


@pytest.mark.kvm
@pytest.mark.parametrize("args", [[], ["--help"], ["--query-manifest"]])
def test_a_full_stdout_is_an_error(args):
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "pyvmm", *args, str(guest("hello"))],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and "No space left on device" in line, result.stderr
    if not args:
        assert line == (
            "pyvmm: cannot write the guest's console output to standard output: "
            "No space left on device (the guest was stopped)"
        )


# -- locked disk images ------------------------------------------------------------


@pytest.mark.kvm
def test_a_disk_image_in_use_is_refused_naming_the_holder(disk):
    with open(disk, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        comm = open(f"/proc/{os.getpid()}/comm").read().strip()
        line = one_line(run_pyvmm(f"--block:storage={disk}", guest("blocktest")))
        assert line == (
            f"pyvmm: block device 'storage': {disk} is locked by another process "
            f"({comm}, pid {os.getpid()}) (pyvmm locks a disk image while a guest uses it; "
            "--no-lock attaches it anyway)"
        )
        forced = run_pyvmm("--no-lock", f"--block:storage={disk}", guest("blocktest"))
        assert forced.returncode == 0 and "SUCCESS" in forced.stdout, forced.stderr
    free = run_pyvmm(f"--block:storage={disk}", guest("blocktest"))
    assert free.returncode == 0 and "SUCCESS" in free.stdout, free.stderr


@pytest.mark.kvm
def test_two_pyvmm_processes_do_not_share_a_disk_image(disk):
    first = popen_pyvmm(f"--block:storage={disk}", guest("blockerr"))
    try:
        assert first.stdout.readline().startswith("ready"), first.stderr.read()
        line = one_line(run_pyvmm(f"--block:storage={disk}", guest("blocktest")))
        assert f"is locked by another process (python3, pid {first.pid})" in line or (
            f"pid {first.pid})" in line
        ), line
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)


# -- log levels --------------------------------------------------------------------


@pytest.mark.kvm
def test_default_output_has_nothing_extra(disk):
    result = run_pyvmm(f"--block:storage={disk}", guest("blocktest"))
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.kvm
@pytest.mark.parametrize("options", [["-v"], ["--log-level=info"], ["--log-level", "info"]])
def test_verbose_says_what_pyvmm_decided(disk, options):
    result = run_pyvmm(*options, "--cpl=0", f"--block:storage={disk}", guest("blocktest"))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert all(line.startswith("pyvmm: ") for line in lines), lines
    text = "\n".join(lines)
    assert "pyvmm: privilege: kernel mode, the guest's code at CPL 0 (--cpl=0)" in text
    assert re.search(r"pyvmm: memory: 512 MiB mapped, the guest may use 0x0-0x20000000", text)
    assert f"pyvmm: block device 'storage': {disk}, 1048576 bytes in blocks of 512" in text
    assert "registers" not in text


@pytest.mark.kvm
def test_debug_dumps_registers_on_a_fault():
    result = run_pyvmm("-vv", "--cpl=0", guest("fault_zeropage"))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    dump = [line for line in lines if line.startswith("pyvmm: vCPU registers at the fault: ")]
    assert len(dump) == 1 and re.search(r"\brip=0x[0-9a-f]+ .*\bcr2=0x0\b", dump[0]), lines
    assert lines[-1].startswith("pyvmm: guest fault: "), lines
    plain = run_pyvmm("--cpl=0", guest("fault_zeropage"))
    assert len(plain.stderr.splitlines()) == 1


@pytest.mark.kvm
def test_verbose_names_devices_in_the_syntax_the_command_takes(disk):
    """-v's device line is options one can paste: parsed again they give
    the same device settings."""
    from pyvmm.command.cli import parse_command

    given = [f"--block:storage={disk}", "--block-sector-size:storage=4096", "--no-lock"]
    result = run_pyvmm("-v", *given, guest("blocktest"))
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stderr.splitlines() if x.startswith("pyvmm: device 'storage'"))
    shown = line.split(": block, ", 1)[1].split(" ")
    assert shown == given, line
    assert parse_command([*shown, "k.hvt"]).config.devices == (
        parse_command([*given, "k.hvt"]).config.devices
    )


def test_bad_log_level():
    line = one_line(run_pyvmm("--log-level=loud", "k.hvt"))
    assert line == "pyvmm: --log-level: 'loud' is not one of error, warning, info, debug"


# -- --query-manifest --------------------------------------------------------------


def test_query_manifest_text():
    result = run_pyvmm("--query-manifest", guest("ping"))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.splitlines() == [
        f"{guest('ping')}: Solo5 hvt ABI version 2, x86_64",
        "devices (1):",
        "  service0  NET_BASIC  --net:service0=IFACE",
        "pyvmm capabilities: user mode (CPL 3, native speed on PVM hosts); "
        "shmstream driver (pyvmm's ring network device)",
    ]


def test_query_manifest_json_is_solo5_elftools_object_plus_pyvmms_facts():
    result = run_pyvmm("--query-manifest", "--json", guest("blocktest"))
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["type"] == "solo5.manifest" and facts["version"] == 1
    assert [(d["name"], d["type"]) for d in facts["devices"]] == [("storage", "BLOCK_BASIC")]
    assert facts["abi"] == {"target": "hvt", "version": 2}
    assert set(facts["capabilities"]) == {"user_mode", "shmstream"}


@pytest.mark.parametrize(
    "option",
    ["--mem=64", "--cpl=3", "--block:storage=disk.img", "--net=tap100", "--no-lock", "--stats"],
)
def test_query_manifest_refuses_options_it_would_ignore(option):
    assert one_line(run_pyvmm("--query-manifest", option, guest("ping"))) == (
        f"pyvmm: {option} has no effect with --query-manifest (it reads KERNEL's notes and "
        "runs nothing): leave it out"
    )


@pytest.mark.parametrize("options", [["-v"], ["-q"], ["--json"], ["--log-level=debug"]])
def test_query_manifest_takes_json_and_the_log_levels(options):
    result = run_pyvmm("--query-manifest", *options, guest("ping"))
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_query_manifest_takes_only_the_kernel():
    line = one_line(run_pyvmm("--query-manifest", guest("ping"), "--json"))
    assert line.startswith("pyvmm: --query-manifest takes only KERNEL"), line
    assert one_line(run_pyvmm("--json", guest("ping"))) == (
        "pyvmm: --json applies only to --query-manifest"
    )
    bad = one_line(run_pyvmm("--query-manifest", ROOT / "README.md"))
    assert bad.startswith("pyvmm: "), bad


# -- --help, the man page, completion: one table -----------------------------------


def test_help_lists_every_option_of_the_table_exit_statuses_and_environment():
    from pyvmm.command import cli

    text = run_pyvmm("--help").stdout
    assert text == cli.usage()
    flat = " ".join(text.split())  # long lines are wrapped
    for entry in cli.help_entries():
        assert re.search(rf"^  {re.escape(entry.form)}( |$)", text, re.M), entry.form
        assert f"{entry.form} {' '.join(entry.help.split())}" in flat, entry.form
    for status, meaning in cli.EXIT_STATUSES:
        assert re.search(rf"^  {re.escape(status)} ", text, re.M), status
        assert f"{status} {' '.join(meaning.split())}" in flat, status
    for name, meaning in cli.ENVIRONMENT:
        assert re.search(rf"^  {re.escape(name)} ", text, re.M), name
        assert f"{name} {' '.join(meaning.split())}" in flat, name
    assert run_pyvmm("-h").stdout == text


def test_help_fits_80_columns():
    text = run_pyvmm("--help").stdout
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert wide == [], wide


def test_help_lists_every_environment_variable_pyvmm_reads():
    """Every PYVMM_* name in quotes in pyvmm's source and the launcher is a
    variable users may set, and --help names it (pyvmm-oci's own are in
    its help; names that are module attributes are not variables)."""
    import pyvmm.loader
    from pyvmm.command import cli

    sources = [p for p in (ROOT / "pyvmm").rglob("*.py") if "oci" not in p.parts]
    sources.append(ROOT / "csrc" / "launcher.c")
    read = set()
    for path in sources:
        read |= set(re.findall(r"[\"'](PYVMM_[A-Z_]+)[\"']", path.read_text()))
    read = {name for name in read if not hasattr(pyvmm.loader, name)}
    listed = {name.split("=")[0] for name, _ in cli.ENVIRONMENT}
    assert "PYVMM_SANDBOX_SELFTEST" in read
    assert read <= listed, read - listed


def test_man_page_and_completion_are_generated_from_the_table():
    from pyvmm.command import cli, clidocs

    man = (ROOT / "docs" / "pyvmm.1").read_text()
    assert man == clidocs.man_page(), "docs/pyvmm.1 is stale: run scripts/cli_docs.py"
    completion = (ROOT / "scripts" / "pyvmm-completion.bash").read_text()
    assert completion == clidocs.bash_completion(), "stale: run scripts/cli_docs.py"
    for entry in cli.help_entries():
        assert clidocs.roff(entry.form) in man, entry.form
        for name in entry.names:
            assert name in completion, name
    for _status, meaning in cli.EXIT_STATUSES:
        assert clidocs.roff(meaning) in man
    for name, meaning in cli.ENVIRONMENT:
        assert clidocs.roff(name.split("=")[0]) in man and clidocs.roff(meaning) in man


def test_bash_completion_completes_options_and_values():
    script = ROOT / "scripts" / "pyvmm-completion.bash"

    def complete(*words: str) -> list[str]:
        line = " ".join(["pyvmm", *words])
        probe = (
            f"source {script}; COMP_WORDS=(pyvmm {' '.join(repr(w) for w in words)}); "
            f"COMP_CWORD={len(words)}; COMP_LINE={line!r}; COMP_POINT={len(line)}; "
            "_pyvmm; printf '%s\\n' \"${COMPREPLY[@]}\""
        )
        done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert "--mem=" in complete("--me")
    assert set(complete("--shm=")) == {"--shm=off", "--shm=poll", "--shm=event", "--shm=hybrid"}
    assert "--query-manifest" in complete("--que")
    assert "--net:" in complete("--ne")


def _complete(line: str, words: list[str]) -> list[str]:
    """What the completion function replies for ``line`` (the cursor at its
    end) with bash's own split of it into ``words`` (COMP_WORDBREAKS)."""
    script = ROOT / "scripts" / "pyvmm-completion.bash"
    probe = (
        f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
        f"COMP_CWORD={len(words) - 1}; COMP_LINE={line!r}; COMP_POINT={len(line)}; "
        "_pyvmm; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    done = subprocess.run(
        ["bash", "-c", probe], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completion_offers_the_forms_users_type():
    """--stats alone and --stats=, --mem= and --mem (its value the next word)."""
    assert set(_complete("pyvmm --st", ["pyvmm", "--st"])) == {
        "--stats",
        "--stats=",
        "--stats-json",
        "--stats-json=",
    }
    assert set(_complete("pyvmm --me", ["pyvmm", "--me"])) == {"--mem", "--mem="}
    assert "--verbose" in _complete("pyvmm --verb", ["pyvmm", "--verb"])


def test_bash_completion_with_bashs_own_word_breaks():
    """bash splits --shm=po at '=' (COMP_WORDBREAKS) and replaces only 'po'."""
    assert _complete("pyvmm --shm=po", ["pyvmm", "--shm", "=", "po"]) == ["poll"]
    assert set(_complete("pyvmm --shm=", ["pyvmm", "--shm", "="])) == {
        "off",
        "poll",
        "event",
        "hybrid",
    }
    readme = _complete(
        "pyvmm --block:storage=READ", ["pyvmm", "--block", ":", "storage", "=", "READ"]
    )
    assert readme == ["README.md"]


def test_bash_completion_of_a_value_as_the_next_word():
    assert set(_complete("pyvmm --cpl ", ["pyvmm", "--cpl", ""])) == {
        "auto",
        "0",
        "3",
        "deprivileged",
    }
    assert _complete(
        "pyvmm --block:storage READ", ["pyvmm", "--block", ":", "storage", "READ"]
    ) == ["README.md"]
    # --mem's value is skipped: --cp is still an option; after --stats
    # (no separate value) the next word is KERNEL: files.
    assert "--cpl" in _complete("pyvmm --mem 64 --cp", ["pyvmm", "--mem", "64", "--cp"])
    assert _complete("pyvmm --stats READ", ["pyvmm", "--stats", "READ"]) == ["README.md"]
    assert _complete("pyvmm k.hvt --cp", ["pyvmm", "k.hvt", "--cp"]) == []


def test_readme_lists_every_option():
    from pyvmm.command import cli

    usage = (ROOT / "README.md").read_text().split("## Usage", 1)[1].split("\n## ", 1)[0]
    for entry in cli.help_entries():
        for name in entry.names:
            assert name.rstrip(":") in usage, name
    for name, _meaning in cli.ENVIRONMENT:
        assert name in usage, name
