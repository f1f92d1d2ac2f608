"""--gdb: Debian's gdb, in batch mode, debugging guests over pyvmm's stub.

Every session runs with the sandbox on (the default), at level 0 and
deprivileged (user mode at level 3 is refused: KVM gives a debugger
nothing there, docs/debugging.md): breakpoints, continue, backtrace,
registers, a global read and written (the guest acts on the write), step
and finish, Ctrl-C of a spinning guest, a faulting guest stopping in gdb,
detach, kill, and a hostile client speaking raw packets. The tests check
what gdb printed and what the guest did, not only exit codes.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import guest, popen_pyvmm, run_pyvmm
from pyvmm.kvm.system import kvm_flavour
from pyvmm.vm.debug.symbols import SymbolFile
from scripts import solo5_build, solo5_check
from testkit.rspclient import RawClient

pytestmark = pytest.mark.kvm

MODES = ("--cpl=0", "--cpl=deprivileged")
# Hang guards only: a session takes a second or two.
TIMEOUT = 120
WAITING = re.compile(r"pyvmm: gdb: waiting for a debugger on (\S+);")


def gdb() -> str:
    path = shutil.which("gdb")
    if path is None:
        pytest.fail("gdb is not installed (scripts/setup installs it)")
    return path


class Session:
    """pyvmm waiting for gdb on a Unix socket in ``tmp``."""

    def __init__(self, tmp: Path, kernel: Path, *options: str, args: tuple[str, ...] = ()) -> None:
        self.kernel = kernel
        self.socket = tmp / "gdb.sock"
        self.pyvmm = popen_pyvmm(*options, f"--gdb-socket={self.socket}", kernel, *args)
        # A stderr line names the socket once it listens (-v: after others).
        self.log = ""
        while not WAITING.match(line := self.pyvmm.stderr.readline()):
            assert line, self.log + self.finish()[1]
            self.log += line
        assert WAITING.match(line).group(1) == str(self.socket)

    def gdb(self, *commands: str, interrupt_after: str | None = None) -> str:
        """gdb -batch with ``commands`` after connecting; its stdout+stderr.
        ``interrupt_after``: send gdb SIGINT (Ctrl-C) once the guest printed it."""
        argv = [gdb(), "-nx", "-batch", "-ex", "set pagination off"]
        argv += ["-ex", f"target remote {self.socket}"]
        for command in commands:
            argv += ["-ex", command]
        argv.append(str(self.kernel))
        client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if interrupt_after is not None:
            line = self.pyvmm.stdout.readline()
            assert interrupt_after in line, line
            client.send_signal(signal.SIGINT)
        try:
            out, _ = client.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            client.kill()
            out, _ = client.communicate()
            pytest.fail(f"gdb did not finish: {out}")
        return out

    def finish(self) -> tuple[str, str, int]:
        try:
            out, err = self.pyvmm.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.pyvmm.kill()
            out, err = self.pyvmm.communicate()
        return out, err, self.pyvmm.returncode


@pytest.fixture
def session(tmp_path):
    sessions: list[Session] = []

    def start(kernel: Path, *options: str, args: tuple[str, ...] = ()) -> Session:
        sessions.append(Session(tmp_path, kernel, *options, args=args))
        return sessions[-1]

    yield start
    for s in sessions:  # never leave a pyvmm behind, also on failure
        if s.pyvmm.poll() is None:
            s.pyvmm.kill()
            s.pyvmm.communicate()


@pytest.mark.parametrize("mode", MODES)
def test_break_step_finish_and_a_written_global_the_guest_acts_on(session, mode):
    s = session(guest("gdbtarget"), mode)
    out = s.gdb(
        "break solo5_app_main",
        "continue",
        "bt",
        "info registers rip",
        "print gdb_answer",
        "set var gdb_answer = 42",
        "step",
        "finish",
        "continue",
    )
    stdout, stderr, status = s.finish()
    assert "Breakpoint 1, solo5_app_main (" in out, out
    assert re.search(r"^#1 .* in rt_init \(", out, re.M), out
    assert re.search(r"^rip\s+0x[0-9a-f]+\s+0x[0-9a-f]+ <solo5_app_main(\+\d+)?>", out, re.M), out
    assert "$1 = 41" in out, out
    assert re.search(r"^twice \(value=42\) at gdbtarget\.c", out, re.M), out  # step
    assert "Value returned is $2 = 84" in out, out  # finish
    assert "[Inferior 1 (Remote target) exited normally]" in out, out
    assert "gdbtarget: answer 42, doubled 84" in stdout, stdout + stderr
    assert status == 0, stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_register_written_in_gdb_is_the_guests(session, mode):
    """At twice()'s first instruction its argument is in rdi: a P write
    there (deprivileged: into the trap frame's view) changes what it returns."""
    s = session(guest("gdbtarget"), mode)
    out = s.gdb("break *twice", "continue", "print $rdi", "set var $rdi = 50", "finish", "continue")
    stdout, stderr, status = s.finish()
    assert "$1 = 41" in out, out
    assert "Value returned is $2 = 100" in out, out
    assert "gdbtarget: answer 41, doubled 100" in stdout, stdout + stderr
    assert status == 1, stderr


@pytest.mark.parametrize("mode", MODES)
def test_sse_and_x87_registers_are_the_guests_and_a_written_xmm_reaches_it(session, mode):
    """gdbtarget loads known patterns into xmm0/xmm1 and stops in
    sse_mark(): gdb reads them (KVM_GET_XSAVE) and its write to xmm1
    (KVM_SET_XSAVE) is what the guest then stores and prints; the x87 and
    MXCSR state is the reset one (KVM_GET_FPU would say MXCSR 0), and st0
    and mxcsr written read back."""
    s = session(guest("gdbtarget"), mode)
    out = s.gdb(
        "break sse_mark",
        "continue",
        "p/x $xmm0.v4_int32",
        "info registers xmm1",
        "info registers fctrl fstat ftag mxcsr",
        "set var $st0 = 2.5",
        "p $st0",
        "set var $mxcsr = 0x9fc0",
        "p/x $mxcsr",
        "set var $xmm1.v4_int32 = {0xcafe, 0xbeef, 0x1234, 0x5678}",
        "continue",
    )
    stdout, stderr, status = s.finish()
    assert "Breakpoint 1, sse_mark () at gdbtarget.c" in out, out
    assert "$1 = {0x11223344, 0x55667788, 0x99aabbcc, 0xddeeff00}" in out, out
    xmm1 = r"^xmm1 .*v4_int32 = \{0x1020304, 0x5060708, 0x90a0b0c, 0xd0e0f10\}"
    assert re.search(xmm1, out, re.M), out
    assert re.search(r"^fctrl +0x37f", out, re.M), out  # FNINIT's state
    assert re.search(r"^fstat +0x0", out, re.M), out
    assert re.search(r"^ftag +0xffff", out, re.M), out  # every register empty
    assert re.search(r"^mxcsr +0x1f80 +\[ IM DM ZM OM UM PM \]", out, re.M), out  # reset
    assert "$2 = 2.5" in out, out
    assert "$3 = 0x9fc0" in out, out
    assert "gdbtarget: xmm1 cafe beef 1234 5678" in stdout, stdout + stderr
    assert status == 1, stderr


def test_hardware_breakpoint_at_level_0(session):
    s = session(guest("gdbtarget"), "--cpl=0")
    out = s.gdb("hbreak twice", "continue", "bt 1", "continue")
    stdout, _, status = s.finish()
    assert re.search(
        r"^Hardware assisted breakpoint 1 at 0x[0-9a-f]+: file gdbtarget\.c", out, re.M
    )
    assert "Breakpoint 1, twice (value=41)" in out, out
    assert "gdbtarget: answer 41, doubled 82" in stdout
    assert status == 1


@pytest.mark.parametrize(
    "bindings, mode",
    [("hvt", "--cpl=0"), ("hvt", "--cpl=deprivileged"), ("pyvmm", "--cpl=auto")],
    ids=("stock-cpl0", "stock-deprivileged", "relinked-auto"),
)
def test_solo5_test_hello_session(session, bindings, mode):
    """Solo5's own test program: its stock hvt build (debug info included)
    at level 0 and deprivileged, and relinked with pyvmm's bindings, which
    declares user mode: --cpl=auto runs it deprivileged under --gdb."""
    try:
        build = solo5_build.ensure(log=lambda message: None)
    except solo5_build.BuildError as err:
        pytest.fail(f"Solo5 from the release archive: {err}")
    kernel = solo5_check.programs(build, bindings) / "test_hello.hvt"
    s = session(kernel, mode, "--mem=64", args=("Hello_Solo5",))
    out = s.gdb("break solo5_app_main", "continue", "bt", "info registers", "continue")
    stdout, stderr, status = s.finish()
    assert re.search(r"Breakpoint 1, solo5_app_main \(si=.*\) at .*test_hello\.c:\d+", out), out
    assert re.search(r"^#0 +solo5_app_main \(", out, re.M), out
    assert re.search(r"^#1 +0x[0-9a-f]+ in (_start2?|rt_init) \(", out, re.M), out
    for register in ("rax", "rsp", "rip", "eflags", "cs", "fs_base"):
        assert re.search(rf"^{register}\s+0x[0-9a-f]+", out, re.M), (register, out)
    assert re.search(r"^rip\s+0x[0-9a-f]+\s+0x[0-9a-f]+ <solo5_app_main", out, re.M), out
    assert "[Inferior 1 (Remote target) exited normally]" in out, out
    assert "Hello, World" in stdout and "SUCCESS" in stdout, stdout + stderr
    assert status == 0, stderr


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_stops_a_spinning_guest(session, mode):
    s = session(guest("spin"), mode)
    out = s.gdb("continue", "bt", "info registers rip", "kill", interrupt_after="spinning")
    _, stderr, status = s.finish()
    assert "Program received signal SIGINT, Interrupt." in out, out
    # Stopped in the guest's code: the loop, or the puts just before it.
    assert re.search(r"^#[01] .*solo5_app_main \(", out, re.M), out
    assert re.search(r"^rip\s+0x[0-9a-f]+\s+0x[0-9a-f]+ <(solo5_app_main|rt_puts)\+\d+>", out, re.M)
    assert "pyvmm: gdb: the debugger killed the guest" in stderr, stderr
    assert status == 137, stderr


@pytest.mark.parametrize("mode", MODES)
def test_faulting_guest_stops_in_gdb_at_the_fault(session, mode):
    s = session(guest("fault_zeropage"), mode)
    out = s.gdb("continue", "bt", "info registers rip", "continue")
    _, stderr, status = s.finish()
    assert "Program received signal SIGSEGV, Segmentation fault." in out, out
    assert re.search(r"^#0 +solo5_app_main \(.*\) at fault_zeropage\.c:19", out, re.M), out
    assert re.search(r"^rip\s+0x10003e\s+0x10003e <solo5_app_main\+14>", out, re.M), out
    assert "Program terminated with signal SIGSEGV" in out, out
    assert "pyvmm: guest fault: access to unmapped page zero" in stderr.splitlines()[-1], stderr
    assert status == 1, stderr


def test_exception_stops_in_gdb_before_the_guests_handler(session):
    """Deprivileged, a guest with its own trap handlers (Solo5's): gdb sees
    the page fault at the faulting instruction first, then the guest's
    handler takes it (Solo5's aborts: 255). At level 0 KVM gives no such
    stop: the guest's handler runs at once."""
    try:
        build = solo5_build.ensure(log=lambda message: None)
    except solo5_build.BuildError as err:
        pytest.fail(f"Solo5 from the release archive: {err}")
    s = session(build.hvt_tests / "test_zeropage.hvt", "--cpl=deprivileged", "--mem=64")
    out = s.gdb("continue", "bt", "continue")
    stdout, stderr, status = s.finish()
    assert "Program received signal SIGSEGV, Segmentation fault." in out, out
    assert re.search(
        r"^#0 +0x[0-9a-f]+ in solo5_app_main \(.*\) at test_zeropage\.c:\d+", out, re.M
    )
    assert "[Inferior 1 (Remote target) exited with code 0377]" in out, out
    assert "Solo5: trap: type=#PF" in stdout + stderr, stdout + stderr
    assert status == 255, stderr


@pytest.mark.parametrize("mode", MODES)
def test_detach_lets_the_guest_run_on_without_breakpoints(session, mode):
    s = session(guest("gdbtarget"), mode)
    out = s.gdb("break twice", "continue", "break rt_puts", "detach")
    stdout, stderr, status = s.finish()
    assert "Breakpoint 1, twice (value=41)" in out, out
    assert "[Inferior 1 (Remote target) detached]" in out, out
    assert "pyvmm: gdb: detached; the guest runs on" in stderr, stderr
    assert "gdbtarget: answer 41, doubled 82" in stdout, stdout + stderr
    assert status == 1, stderr  # the guest's own status: 41 was not 42


@pytest.mark.parametrize("mode", MODES)
def test_software_watchpoint_by_single_steps(session, mode):
    """Watchpoints are gdb's own (stepping and comparing): kvm_pvm fires no
    data breakpoint at level 0, so the stub offers none (Z2 is refused)."""
    s = session(guest("gdbtarget"), mode)
    out = s.gdb(
        "set can-use-hw-watchpoints 0",
        "break solo5_app_main",
        "continue",
        "watch gdb_last",
        "continue",
        "bt 1",
        "kill",
    )
    s.finish()
    assert re.search(r"^Watchpoint 2: gdb_last$", out, re.M), out
    assert re.search(r"^Old value = 0\nNew value = 82$", out, re.M), out
    assert re.search(r"^#0 +twice \(", out, re.M), out


def test_user_mode_at_level_3_is_refused(tmp_path):
    result = run_pyvmm("--cpl=3", f"--gdb-socket={tmp_path / 's'}", guest("hello"))
    assert result.returncode == 2 or result.returncode == 1, result.stderr
    assert result.stderr.startswith("pyvmm: --gdb: a guest in user mode"), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not (tmp_path / "s").exists()


def test_auto_privilege_under_gdb_is_not_user_mode(session):
    """On a PVM host ``auto`` runs a guest that declares user mode at level
    3 directly, where gdb would get nothing: under --gdb it is deprivileged."""
    s = session(guest("hello"), "-v")
    out = s.gdb("break solo5_app_main", "continue", "continue")
    stdout, stderr, status = s.finish()
    assert "Breakpoint 1, solo5_app_main (" in out, out
    assert status == 0, stderr
    if kvm_flavour() == "pvm":
        assert "privilege: deprivileged mode" in s.log and "with --gdb" in s.log, s.log


@pytest.mark.parametrize(
    "options, error",
    [
        (("--gdb-port=70000",), "--gdb-port: '70000' is not a port number"),
        (("--gdb-port=x",), "--gdb-port: 'x' is not a port number"),
        (("--gdb-socket=",), "--gdb-socket: the socket's path is empty"),
        (("--gdb-port=0", "--gdb-socket=/tmp/x"), "--gdb-port and --gdb-socket: give one"),
    ],
)
def test_bad_gdb_options_are_one_line(options, error):
    result = run_pyvmm(*options, guest("hello"))
    assert result.returncode != 0
    assert result.stderr.startswith(f"pyvmm: {error}"), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_existing_socket_path_is_not_replaced(tmp_path):
    path = tmp_path / "taken"
    path.write_text("mine")
    result = run_pyvmm("--cpl=0", f"--gdb-socket={path}", guest("hello"))
    assert result.returncode == 1, result.stderr
    assert "exists" in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert path.read_text() == "mine"


# -- a hostile client ----------------------------------------------------------------
def test_hostile_client_gets_errors_and_pyvmm_survives(tmp_path):
    pyvmm = popen_pyvmm("--cpl=0", "--gdb-port=0", guest("gdbtarget"))
    try:
        line = pyvmm.stderr.readline()
        match = WAITING.match(line)
        assert match and match.group(1).startswith("127.0.0.1:"), line
        client = RawClient(int(match.group(1).rsplit(":", 1)[1]))
        # A bad checksum: '-', nothing done.
        client.send(b"$g#00")
        assert client.ack() == b"-"
        # Unknown packets: empty replies.
        assert client.ask(b"qNoSuchThing") == b""
        assert client.ask(b"vNoSuchThing;1") == b""
        assert client.ask(b"!") == b""
        # Malformed arguments: E replies.
        assert client.ask(b"mzz,10").startswith(b"E")
        assert client.ask(b"m100000").startswith(b"E")
        assert client.ask(b"pffff").startswith(b"E")
        assert client.ask(b"Z0,zz,1").startswith(b"E")
        assert client.ask(b"Z2,103000,4") == b""  # no hardware watchpoints offered
        # Memory outside the guest (and past 2^64), writes into pyvmm's low area.
        assert client.ask(b"m7fffffffffff,10").startswith(b"E")
        assert client.ask(b"mffffffffffffffff,10").startswith(b"E")
        assert client.ask(b"m1ffffffffffffffffff,1").startswith(b"E")
        assert client.ask(b"M7fffffff0000,2:9090").startswith(b"E")
        assert client.ask(b"M1000,1:cc").startswith(b"E")  # the page tables
        assert client.ask(b"M100000,4:90").startswith(b"E")  # length and data disagree
        assert client.ask(b"G0g").startswith(b"E")
        assert client.ask(b"P10=zz").startswith(b"E")
        assert client.ask(b"qXfer:features:read:target.xml:zz,1").startswith(b"E")
        assert client.ask(b"vCont;s:zzz").startswith(b"E")
        # The target description, in pieces.
        xml = client.ask(b"qXfer:features:read:target.xml:0,40")
        assert xml.startswith(b"m<?xml") and len(xml) == 0x41, xml
        # A binary write with escaped bytes ('}' 0x7d, '#' 0x23) reads back.
        symbols = SymbolFile.open(str(guest("gdbtarget")))
        answer = symbols.address_of("gdb_answer")
        symbols.close()
        assert client.ask(b"X%x,4:\x7d\x5d\x7d\x03\x01\x02" % answer) == b"OK"
        assert client.ask(b"m%x,4" % answer) == b"7d230102"
        # A huge length is capped to what one packet holds.
        reply = client.ask(b"m100000,ffffffffffff")
        assert 0 < len(reply) <= 16384 and re.fullmatch(rb"[0-9a-f]+", reply), reply[:80]
        # An overlong packet (no '#' for 100 KiB): dropped whole, '-'.
        client.send(b"$" + b"A" * 100_000 + b"#00")
        assert client.ack() == b"-"
        # Garbage between packets is skipped; the stub still answers.
        client.send(b"garbage\x00\xff")
        assert client.ask(b"qSupported:swbreak+").startswith(b"PacketSize=")
        registers = client.ask(b"g")
        assert re.fullmatch(rb"[0-9a-fx]+", registers), registers[:80]
        assert int.from_bytes(bytes.fromhex(registers[256:272].decode()), "little") == 0x100000
        # Registers written back whole (G) and one by one (P: rbx, number 1).
        assert client.ask(b"G" + registers) == b"OK"
        assert client.ask(b"g") == registers
        assert client.ask(b"P1=efbeadde00000000") == b"OK"
        assert client.ask(b"p1") == b"efbeadde00000000"
        assert client.ask(b"P1=" + registers[16:32]) == b"OK"
        client.send(client.packet(b"k"))
        assert client.ack() == b"+"
        _, err = pyvmm.communicate(timeout=TIMEOUT)
        assert pyvmm.returncode == 137, err
        assert "Traceback" not in err, err
        assert err.splitlines()[-1] == "pyvmm: gdb: the debugger killed the guest", err
    finally:
        if pyvmm.poll() is None:
            pyvmm.kill()
            pyvmm.communicate()


def test_client_that_reads_nothing_cannot_hold_pyvmm_against_a_stop_signal(tmp_path):
    """Requests whose replies fill the socket, never read: pyvmm waits for
    room but a SIGTERM still ends it (status 143), as without gdb."""
    pyvmm = popen_pyvmm("--cpl=0", "--gdb-port=0", guest("hello"))
    try:
        match = WAITING.match(pyvmm.stderr.readline())
        assert match
        client = RawClient(int(match.group(1).rsplit(":", 1)[1]))
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        request = client.packet(b"m100000,2000")
        client.sock.settimeout(None)
        client.sock.setblocking(False)
        sent = 0
        try:
            while sent < 4000:  # ~32 MiB of replies asked for
                client.sock.send(request)
                sent += 1
        except BlockingIOError:
            pass  # pyvmm stopped reading too: it is stuck on its own write
        pyvmm.send_signal(signal.SIGTERM)
        _, err = pyvmm.communicate(timeout=TIMEOUT)
        assert pyvmm.returncode == 143, err
        assert "Traceback" not in err, err
    finally:
        if pyvmm.poll() is None:
            pyvmm.kill()
            pyvmm.communicate()


def test_stop_signal_while_waiting_for_gdb_removes_the_socket(tmp_path):
    path = tmp_path / "gdb.sock"
    pyvmm = popen_pyvmm("--cpl=0", f"--gdb-socket={path}", guest("hello"))
    try:
        assert WAITING.match(pyvmm.stderr.readline())
        assert path.exists()
        pyvmm.send_signal(signal.SIGTERM)
        _, err = pyvmm.communicate(timeout=TIMEOUT)
        assert pyvmm.returncode == 143, err
        assert err.splitlines()[-1].startswith("pyvmm: stopped by SIGTERM"), err
        assert not path.exists()
    finally:
        if pyvmm.poll() is None:
            pyvmm.kill()
            pyvmm.communicate()


def test_socket_belongs_to_the_user_the_run_ends_as(tmp_path, session):
    """--user=nobody: the socket is nobody's (connecting needs write permission on it)."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    s = session(guest("gdbtarget"), "--cpl=0", "--user=nobody")
    assert (s.socket.stat().st_uid, s.socket.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid)
    out = s.gdb("continue")
    _, stderr, status = s.finish()
    assert "[Inferior 1 (Remote target) exited with code 01]" in out, out
    assert status == 1, stderr


def test_client_that_goes_away_while_stopped_is_a_detach(tmp_path):
    pyvmm = popen_pyvmm("--cpl=0", "--gdb-port=0", guest("hello"))
    try:
        match = WAITING.match(pyvmm.stderr.readline())
        assert match
        client = RawClient(int(match.group(1).rsplit(":", 1)[1]))
        assert client.ask(b"?").startswith(b"T05")
        client.sock.close()
        out, err = pyvmm.communicate(timeout=TIMEOUT)
        assert "Hello, world" in out, out + err
        assert pyvmm.returncode == 0, err
    finally:
        if pyvmm.poll() is None:
            pyvmm.kill()
            pyvmm.communicate()
