"""A GDB remote stub for the guest: ``--gdb``, ``--gdb-port``, ``--gdb-socket``.

pyvmm listens (127.0.0.1, or a Unix socket) at set-up and waits for one
gdb to connect before the guest's first instruction and before the
seccomp filter goes on (the filter refuses socket calls); from then on the
stub only reads and writes that one connected socket. The guest stops in
gdb at its start, at a breakpoint, after a single step, on Ctrl-C and
when it faults; it ends in gdb as a process would (``W``/``X`` replies).

How each mode breaks and steps (docs/debugging.md, docs/pvm.md):

- level 0 (``kernel`` mode): KVM_SET_GUEST_DEBUG, single step and up to
  four hardware breakpoints in DR0-DR3 (``int3`` cannot run here:
  kvm_pvm's emulator stops), so Z0 is a hardware breakpoint too;
- deprivileged: the guest's #DB and ``int3`` enter pyvmm's own trap stubs
  (pyvmm/arch/x86_64/traps.py), which hand them to ``trap_stop`` here
  instead of the guest: rflags.TF in the trap frame for a single step,
  ``int3`` written over the guest's text for a breakpoint;
- user mode at level 3: neither (no IDT of pyvmm's there), so refused;
- aarch64: KVM_SET_GUEST_DEBUG with arm64's debug registers
  (pyvmm/arch/aarch64/debug.py): ``brk #0`` written over the guest's text
  for Z0 (KVM_GUESTDBG_USE_SW_BP), hardware breakpoints for Z1 and
  watchpoints for Z2-Z4 where KVM offers them, KVM_GUESTDBG_SINGLESTEP for
  a step; the exit's syndrome says which one stopped the guest. A
  watchpoint stops the guest before the access: resuming steps over it
  with the watchpoints off first.

Memory goes through the guest-memory accessor (pyvmm/kvm/memory.py): an
address outside the guest is an ``E`` reply, never a host access. Ctrl-C
(0x03) while the guest runs: a thread started before the filter watches
the socket and kicks the vCPU (immediate_exit and a signal to its thread,
the mechanism the stop signals use).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING

from pyvmm._native import ffi, lib
from pyvmm.common.errors import GuestFault, HostError, PyvmmError, Stopped, UsageError
from pyvmm.common.sizes import PAGE_SIZE
from pyvmm.host.peer import peer_uid, trusted
from pyvmm.kvm.ioctl import KvmError
from pyvmm.vm.debug import gdbregs
from pyvmm.vm.debug.gdbviews import Aarch64View, FaultView, FrameView, VcpuView
from pyvmm.vm.debug.regs import MACHINE
from pyvmm.vm.debug.rsp import MAX_PACKET, Connection, Disconnected, StopRequested, escape

if TYPE_CHECKING:
    from pyvmm.arch.x86_64.traps import Frame
    from pyvmm.kvm import Vcpu
    from pyvmm.kvm.exits import Debug
    from pyvmm.kvm.memory import GuestMemory

DEFAULT_PORT = 1234
SIGINT, SIGSEGV = 2, 11
#: The signal gdb is told for an x86 exception (as Linux sends a process).
EXCEPTION_SIGNALS = {0: 8, 4: 11, 5: 11, 6: 4, 7: 8, 12: 7, 13: 11, 14: 11, 16: 8, 17: 7, 19: 8}
HW_SLOTS = 4
INT3 = b"\xcc"
AARCH64 = MACHINE == "aarch64"
if AARCH64:
    from pyvmm.arch.aarch64 import debug as a64debug
DR6_BS = 1 << 14
_E_BAD, _E_FAULT, _E_NOSPC = "E01", "E0e", "E1c"
_WAKE_NS = 3600 * 10**9
_KICK = signal.SIGUSR2

SUPPORTED = (
    f"PacketSize={MAX_PACKET:x};qXfer:features:read+;swbreak+;hwbreak+;"
    "QStartNoAckMode+;vContSupported+"
)


class Killed(PyvmmError):
    """gdb's ``kill``: the run ends (status 137, as a process killed by SIGKILL)."""

    exit_status = 137


class Endpoint:
    """Where pyvmm listens: TCP on 127.0.0.1 (``port``) or a Unix socket."""

    def __init__(self, port: int | None = None, path: str | None = None) -> None:
        self.port, self.path = port, path

    def __str__(self) -> str:
        return self.path if self.path is not None else f"127.0.0.1:{self.port}"


class _Resume(Exception):
    """The serve loop ends: run the guest again (``step`` or not)."""

    def __init__(self, step: bool) -> None:
        self.step = step


class _Detach(Exception):
    """gdb detached (or went away): the guest runs on without it."""


# -- the stub -------------------------------------------------------------------
class GdbStub:
    """One debugging session of one vCPU (see the module doc)."""

    def __init__(
        self, endpoint: Endpoint, mode: str, vcpu: Vcpu, memory: GuestMemory, stop_fd: int
    ) -> None:
        if mode == "user":
            raise UsageError(
                "--gdb: a guest in user mode at level 3 cannot be debugged here (KVM gives "
                "no single step or breakpoint there): use --cpl=deprivileged or --cpl=0"
            )
        self.endpoint = endpoint
        self.target = gdbregs.TARGETS[MACHINE]
        self.deprivileged = mode == "deprivileged"
        self.vcpu = vcpu
        self.memory = memory
        self.stop_fd = stop_fd
        self.conn: Connection | None = None
        self.listener: socket.socket | None = None
        #: Who may connect besides root and pyvmm's own user (--user).
        self.allowed: frozenset[int] = frozenset()
        self.breakpoints: dict[int, bytes | None] = {}  # address -> the bytes int3/brk replaced
        #: Software breakpoints written into the text: deprivileged (int3) and aarch64 (brk).
        self.software = self.deprivileged or AARCH64
        self.trap = a64debug.BRK if AARCH64 else INT3
        #: Hardware breakpoint slots: DR0-DR3 at level 0, what arm64 KVM offers.
        self.hw_slots = a64debug.hardware_breakpoints(vcpu) if AARCH64 else HW_SLOTS
        self.hardware: dict[tuple[int, int, int], None] = {}  # (Z type, address, length)
        #: aarch64's watchpoint registers (x86_64: none, see _breakpoint).
        self.watch_slots = a64debug.hardware_watchpoints(vcpu) if AARCH64 else 0
        self.watchpoints: dict[tuple[int, int, int], None] = {}  # (Z type, address, length)
        #: Stopped at a watchpoint: the next resume first steps the access
        #: with the watchpoints off (it would only trigger again).
        self.over_watch = False
        self.stepping = False
        self.last_stop = b"T05thread:01;"
        self._debug_state: tuple | None = None
        self._armed = threading.Event()
        self._closing = False
        self._watcher: threading.Thread | None = None
        self._wake_fd = -1
        self._vcpu_thread = 0
        self._saved_kick = None
        self._listen()

    # -- connection -----------------------------------------------------------
    def _listen(self) -> None:
        ep = self.endpoint
        try:
            if ep.path is not None:
                if os.path.lexists(ep.path):
                    raise HostError(f"--gdb-socket: {ep.path} exists (pyvmm replaces no file)")
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    # Owner only, whatever the umask: bind(2) gives the
                    # path the socket inode's mode (less the umask).
                    os.fchmod(sock.fileno(), 0o600)
                    sock.bind(ep.path)
                except OSError:
                    sock.close()
                    raise
            else:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("127.0.0.1", ep.port))
                except OSError:
                    sock.close()
                    raise
                ep.port = sock.getsockname()[1]
            sock.listen(1)
        except OSError as err:
            what = "--gdb-socket" if ep.path is not None else "--gdb-port"
            raise HostError(f"{what}: cannot listen on {ep}: {err.strerror}") from None
        self.listener = sock

    def give_socket_to(self, user: str) -> None:
        """--user: a Unix socket belongs to the user the run ends as (who
        runs gdb; connecting needs write permission on the socket)."""
        from pyvmm.host.sandbox import resolve_user

        if self.endpoint.path is None:
            return
        try:
            uid, gid, _ = resolve_user(user)
        except HostError:
            return  # --user itself reports it
        self.allowed = frozenset({uid})
        try:
            os.chown(self.endpoint.path, uid, gid)
        except OSError as err:
            raise HostError(f"--gdb-socket: cannot give it to {user}: {err.strerror}") from None

    def accept(self, kernel: str) -> None:
        """Wait for gdb (before the filter and the guest's first
        instruction); a stop signal ends the wait."""
        assert self.listener is not None
        print(
            f"pyvmm: gdb: waiting for a debugger on {self.endpoint}; connect with:\n"
            f'pyvmm: gdb:   gdb -ex "target remote {self._target()}" {kernel}',
            file=sys.stderr,
            flush=True,
        )
        fds = ffi.new("int[2]", [self.listener.fileno(), self.stop_fd])
        ready = ffi.new("uint64_t *")
        while True:
            n = lib.pyvmm_wait_readable(fds, 2, _WAKE_NS, ready)
            if n < 0 and n != -4:  # -EINTR: again
                raise HostError(f"gdb: waiting for a connection: {os.strerror(-n)}")
            if n > 0 and ready[0] & 2:
                self._stopped()
            if not (n > 0 and ready[0] & 1):
                continue
            conn, _ = self.listener.accept()
            if conn.family != socket.AF_UNIX or trusted(peer_uid(conn), self.allowed):
                break
            # The socket's mode keeps others out; a peer that got in anyway
            # (a mode widened by hand) is not the debugger.
            print(
                f"pyvmm: gdb: refused a connection from uid {peer_uid(conn)} "
                "(root, pyvmm's user or --user only)",
                file=sys.stderr,
                flush=True,
            )
            conn.close()
        self._close_listener()  # one session: nothing else may connect
        if conn.family == socket.AF_INET:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = Connection(conn.detach(), self.stop_fd)
        self._start_watcher()

    def _target(self) -> str:
        if self.endpoint.path is not None:
            return self.endpoint.path
        return f"localhost:{self.endpoint.port}"

    def _close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            if self.endpoint.path is not None:
                try:
                    os.unlink(self.endpoint.path)
                except OSError:
                    pass

    def close(self) -> None:
        self._closing = True
        self._armed.set()
        if self._wake_fd >= 0:
            os.eventfd_write(self._wake_fd, 1)
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        if self._wake_fd >= 0:
            os.close(self._wake_fd)
            self._wake_fd = -1
        if self._saved_kick is not None:
            signal.signal(_KICK, self._saved_kick)
            self._saved_kick = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self._close_listener()

    @property
    def attached(self) -> bool:
        return self.conn is not None

    # -- Ctrl-C while the guest runs ----------------------------------------------
    def _start_watcher(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers are the main thread's: no Ctrl-C then
        self._saved_kick = signal.signal(_KICK, _ignore)
        self._vcpu_thread = threading.get_ident()
        self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._watcher = threading.Thread(target=self._watch, name="pyvmm-gdb", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        """While the guest runs, any byte from gdb kicks the vCPU; the vCPU
        thread then reads it (poll_interrupt)."""
        conn = self.conn
        assert conn is not None
        fds = ffi.new("int[2]", [conn.fd, self._wake_fd])
        ready = ffi.new("uint64_t *")
        while True:
            self._armed.wait()
            if self._closing:
                return
            n = lib.pyvmm_wait_readable(fds, 2, _WAKE_NS, ready)
            if self._closing:
                return
            if n > 0 and ready[0] & 2:
                try:
                    os.eventfd_read(self._wake_fd)
                except BlockingIOError:
                    pass
            if n > 0 and ready[0] & 1 and self._armed.is_set():
                self._armed.clear()
                self.vcpu.set_immediate_exit(True)
                signal.pthread_kill(self._vcpu_thread, _KICK)

    def _running(self) -> None:
        if self._wake_fd >= 0:
            self._armed.set()

    def _halted(self) -> None:
        """The guest is stopped: the watcher goes back to waiting, off the
        socket (which may be closed next)."""
        if self._wake_fd >= 0:
            self._armed.clear()
            os.eventfd_write(self._wake_fd, 1)

    # -- the run loop's hooks -------------------------------------------------------
    def _vcpu_view(self):
        return Aarch64View(self.vcpu) if AARCH64 else VcpuView(self.vcpu)

    def start(self) -> None:
        """The guest's first instruction is next: gdb takes over."""
        self._stop(self._vcpu_view(), self.last_stop, send=False)

    def interrupted(self) -> None:
        """KVM_RUN returned EINTR: gdb's Ctrl-C, or a stale kick."""
        self.vcpu.set_immediate_exit(False)
        if not self.attached:
            return
        self._halted()
        try:
            hit = self.conn.poll_interrupt()
        except Disconnected:
            self._detach()
            return
        except StopRequested:
            return  # the loop sees the stop signal
        if hit:
            self._stop(self._interrupted_view(), b"T02thread:01;")
        else:
            self._running()

    def _interrupted_view(self):
        if self.deprivileged:
            from pyvmm.vm.debug.regs import vcpu_registers

            if not vcpu_registers(self.vcpu)["cs"] & 3:  # inside pyvmm's trap entry
                return self._fault_view()
        return self._vcpu_view()

    def _fault_view(self) -> FaultView:
        """A faulted (or trap-entry) guest's registers, its FP state with them."""
        from pyvmm.vm.debug.gdbviews import fp_registers
        from pyvmm.vm.debug.regs import guest_registers

        values = guest_registers(self.vcpu, self.memory)
        try:
            values |= fp_registers(self.vcpu)
        except KvmError:
            pass
        return FaultView(values)

    def debug_exit(self, exit: Debug) -> bool:
        """A KVM_EXIT_DEBUG (level 0, aarch64): True when it was the stub's."""
        if not self.attached:
            return False
        if AARCH64:
            return self._aarch64_debug_exit(exit)
        self._halted()
        hit = exit.dr6 & 0xF
        reason = b""
        if hit:
            slot = (hit & -hit).bit_length() - 1
            slots = self._slots()
            if slot < len(slots):
                kind, addr, _ = slots[slot]
                reason = b"hwbreak:;" if kind in (0, 1) else b"watch:%x;" % addr
        elif self.stepping and exit.dr6 & DR6_BS:
            reason = b""
        elif not self.stepping:
            return False
        self._stop(VcpuView(self.vcpu), b"T05thread:01;" + reason)
        return True

    def _aarch64_debug_exit(self, exit: Debug) -> bool:
        """Which of the stub's it was, by the syndrome's exception class:
        a brk at one of its breakpoints, a hardware breakpoint, a step
        (its own step over a watchpoint: the guest goes on), a watchpoint
        (which one from the address accessed)."""
        ec = a64debug.exception_class(exit.hsr)
        view = Aarch64View(self.vcpu)
        if ec in a64debug.EC_STEP and self.over_watch:
            self.over_watch = False
            if not self.stepping:  # continue: the watchpoints back on
                self._apply_debug()
                return True
            reason = b""
        elif ec in a64debug.EC_WATCH:
            hit = a64debug.watch_hit(exit.far, list(self.watchpoints))
            if hit is None:
                return False
            kind, address, _ = hit
            reason = b"%s:%x;" % (a64debug.WATCH_REPLY[kind], address)
            self.over_watch = True
        elif ec == a64debug.EC_BRK and view.read()["pc"] in self.breakpoints:
            reason = b"swbreak:;"
        elif ec in a64debug.EC_HW_BREAK and self.hardware:
            reason = b"hwbreak:;"
        elif ec in a64debug.EC_STEP and self.stepping:
            reason = b""
        else:
            return False
        self._halted()
        self._stop(view, b"T05thread:01;" + reason)
        return True

    def trap_stop(self, frame: Frame, vector: int, address: int) -> bool:
        """Deprivileged: the guest's #DB (vector 1) or int3 (3, ``address``
        the int3's) reached pyvmm's stub. True when it was the stub's:
        ``frame`` then says where the guest goes on. Any other vector is an
        exception on its way to the guest's handler: gdb sees it first
        (False: the guest's handler gets it when gdb resumes)."""
        if not self.attached:
            return False
        if vector not in (1, 3):
            self._halted()
            signal = EXCEPTION_SIGNALS.get(vector, SIGSEGV)
            self._stop(FrameView(frame), b"T%02xthread:01;" % signal)
            return False
        if vector == 3:
            if address not in self.breakpoints:
                return False
            frame.rip = address
            reason = b"swbreak:;"
        elif self.stepping:
            reason = b""
        else:
            return False
        self._halted()
        self._stop(FrameView(frame), b"T05thread:01;" + reason)
        return True

    def faulted(self, err: GuestFault) -> None:
        """The guest faulted: it stops in gdb (SIGSEGV) where it was; any
        resume ends the run with the fault."""
        if not self.attached:
            return
        self._halted()
        view = self._fault_view()
        print(
            f"pyvmm: gdb: the guest stopped in gdb at its fault: {err}", file=sys.stderr, flush=True
        )
        try:
            self._stop(view, b"T0bthread:01;", final=True)
        except Killed:
            return  # the fault ends the run, as without gdb
        self._send_final(b"X0b")

    def exited(self, status: int) -> None:
        if self.attached:
            self._send_final(b"W%02x" % (status & 0xFF))

    def signalled(self, signum: int) -> None:
        if self.attached:
            self._send_final(b"X%02x" % (signum & 0xFF))

    def _send_final(self, packet: bytes) -> None:
        if self.conn is None:
            return
        self._halted()
        try:
            self.conn.send(packet)
        except Disconnected:
            pass
        self.conn.close()
        self.conn = None

    # -- stopped: serve gdb -----------------------------------------------------------
    def _stop(self, view, reply: bytes, final: bool = False, send: bool = True) -> None:
        """Answer gdb until it resumes the guest (or detaches, or kills it)."""
        self.last_stop = reply
        conn = self.conn
        if send:  # the first stop is told when gdb asks ('?')
            try:
                conn.send(reply)
            except Disconnected:
                self._detach(view)
                return
        while True:
            try:
                packet = conn.receive()
                answer = self.answer(packet, view, final)
            except _Resume as resume:
                self._resume(view, resume.step)
                return
            except (_Detach, Disconnected):
                self._detach(view)
                return
            except StopRequested:
                self._stopped()
            try:
                conn.send(answer)
            except Disconnected:
                self._detach(view)
                return
            if packet == b"QStartNoAckMode":
                conn.acks = False

    def _stopped(self) -> None:
        raise Stopped(lib.pyvmm_stop_signal() or SIGINT)

    def _resume(self, view, step: bool) -> None:
        self.stepping = step
        if self.deprivileged:
            view.set_trap_flag(step)
        else:
            self._apply_debug()
        self._running()

    def _detach(self, view=None) -> None:
        for address in list(self.breakpoints):
            self._remove_breakpoint(address)
        self.hardware.clear()
        self.watchpoints.clear()
        self.over_watch = False
        self.stepping = False
        if view is not None and self.deprivileged:
            try:
                view.set_trap_flag(False)
            except PyvmmError:
                pass
        if not self.deprivileged:
            self._apply_debug()
        self._halted()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        print("pyvmm: gdb: detached; the guest runs on", file=sys.stderr, flush=True)

    # -- packets ----------------------------------------------------------------------
    def answer(self, packet: bytes, view, final: bool = False) -> bytes:
        """The reply to one packet (raises _Resume, _Detach, Killed)."""
        try:
            return self._answer(packet, view, final)
        except (_Resume, _Detach, Killed):
            raise
        except GuestFault:
            return _E_FAULT.encode()
        except (ValueError, IndexError, KeyError, OverflowError, PyvmmError):
            return _E_BAD.encode()

    def _answer(self, packet: bytes, view, final: bool) -> bytes:
        cmd, rest = packet[:1], packet[1:]
        if cmd == b"q" or cmd == b"Q":
            return self._query(packet)
        if cmd == b"?":
            return self.last_stop
        target = self.target
        if cmd == b"g":
            return target.encode_all(view.read()).encode()
        if cmd == b"G":
            view.write(target.decode_all(bytes.fromhex(rest.decode())))
            return b"OK"
        if cmd == b"p":
            number = int(rest, 16)
            if not 0 <= number < len(target.registers):
                return _E_BAD.encode()
            return target.encode(number, view.read()).encode()
        if cmd == b"P":
            number, _, value = rest.partition(b"=")
            number = int(number, 16)
            if not 0 <= number < len(target.registers):
                return _E_BAD.encode()
            write = target.decode(number, bytes.fromhex(value.decode()))
            if write is not None:
                view.write(dict([write]))
            return b"OK"
        if cmd == b"m":
            address, length = _address_length(rest)
            return self.read_memory(address, min(length, (MAX_PACKET - 4) // 2)).hex().encode()
        if cmd in (b"M", b"X"):
            where, _, data = rest.partition(b":")
            address, length = _address_length(where)
            data = bytes.fromhex(data.decode()) if cmd == b"M" else data
            if len(data) != length:
                return _E_BAD.encode()
            self.write_memory(address, data)
            return b"OK"
        if cmd in (b"c", b"s", b"C", b"S"):
            if rest and cmd in (b"c", b"s"):
                view.write({"pc" if AARCH64 else "rip": int(rest, 16)})
            return self._go(cmd.lower() == b"s", final)
        if cmd == b"v":
            return self._v(packet, final)
        if cmd in (b"Z", b"z"):
            return self._breakpoint(cmd == b"Z", rest)
        if cmd == b"D":
            self.conn.send(b"OK")
            raise _Detach()
        if cmd == b"k":
            self._killed()
        if cmd in (b"H", b"T"):
            return b"OK"
        return b""

    def _go(self, step: bool, final: bool) -> bytes:
        if final:  # a faulted guest cannot go on: the run ends
            raise _Resume(False)
        raise _Resume(step)

    def _killed(self) -> None:
        self._halted()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        raise Killed("gdb: the debugger killed the guest")

    def _query(self, packet: bytes) -> bytes:
        if packet.startswith(b"qSupported"):
            return SUPPORTED.encode()
        if packet == b"QStartNoAckMode":
            return b"OK"
        if packet.startswith(b"qXfer:features:read:target.xml:"):
            offset, length = _address_length(packet.rsplit(b":", 1)[1])
            xml = self.target.xml
            chunk = xml[offset : offset + min(length, MAX_PACKET - 4)]
            more = offset + len(chunk) < len(xml)
            return (b"m" if more else b"l") + escape(chunk)
        if packet.startswith(b"qXfer:"):
            return b"E00"
        if packet == b"qC":
            return b"QC1"
        if packet == b"qfThreadInfo":
            return b"m1"
        if packet == b"qsThreadInfo":
            return b"l"
        if packet.startswith(b"qAttached"):
            return b"1"
        if packet.startswith(b"qSymbol"):
            return b"OK"
        return b""

    def _v(self, packet: bytes, final: bool) -> bytes:
        if packet == b"vCont?":
            return b"vCont;c;C;s;S"
        if packet.startswith(b"vCont;"):
            for action in packet[6:].split(b";"):
                verb, _, thread = action.partition(b":")
                if thread not in (b"", b"1", b"-1", b"p1.1", b"p1.-1", b"01"):
                    continue
                if verb[:1] in (b"c", b"C"):
                    return self._go(False, final)
                if verb[:1] in (b"s", b"S"):
                    return self._go(True, final)
            return _E_BAD.encode()
        if packet.startswith(b"vKill"):
            self._killed()
        return b""

    # -- memory -----------------------------------------------------------------------
    def read_memory(self, address: int, length: int) -> bytes:
        data = bytearray(self.memory.read(address, length, what="gdb read"))
        for bp, saved in self.breakpoints.items():  # gdb sees the guest's bytes
            if saved is None:
                continue
            for i, byte in enumerate(saved, bp - address):
                if 0 <= i < length:
                    data[i] = byte
        return bytes(data)

    def write_memory(self, address: int, data: bytes) -> None:
        """A write on the debugger's behalf: guest memory only, never the
        low area (page tables, pyvmm's trap tables); the guest's read-only
        ranges (its text) too, made writable on the host for the copy and
        left read-only (without PROT_EXEC, which the filter refuses and KVM
        does not need)."""
        memory = self.memory
        if not data:
            return
        memory.check(address, len(data), what="gdb write")  # inside guest memory
        if address < lib.PYVMM_LOW_AREA_END:
            raise GuestFault(f"gdb write at {address:#x}: pyvmm's low area")
        end = address + len(data)
        if not memory.is_read_only(address, end):
            memory.buffer(address, len(data), write=True, what="gdb write")[:] = data
            return
        memory.read(address, len(data), what="gdb write")  # its pages are there
        lo, hi = address & -PAGE_SIZE, -(-end // PAGE_SIZE) * PAGE_SIZE
        host = memory.host_addr
        read, write = lib.PYVMM_PROT_READ, lib.PYVMM_PROT_WRITE
        if lib.pyvmm_protect(host + lo, hi - lo, read | write) < 0:
            raise GuestFault(f"gdb write at {address:#x}: cannot make the page writable")
        try:
            ffi.memmove(ffi.cast("uint8_t *", host + address), data, len(data))
        finally:
            lib.pyvmm_protect(host + lo, hi - lo, read)

    # -- breakpoints ------------------------------------------------------------------
    def _breakpoint(self, insert: bool, rest: bytes) -> bytes:
        kind, _, where = rest.partition(b",")
        address, length = _address_length(where.split(b";", 1)[0])
        kind = int(kind)
        if kind in (2, 3, 4):
            return self._watchpoint(insert, kind, address, length)
        if kind == 0 and self.software:
            if insert:
                return self._insert_breakpoint(address)
            self._remove_breakpoint(address)
            return b"OK"
        if self.deprivileged or kind not in (0, 1) or not self.hw_slots:
            return b""  # deprivileged: no hardware breakpoints
        key = (kind, address, 1)
        if insert:
            if key not in self.hardware and len(self.hardware) >= self.hw_slots:
                return _E_NOSPC.encode()
            self.hardware[key] = None
        else:
            self.hardware.pop(key, None)
        return b"OK"

    def _watchpoint(self, insert: bool, kind: int, address: int, length: int) -> bytes:
        """Z2-Z4: arm64's watchpoint registers where KVM offers them. x86_64
        has none: kvm_pvm's level-0 emulator fires no data breakpoint
        (measured, docs/debugging.md) and deprivileged mode has no debug
        registers, so gdb falls back to its software watchpoints."""
        if not self.watch_slots:
            return b""
        key = (kind, address, length)
        if not insert:
            self.watchpoints.pop(key, None)
            return b"OK"
        a64debug.watch_registers(kind, address, length)  # ValueError: E01
        if key not in self.watchpoints and len(self.watchpoints) >= self.watch_slots:
            return _E_NOSPC.encode()
        self.watchpoints[key] = None
        return b"OK"

    def _insert_breakpoint(self, address: int) -> bytes:
        if address in self.breakpoints:
            return b"OK"
        saved = self.memory.read(address, len(self.trap), what="gdb breakpoint")
        self.write_memory(address, self.trap)
        self.breakpoints[address] = saved
        return b"OK"

    def _remove_breakpoint(self, address: int) -> None:
        saved = self.breakpoints.pop(address, None)
        if saved is not None:
            self.write_memory(address, saved)

    def _slots(self) -> list[tuple[int, int, int]]:
        return list(self.hardware)[: self.hw_slots]

    def _apply_debug(self) -> None:
        """Level 0 and aarch64: the single step, breakpoints (DR0-DR3;
        arm64's brk and breakpoint registers) as KVM_SET_GUEST_DEBUG."""
        from pyvmm.kvm import vcpu as kvm_vcpu

        slots = self._slots()
        # Stepping over a watchpoint's access: one step, no watchpoint.
        watches = () if self.over_watch else tuple(self.watchpoints)
        step = self.stepping or self.over_watch
        state = (step, tuple(slots), bool(self.breakpoints), watches)
        if state == self._debug_state:
            return
        if AARCH64:
            a64debug.set_guest_debug(
                self.vcpu,
                step=step,
                software=bool(self.breakpoints),
                breakpoints=tuple(address for _, address, _ in slots),
                watchpoints=watches,
            )
            self._debug_state = state
            return
        control = 0
        debugregs = [0] * 8
        if self.stepping or slots:
            control = kvm_vcpu.GUESTDBG_ENABLE
        if self.stepping:
            control |= kvm_vcpu.GUESTDBG_SINGLESTEP
        if slots:
            control |= kvm_vcpu.GUESTDBG_USE_HW_BP
            dr7 = 0
            for i, (kind, address, length) in enumerate(slots):
                debugregs[i] = address
                rw = {0: 0, 1: 0, 2: 1, 3: 3, 4: 3}[kind]  # exec, write, read/write
                size = {1: 0, 2: 1, 4: 3, 8: 2}[length]
                dr7 |= (1 << (2 * i)) | (rw << (16 + 4 * i)) | (size << (18 + 4 * i))
            debugregs[7] = dr7
        self.vcpu.set_guest_debug(control, tuple(debugregs))
        self._debug_state = state


def _address_length(text: bytes) -> tuple[int, int]:
    address, _, length = text.partition(b",")
    address, length = int(address, 16), int(length, 16)
    if address < 0 or length < 0 or address >= 1 << 64:
        raise ValueError(text)
    return address, length


def _ignore(signum: int, frame: object) -> None:
    """The vCPU kick's signal: it only interrupts KVM_RUN."""
