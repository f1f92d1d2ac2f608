"""The launcher: one single-threaded process, a selectors loop, a child per VM.

It never has a second thread, so that every fork copies a process in a
known state: requests, the VMs' channels (child.py), their pidfds (a
pidfd becomes readable when its process ends, so no SIGCHLD handler is
needed) and the stop signals (through ``signal.set_wakeup_fd``) are all
events of one ``selectors`` loop, and timeouts are a small heap of
deadlines. docs/serve.md has the API.

Nothing a client or a VM's process sends can end it: who may connect is
checked (peer.py), every request and every resource it asks for is
bounded (http.py, limits.py), every message of a VM's process is checked
before use (events.py) and a bad one ends that VM only.
"""

from __future__ import annotations

import array
import contextlib
import errno
import heapq
import itertools
import os
import signal
import socket
import stat
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pyvmm import __version__
from pyvmm.common.errors import PyvmmError, stop_message
from pyvmm.common.stopping import internal_error
from pyvmm.host.peer import peer_pid, peer_uid, trusted
from pyvmm.serve import http
from pyvmm.serve.events import MAX_MESSAGE, BadMessage, parse_event
from pyvmm.serve.http import HttpError, Request, error_body
from pyvmm.serve.limits import Limits
from pyvmm.serve.relay import StderrRelay
from pyvmm.serve.routes import API_VERSION, route
from pyvmm.serve.snapshot import ANSWER_TIMEOUT as SNAPSHOT_TIMEOUT
from pyvmm.serve.snapshot import Taking, checked_request
from pyvmm.serve.vms import (
    KNOWN_KEYS,
    MAX_FDS,
    MAX_PATH,
    Vm,
    checked_id,
    describe_status,
    optional_path,
    pool_key,
    prepare,
    spawn,
)
from pyvmm.serve.warm import HostFacts
from pyvmm.vm.snapshot.identity import loaded_sha256

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: How long a VM gets to end after its stop signal before SIGKILL (s).
STOP_GRACE = 10.0
#: How long a running VM gets to answer for its counters (s).
STATS_TIMEOUT = 2.0
#: Ended VMs kept for GET (the oldest go first).
MAX_EXITED = 256
#: Signals a stop request may name.
STOP_REQUEST_SIGNALS = {s.name: s for s in (*STOP_SIGNALS, signal.SIGKILL)}
_RECV_FDS = 4
#: VMs a pool may hold ready for one command line.
MAX_POOL = 16
#: How long after a pooled VM's start its replacement is prepared (s).
REFILL_DELAY = 0.02
#: How long the launcher stops accepting when it is out of fds (s).
ACCEPT_PAUSE = 0.25


class Pool:
    """VMs prepared ahead for one command line (argv and cwd): each is set
    up to its first instruction and waits; a create with the same command
    line takes one (docs/serve.md), and the pool is refilled once it runs."""

    def __init__(self, key: tuple, size: int) -> None:
        self.key = key
        self.size = size
        self.ready: list[Vm] = []
        self.preparing: list[Vm] = []
        self.error: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            "argv": list(self.key[0]),
            "cwd": self.key[1],
            "size": self.size,
            "ready": len(self.ready),
            "preparing": len(self.preparing),
            "error": self.error,
        }


class ContainerPool:
    """A VM prepared ahead for the next container of an image and command
    line (pyvmm-oci's warm path): made once one such container's VM runs,
    taken by the next create that matches. ``fd``: the launcher's own
    descriptor of the unikernel, which the pool's command line names."""

    def __init__(self, key: tuple, fd: int, argv: list[str]) -> None:
        self.key, self.fd, self.argv = key, fd, argv
        self.ready: list[Vm] = []
        self.preparing: list[Vm] = []

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Conn:
    """One client connection: a request in, one response out."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader: http.RequestReader | None = http.RequestReader()
        self.arrived_ns: int | None = None
        self.fds: list[int] = []
        self.out = b""
        self.done = False  # a response was given (or the client went away)
        self.continued = False

    def close(self) -> None:
        self.done = True
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        self.sock.close()


class Launcher:
    def __init__(self, path: str, facts: HostFacts, limits: Limits | None = None) -> None:
        import selectors

        self.path = path
        self.facts = facts
        self.limits = limits or Limits()
        self.selector = selectors.DefaultSelector()
        self.vms: dict[str, Vm] = {}
        self.live: dict[int, Vm] = {}  # by pid, until reaped
        self.conns: set[Conn] = set()
        self.waiters: dict[int, list[tuple[Conn, str]]] = {}  # by pid
        self.stats_waiters: dict[int, deque[Conn]] = {}
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self.pools: dict[tuple, Pool] = {}
        self._pool_ids = itertools.count(1)
        #: Containers' VMs (pyvmm-oci's warm create) not started yet, by
        #: pid: None, or the start asked for (its time, its console fds).
        self.startable: dict[int, tuple[int, list[int]] | None] = {}
        #: Containers whose create failed after their VM's fork: their
        #: state and cgroup go once the VM is reaped.
        self.held: dict[int, Any] = {}
        #: VMs prepared ahead for containers, by image and command line.
        self.container_pools: dict[tuple, ContainerPool] = {}
        #: The last create's command line and directory (``_rehearse``).
        self._last_create: dict[str, Any] | None = None
        self.stopping = 0
        self.listener = self._listen(path)
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self.selector.register(self.listener, 1, self._accept)
        self.selector.register(self._wake_r, 1, self._woken)
        #: One fd kept free for the moment the launcher has no other: it
        #: takes the waiting client's connection to say why, then returns.
        self._reserve = _reserve_fd()
        self._accepting = True

    # -- the socket --------------------------------------------------------------

    def _listen(self, path: str) -> socket.socket:
        _check_directory(path)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise PyvmmError(f"--api-sock={path}: exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
                raise PyvmmError(f"--api-sock={path}: a launcher already listens there")
            except ConnectionRefusedError:
                os.unlink(path)  # left by a launcher that was killed
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old = os.umask(0o177)  # owner only: the API runs guests as this user
            try:
                sock.bind(path)
            finally:
                os.umask(old)
            sock.listen(128)
        except OSError as err:
            sock.close()
            raise PyvmmError(f"--api-sock={path}: {err.strerror}") from None
        sock.setblocking(False)
        self._ino = os.stat(path).st_ino
        return sock

    def _unlink(self) -> None:
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._ino:
                os.unlink(self.path)

    # -- the loop ----------------------------------------------------------------

    def serve(self) -> int:
        """Serve until a stop signal and every VM has ended; 128 + signal."""
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        try:
            while not (self.stopping and not self.live):
                if self._pending_signal:  # (one taken before the wake-up fd was set, too)
                    self._woken(0)
                timeout = None
                if self.timers:
                    timeout = max(0.0, self.timers[0][0] - time.monotonic())
                for key, mask in self.selector.select(timeout):
                    key.data(mask)
                self._run_timers()
            self._drain()
        finally:
            signal.set_wakeup_fd(-1)
            self._close()
        return 128 + self.stopping

    _pending_signal = 0

    @classmethod
    def take_signals(cls) -> None:
        """From now on a stop signal is recorded for the loop (and SIGUSR1,
        the command's counters, is ignored: the launcher has none)."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, cls._on_signal)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    def _drain(self, seconds: float = 1.0) -> None:
        """Every VM has ended: answer the connections still queued or
        reading (a client that asked for a VM's end as it came), briefly."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            events = self.selector.select(0.05 if self.conns else 0)
            if not events and not self.conns:
                return
            for key, mask in events:
                key.data(mask)

    @classmethod
    def _on_signal(cls, signum: int, frame: Any) -> None:
        # Only recorded here; the loop sees it through the wake-up fd.
        cls._pending_signal = signum

    def _woken(self, mask: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(64):
                pass
        signum = Launcher._pending_signal
        if signum:
            Launcher._pending_signal = 0
            self._shutdown(signum)

    def _shutdown(self, signum: int) -> None:
        """Stop every VM (SIGTERM, SIGKILL after STOP_GRACE) and end; a
        second stop signal kills them at once."""
        first = not self.stopping
        self.stopping = self.stopping or signum
        if first:
            # Nobody new can connect; those already queued are still served.
            self._unlink()
        self.pools.clear()
        for vm in list(self.live.values()):
            self._signal(vm, signal.SIGTERM if first else signal.SIGKILL)
        if first:
            self._after(STOP_GRACE, self._kill_all)

    def _kill_all(self) -> None:
        for vm in list(self.live.values()):
            self._signal(vm, signal.SIGKILL)

    def _after(self, seconds: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.timers, (time.monotonic() + seconds, next(self._seq), action))

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            heapq.heappop(self.timers)[2]()

    def _close(self) -> None:
        """What is left: pending answers (best effort), every fd."""
        for conn in list(self.conns):
            if conn.out:
                conn.sock.setblocking(True)
                conn.sock.settimeout(0.5)
                with contextlib.suppress(OSError):
                    conn.sock.sendall(conn.out)
            conn.close()
        self.listener.close()
        for ahead in self.container_pools.values():
            ahead.close()
        if not self.stopping:
            self._unlink()
        self._wake_r.close()
        self._wake_w.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        for vm in self.live.values():
            if vm.relay is not None:
                vm.relay.close()
        self.selector.close()

    def close_in_child(self) -> None:
        """In a VM's child right after the fork: drop every launcher fd
        (detached first, so that no Python object closes a reused number)."""
        signal.set_wakeup_fd(-1)
        self.selector.close()
        socks = [self.listener, self._wake_r, self._wake_w]
        socks += [conn.sock for conn in self.conns]
        socks += [vm.channel for vm in self.live.values()]
        for sock in socks:
            if sock.fileno() >= 0:
                os.close(sock.detach())
        for conn in self.conns:
            for fd in conn.fds:
                os.close(fd)
        for vm in self.live.values():
            os.close(vm.pidfd)
            if vm.relay is not None and vm.relay.fd >= 0:
                os.close(vm.relay.fd)
        if self._reserve is not None:
            os.close(self._reserve)
        if self._spawning is not None:  # this VM's own relay: its write end stays
            os.close(self._spawning.fd)

    # -- connections -------------------------------------------------------------

    def _accept(self, mask: int) -> None:
        while self._accepting:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._out_of_fds(err)
                return  # (ECONNABORTED and the like: that client is gone)
            self._pause_logged = False
            refusal = self._refusal(sock)
            if refusal is not None:
                _refuse(sock, *refusal)
                continue
            sock.setblocking(False)
            conn = Conn(sock)
            self.conns.add(conn)
            self.selector.register(sock, 1, lambda m, c=conn: self._readable(c))
            self._after(self.limits.request_timeout, lambda c=conn: self._too_slow(c))

    def _refusal(self, sock: socket.socket) -> tuple[int, str] | None:
        """Why this connection is not served, if it is not: its user, or
        the launcher's connection limit."""
        try:
            uid = peer_uid(sock)
        except OSError as err:
            return 400, f"pyvmm: who is connecting cannot be told: {err.strerror}"
        if not trusted(uid, self.limits.allow_uids):
            return 403, (
                f"pyvmm: uid {uid} may not use this launcher (it serves root, uid "
                f"{os.geteuid()} and those of pyvmm serve --allow-uid)"
            )
        if len(self.conns) >= self.limits.max_connections:
            return 503, (
                f"pyvmm: the launcher has {len(self.conns)} connections open "
                "(pyvmm serve --max-connections): try again later"
            )
        return None

    _pause_logged = False

    def _out_of_fds(self, err: OSError) -> None:
        """accept(2) fails but the listener stays readable: say so to the
        waiting client (through the reserve fd), then stop polling the
        listener for a while instead of spinning on it."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
            with contextlib.suppress(OSError):
                sock, _ = self.listener.accept()
                why = f"pyvmm: the launcher is out of file descriptors ({err.strerror})"
                _refuse(sock, 503, why)
            self._reserve = _reserve_fd()
        if not self._pause_logged:
            self._pause_logged = True
            why = f"cannot accept ({err.strerror}): pausing {ACCEPT_PAUSE} s at a time"
            _log(f"launcher {os.getpid()}: {why}")
        self._accepting = False
        self.selector.unregister(self.listener)
        self._after(ACCEPT_PAUSE, self._resume_accepting)

    def _resume_accepting(self) -> None:
        if not self._accepting and self.listener.fileno() >= 0:
            if self._reserve is None:
                self._reserve = _reserve_fd()
            self._accepting = True
            self.selector.register(self.listener, 1, self._accept)

    def _too_slow(self, conn: Conn) -> None:
        """The request timeout: a request not yet in gets 408; an answer
        not yet taken is dropped. A request waiting for its VM stays."""
        if conn not in self.conns:
            return
        if not conn.done:
            if conn.reader is not None:
                seconds = self.limits.request_timeout
                self._respond(conn, 408, error_body(f"the request did not arrive in {seconds} s"))
        elif conn.out:
            self._drop(conn)

    def _readable(self, conn: Conn) -> None:
        try:
            data, ancillary, flags, _ = conn.sock.recvmsg(
                65536, socket.CMSG_SPACE(_RECV_FDS * 4), socket.MSG_CMSG_CLOEXEC
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, ancillary, flags = b"", [], 0
        fds = _passed_fds(ancillary)
        if conn.reader is None or conn.done:
            # A request is being answered: more bytes are ignored, more fds closed.
            _close_fds(fds)
            if not data:  # the client went away (a waiting one too)
                self._drop(conn)
            return
        conn.fds += fds
        if not data:
            self._drop(conn)
            return
        if conn.arrived_ns is None:
            conn.arrived_ns = time.monotonic_ns()
        try:
            if flags & socket.MSG_CTRUNC or len(conn.fds) > MAX_FDS:
                raise HttpError(400, f"at most {MAX_FDS} file descriptors (stdout, stderr)")
            request = conn.reader.feed(data)
            if request is None:
                self._continue(conn)
                return
        except HttpError as err:
            _close_fds(conn.fds)
            conn.fds.clear()
            self._respond(conn, err.status, err.body())
            return
        conn.reader = None
        request.fds, conn.fds = conn.fds, []
        try:
            answer = self._dispatch(conn, request)
        except HttpError as err:
            answer = (err.status, err.body())
        except Exception as err:  # a launcher bug: this request fails, serving goes on
            answer = (500, error_body(f"pyvmm: {internal_error(err)}"))
        finally:
            _close_fds(request.fds)
        if answer is not None:
            self._respond(conn, *answer)

    def _continue(self, conn: Conn) -> None:
        """curl waits for "100 Continue" before a large body."""
        head = conn.reader.head if conn.reader is not None else None
        if head and not conn.continued and head[3].get("expect", "").lower() == "100-continue":
            conn.continued = True
            with contextlib.suppress(OSError):
                conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _respond(self, conn: Conn, status: int, body: Any) -> None:
        if conn.done:
            return
        conn.done = True
        conn.out = http.response(status, body)
        self._flush(conn)
        if conn.out:
            self.selector.modify(conn.sock, 2, lambda m, c=conn: self._flush(c))
            self._after(self.limits.request_timeout, lambda c=conn: self._too_slow(c))

    def _flush(self, conn: Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
            conn.out = conn.out[sent:]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            conn.out = b""
        if not conn.out:
            self._drop(conn)

    def _drop(self, conn: Conn) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            self.selector.unregister(conn.sock)
            conn.close()

    # -- the API -----------------------------------------------------------------

    def _dispatch(self, conn: Conn, req: Request) -> tuple[int, Any] | None:
        operation, vm_id = route(req.method, req.path)
        if operation == "info":
            return 200, {
                "pyvmm": __version__,
                "api": API_VERSION,
                "pid": os.getpid(),
                "vms": len(self.vms),
                "limits": self.limits.view(),
            }
        if operation == "openapi":
            from pyvmm.serve.openapi import document

            return 200, document()
        if operation == "list_vms":
            return 200, {"vms": [vm.view() for vm in self.vms.values()]}
        if operation == "create_vm":
            return self._create(conn, req)
        if operation == "list_pools":
            return 200, {"pools": [pool.view() for pool in self.pools.values()]}
        if operation == "create_pool":
            return self._pool(req)
        if operation == "delete_pools":
            return self._delete_pools()
        if operation == "create_container":
            return self._create_container(conn, req)
        vm = self.vms.get(vm_id or "")
        if vm is None:
            raise HttpError(404, f"no VM with id {(vm_id or '')[:80]!r}")
        if operation == "get_vm":
            return 200, vm.view()
        if operation == "delete_vm":
            return self._stop(conn, vm, req, forget=True)
        if operation == "stop_vm":
            return self._stop(conn, vm, req, forget=False)
        if operation == "wait_vm":
            return self._wait(conn, vm)
        if operation == "start_vm":
            return self._start_held(conn, vm, req)
        if operation == "snapshot_vm":
            return self._snapshot(conn, vm, req)
        return self._stats(conn, vm)  # "vm_stats"

    def _create(self, conn: Conn, req: Request) -> None:
        if self.stopping:
            raise HttpError(503, "pyvmm: the launcher is stopping")
        cpu = time.thread_time_ns()
        body = req.json()
        if not isinstance(body.get("wait", False), bool):
            raise HttpError(400, '"wait" must be true or false')
        arrived = conn.arrived_ns or time.monotonic_ns()
        pool = self.pools.get(pool_key(body)) if set(body) <= KNOWN_KEYS else None
        if pool is not None and pool.ready:
            vm = self._start_pooled(pool, body, req.fds, arrived)
        else:
            self._room_for_a_vm()
            prepared = prepare(body, req.fds, self.facts)
            self._last_create = {"argv": prepared.argv, "cwd": prepared.cwd}
            vm_id = self._new_id(prepared.id)
            vm = self._spawn(vm_id, prepared, arrived)
            self._track(vm)
        self.vms[vm.id] = vm
        # "wait": true answers at the end (the client's one connection).
        kind = "create+wait" if body.get("wait") is True else "create"
        self.waiters[vm.pid].append((conn, kind))
        vm.cpu_ns["launcher"] = time.thread_time_ns() - cpu
        return None

    def _room_for_a_vm(self) -> None:
        if len(self.live) >= self.limits.max_vms:
            raise HttpError(
                503,
                f"pyvmm: the launcher runs {len(self.live)} VM processes already, pooled "
                "ones included (pyvmm serve --max-vms)",
            )

    def _spawn(self, vm_id: str, prepared: Any, arrived: int) -> Vm:
        """Fork the VM; one with no console of its own writes its stderr
        through a relay that names it in the launcher's log (relay.py)."""
        spec = prepared.spec
        relay = None
        if spec.stderr_path is None and not spec.fds and not spec.pooled:
            relay = self._spawning = _relay(vm_id)
            spec.fds = [relay.stdout, relay.write_fd]
        try:
            vm = spawn(vm_id, prepared, arrived, self.close_in_child)
        except BaseException:
            if relay is not None:
                relay.close()
            raise
        finally:
            self._spawning = None
            if relay is not None:
                relay.given()
                spec.fds = []
        vm.relay = relay
        return vm

    _spawning: StderrRelay | None = None

    def _new_id(self, vm_id: str | None) -> str:
        if vm_id is None:
            vm_id = str(next(self._ids))
            while vm_id in self.vms:
                vm_id = str(next(self._ids))
        elif vm_id in self.vms:
            raise HttpError(409, f"a VM with id {vm_id!r} exists (DELETE it first)")
        return vm_id

    def _track(self, vm: Vm) -> None:
        self.live[vm.pid] = vm
        self.waiters[vm.pid] = []
        self.stats_waiters[vm.pid] = deque()
        self.selector.register(vm.channel, 1, lambda m, v=vm: self._channel(v))
        self.selector.register(vm.pidfd, 1, lambda m, v=vm: self._reap(v))
        if vm.relay is not None:
            self._watch_relay(vm)

    def _watch_relay(self, vm: Vm) -> None:
        relay = vm.relay
        assert relay is not None

        def readable(mask: int) -> None:
            if not relay.read():
                self.selector.unregister(relay.fd)
                relay.close()

        self.selector.register(relay.fd, 1, readable)

    def _close_relay(self, vm: Vm) -> None:
        """Its last lines, then the pipe (once its process has ended)."""
        relay, vm.relay = vm.relay, None
        if relay is not None and relay.fd >= 0:
            relay.read()
            self.selector.unregister(relay.fd)
            relay.close()

    # -- containers: prepared at pyvmm-oci's create, started at its start ----------

    def _create_container(self, conn: Conn, req: Request) -> tuple[int, Any]:
        """pyvmm-oci's warm create (docs/orchestration.md): the container's
        VM forked from its bundle's command line, moved into its cgroup
        with the relay, the container's state written; answered then, while
        the VM sets itself up to its first instruction and waits for POST
        /vms/ID/start. Only root and the launcher's own user may ask: the
        state and the cgroup are written as the launcher's user."""
        from pyvmm.oci import warm as oci_warm

        if self.stopping:
            raise HttpError(503, "pyvmm: the launcher is stopping")
        relay, uid = peer_pid(conn.sock), peer_uid(conn.sock)
        if not trusted(uid):
            raise HttpError(403, f"pyvmm: uid {uid} may not create containers (root only)")
        body = req.json()
        vm_id = self._new_id(checked_id({"id": body.get("vm")}))
        self._room_for_a_vm()
        arrived = conn.arrived_ns or time.monotonic_ns()
        try:
            container = oci_warm.prepare(body)
        except oci_warm.Refused as err:  # 501: not for the warm path, the cold one will do
            raise HttpError(501 if err.cold else 400, str(err)) from None
        try:
            key = container.pool_key()
            vm = self._take_prepared(key, vm_id, arrived)
            if vm is None:
                prepared = prepare({"argv": container.argv}, [], self.facts)
                prepared.spec.pooled = True  # set up to its first instruction, then waits
                vm = spawn(vm_id, prepared, arrived, self.close_in_child)
                self._track(vm)
                self._container_pool(key, container)
        except BaseException:
            container.remove()
            raise
        finally:
            container.close()  # the unikernel's descriptor: read, and the child keeps none
        vm.pooled, vm.refill = True, ("container", key) if key is not None else None
        self.vms[vm.id] = vm
        try:  # at once: what the child touches from now on is the container's
            container.join(vm.pid)
            container.ready(vm.id, vm.pid, relay)
        except oci_warm.Refused as err:
            self.held[vm.pid] = container  # removed at its reap
            vm.error, vm.listed = str(err), False
            self._signal(vm, signal.SIGKILL)
            raise HttpError(400, str(err)) from None
        self.startable[vm.pid] = None
        return 201, vm.view()

    def _take_prepared(self, key: tuple | None, vm_id: str, arrived: int) -> Vm | None:
        """A VM prepared ahead for this image and command line, if one is ready."""
        pool = self.container_pools.get(key) if key is not None else None
        if pool is None or not pool.ready:
            return None
        vm = pool.ready.pop(0)
        vm.id, vm.listed, vm.pool, vm.arrived_ns = vm_id, True, None, arrived
        return vm

    def _container_pool(self, key: tuple | None, container: Any) -> None:
        """The pool for this image and command line (filled once its first
        container's VM runs; the oldest pool goes past --max-pools)."""
        if key is None or key in self.container_pools:
            return
        if len(self.container_pools) >= self.limits.max_pools:
            self._end_container_pool(next(iter(self.container_pools)))
        fd = container.image_copy()
        self.container_pools[key] = ContainerPool(key, fd, container.pool_argv(fd))

    def _end_container_pool(self, key: tuple) -> None:
        pool = self.container_pools.pop(key)
        for vm in pool.ready + pool.preparing:
            self._signal(vm, signal.SIGTERM)
        pool.close()

    def _fill_container_pool(self, key: tuple) -> None:
        """Prepare the pool's VM (one at a time, not while stopping, nor past
        --max-vms: then the next container forks its own)."""
        pool = self.container_pools.get(key)
        if self.stopping or pool is None or pool.ready or pool.preparing:
            return
        try:
            self._room_for_a_vm()
            prepared = prepare({"argv": pool.argv}, [], self.facts)
            prepared.spec.pooled = True
            vm_id = f"pool:{next(self._pool_ids)}"
            vm = spawn(vm_id, prepared, time.monotonic_ns(), self.close_in_child)
        except HttpError:
            return  # (the image changed, no room): the next container forks its own
        vm.listed, vm.pool = False, ("container", key)
        pool.preparing.append(vm)
        self._track(vm)

    def _start_held(self, conn: Conn, vm: Vm, req: Request) -> None:
        """POST /vms/ID/start: a container's VM gets its console (the fds
        passed) and its start, at once if it is prepared, else as soon as
        it is; answered once it runs, or at its end with "wait"."""
        body = req.json()
        wait = body.get("wait", False)
        if set(body) - {"wait"} or not isinstance(wait, bool):
            raise HttpError(400, 'a start takes only "wait" (true or false), and the console fds')
        if vm.pid not in self.startable or self.startable[vm.pid] is not None:
            if vm.state == "exited":
                why = vm.error or f"pyvmm: VM {vm.id} ended before its start"
                raise HttpError(500, why, vm.exit_status)
            raise HttpError(409, f"VM {vm.id} is {vm.state}: only a container's VM is started")
        if len(req.fds) > MAX_FDS:
            raise HttpError(400, f"at most {MAX_FDS} file descriptors (stdout, stderr)")
        fds, req.fds = req.fds, []  # this start's now: closed once the VM has them
        arrived = conn.arrived_ns or time.monotonic_ns()
        self.waiters[vm.pid].append((conn, "start+wait" if wait else "start"))
        self.startable[vm.pid] = (arrived, fds)
        if vm.state == "ready":
            self._go(vm)
        return None

    def _go(self, vm: Vm) -> None:
        """A container's VM, prepared and asked to start: its console and go."""
        import json

        arrived, fds = self.startable.pop(vm.pid)
        message = b"go" + json.dumps({"arrived_ns": arrived}).encode()
        try:
            socket.send_fds(vm.channel, [message], fds)
        except OSError as err:
            self._signal(vm, signal.SIGKILL)
            vm.error = f"pyvmm: the VM did not take its start: {err}"
        finally:
            _close_fds(fds)
        vm.state, vm.arrived_ns = "starting", arrived

    # -- pools ---------------------------------------------------------------------

    def _container_pool_of(self, vm: Vm) -> ContainerPool | None:
        if vm.pool is None or vm.pool[0] != "container":
            return None
        return self.container_pools.get(vm.pool[1])

    def _delete_pools(self) -> tuple[int, Any]:
        for pool in self.pools.values():
            for vm in pool.ready + pool.preparing:
                self._signal(vm, signal.SIGTERM)
                self._after(STOP_GRACE, lambda v=vm: self._signal(v, signal.SIGKILL))
        self.pools.clear()
        for key in list(self.container_pools):
            self._end_container_pool(key)
        return 200, {"pools": []}

    def _pool(self, req: Request) -> tuple[int, Any]:
        if self.stopping:
            raise HttpError(503, "pyvmm: the launcher is stopping")
        body = req.json()
        size = body.pop("size", 1)
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_POOL:
            raise HttpError(400, f'"size" must be an integer from 1 to {MAX_POOL}')
        if {"id", "stdout", "stderr"} & set(body):
            raise HttpError(400, "a pool takes argv and cwd (ids and consoles come with a create)")
        prepare(body, [], self.facts).close()  # the command's errors, now
        key = pool_key(body)
        if key not in self.pools and len(self.pools) >= self.limits.max_pools:
            raise HttpError(
                503,
                f"pyvmm: the launcher has {len(self.pools)} pools already (pyvmm serve "
                "--max-pools): DELETE /pool first",
            )
        pool = self.pools.setdefault(key, Pool(key, size))
        pool.size, pool.error = size, None
        self._fill(pool)
        return 201, pool.view()

    def _fill(self, pool: Pool) -> None:
        """Prepare VMs until the pool holds its size (not while stopping,
        nor beyond the launcher's VM limit: then the pool says so)."""
        if self.stopping or self.pools.get(pool.key) is not pool:
            return
        argv, cwd = pool.key
        while len(pool.ready) + len(pool.preparing) < pool.size:
            try:
                self._room_for_a_vm()
                prepared = prepare({"argv": list(argv), "cwd": cwd}, [], self.facts)
            except HttpError as err:
                pool.error = str(err)
                return
            prepared.spec.pooled = True
            vm_id = f"pool:{next(self._pool_ids)}"  # never a VM's id (':' is refused there)
            vm = spawn(vm_id, prepared, time.monotonic_ns(), self.close_in_child)
            vm.listed, vm.pool = False, pool.key
            pool.preparing.append(vm)
            self._track(vm)

    def _start_pooled(self, pool: Pool, body: dict[str, Any], fds: list[int], arrived: int) -> Vm:
        """Hand a prepared VM its console and its start."""
        import json

        console: dict[str, Any] = {"arrived_ns": arrived}
        for key in ("stdout", "stderr"):
            value = optional_path(body, key)
            if value is not None:
                console[key] = value
        if len(fds) > MAX_FDS:
            raise HttpError(400, f"at most {MAX_FDS} file descriptors (stdout, stderr)")
        vm_id = self._new_id(checked_id(body))
        message = b"go" + json.dumps(console).encode()
        assert len(message) < MAX_MESSAGE  # (the paths' bound keeps it short)
        relay = None
        if "stderr" not in console and not fds:
            relay = _relay(vm_id)
            fds = [relay.stdout, relay.write_fd]
        vm = pool.ready.pop(0)
        try:
            socket.send_fds(vm.channel, [message], fds)
        except OSError as err:
            self._signal(vm, signal.SIGKILL)
            if relay is not None:
                relay.close()
            raise HttpError(503, f"pyvmm: a pooled VM did not take its start: {err}") from None
        finally:
            if relay is not None:
                relay.given()
        vm.id, vm.listed, vm.pooled, vm.pool = vm_id, True, True, None
        vm.state, vm.arrived_ns, vm.refill = "starting", arrived, pool.key
        if relay is not None:
            vm.relay = relay
            self._watch_relay(vm)
        return vm

    def _rehearse(self) -> None:
        """The last create prepared again and thrown away, once its VM runs.

        A fork leaves every page of this process shared with the child and
        write-protected, so the next request's parse and plan took a
        copy-on-write fault on each page they write: 1-1.3 ms of CPU
        instead of 0.15 (docs/serve.md). Doing the same work now, while
        nothing waits for it, takes those faults off the next request's
        path; the pages are the ones the next request would copy anyway.
        Its unikernel's identity is made now too, once per kernel read (a
        SHA-256 of its loaded bytes): its VMs inherit it, and a snapshot of
        one then does not hash it while its guest is stopped."""
        last = self._last_create
        if last is None:
            return
        with contextlib.suppress(Exception):
            prepared = prepare(dict(last), [], self.facts)
            prepared.close()
            loaded_sha256(prepared.spec.plan.kernel)

    def _refill(self, vm: Vm) -> None:
        """A pooled VM has started (or failed to): prepare the next one."""
        key, vm.refill = vm.refill, None
        if key is not None and key[0] == "container":
            self._fill_container_pool(key[1])
            return
        pool = self.pools.get(key) if key is not None else None
        if pool is not None:
            self._fill(pool)

    def _stop(self, conn: Conn, vm: Vm, req: Request, *, forget: bool) -> tuple[int, Any] | None:
        name = req.json().get("signal", "SIGTERM")
        signum = STOP_REQUEST_SIGNALS.get(name) if isinstance(name, str) else None
        if signum is None:
            known = ", ".join(STOP_REQUEST_SIGNALS)
            raise HttpError(400, f"signal: {repr(name)[:40]} is not one of {known}")
        if vm.state == "exited":
            if forget:
                del self.vms[vm.id]
            return 200, vm.view()
        self.waiters[vm.pid].append((conn, "delete" if forget else "stop"))
        self._signal(vm, signum)
        self._after(STOP_GRACE, lambda: self._signal(vm, signal.SIGKILL))
        return None

    def _signal(self, vm: Vm, signum: int) -> None:
        if vm.state != "exited":
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(vm.pidfd, signum)

    def _wait(self, conn: Conn, vm: Vm) -> tuple[int, Any] | None:
        if vm.state == "exited":
            return 200, vm.view()
        self.waiters[vm.pid].append((conn, "wait"))
        return None

    def _stats(self, conn: Conn, vm: Vm) -> tuple[int, Any] | None:
        if vm.state == "exited":
            if vm.final is None:
                raise HttpError(
                    409, f"VM {vm.id} ended before its guest ran: no counters", vm.exit_status
                )
            return 200, vm.final
        if vm.state != "running":
            raise HttpError(409, f"VM {vm.id} is {vm.state}: no counters yet")
        try:
            vm.channel.send(b"s")
        except OSError as err:
            raise HttpError(503, f"VM {vm.id} does not answer: {err.strerror}") from None
        self.stats_waiters[vm.pid].append(conn)

        def too_late() -> None:
            if not conn.done:
                late = f"VM {vm.id} did not answer in {STATS_TIMEOUT} s"
                self._respond(conn, 504, error_body(late))

        self._after(STATS_TIMEOUT, too_late)
        return None

    # -- snapshots (snapshot.py) --------------------------------------------------

    def _snapshot(self, conn: Conn, vm: Vm, req: Request) -> tuple[int, Any] | None:
        path, stop = checked_request(req.json(), MAX_PATH)
        if vm.state != "running":
            raise HttpError(409, f"VM {vm.id} is {vm.state}: no snapshot", vm.exit_status)
        if vm.snapshot is not None:
            raise HttpError(409, f"VM {vm.id}: a snapshot of it is being taken already")
        taking = Taking(path, stop, vm.pid)
        try:
            vm.channel.send(taking.request())
        except OSError as err:
            taking.remove()
            raise HttpError(503, f"VM {vm.id} does not answer: {err.strerror}") from None
        vm.snapshot = (taking, conn)

        def too_late() -> None:
            if vm.snapshot is not None and vm.snapshot[0] is taking:
                self._snapshot_failed(vm, 504, f"VM {vm.id} did not stop its vCPU in time")

        self._after(SNAPSHOT_TIMEOUT, too_late)
        return None

    def _snapshot_taken(self, vm: Vm, event: dict[str, Any]) -> None:
        if vm.snapshot is None:
            return  # given up already (its timeout); the VM was told
        if "error" in event:
            self._snapshot_failed(vm, 409, f"pyvmm: VM {vm.id}: {event['error']}")
            return
        taking, conn = vm.snapshot
        vm.snapshot = None
        try:
            answer = taking.write(event)
        except PyvmmError as err:
            self._tell(vm, b"S-")
            self._respond(conn, 500, error_body(f"pyvmm: snapshot: {err}"))
            return
        self._tell(vm, b"S+")
        _log(f"vm {vm.id}: snapshot written to {taking.path} ({answer['pages']} pages)")
        self._respond(conn, 200, {**answer, "vm": vm.view()})

    def _snapshot_failed(self, vm: Vm, status: int, line: str) -> None:
        """The snapshot given up: its directory removed, the VM told."""
        assert vm.snapshot is not None
        taking, conn = vm.snapshot
        vm.snapshot = None
        taking.remove()
        self._tell(vm, b"S-")
        self._respond(conn, status, error_body(line, vm.exit_status))

    def _tell(self, vm: Vm, message: bytes) -> None:
        if vm.channel.fileno() >= 0:
            with contextlib.suppress(OSError):
                vm.channel.send(message)

    # -- the VMs' processes ------------------------------------------------------

    def _channel(self, vm: Vm) -> None:
        """What the child says (child.py's events), each checked first
        (events.py): a message that is not one ends that VM, nothing else."""
        while vm.channel.fileno() >= 0:
            try:
                packet = vm.channel.recv(MAX_MESSAGE + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                packet = b""
            if not packet:
                self.selector.unregister(vm.channel)
                vm.channel.close()
                return
            try:
                event = parse_event(packet)
            except BadMessage as err:
                self._bad_message(vm, str(err))
                return
            try:
                self._event(vm, event["event"], event)
            except Exception as err:  # a launcher bug: that VM goes, serving goes on
                self._bad_message(vm, internal_error(err))
                return

    def _bad_message(self, vm: Vm, why: str) -> None:
        """A VM's process that says what no VM's process says (its guest
        may have taken over its VMM): logged, ended, its channel closed."""
        _log(f"vm {vm.id} (pid {vm.pid}): a malformed message from its process ({why}): ended")
        vm.error = f"pyvmm: the VM's process sent a malformed message ({why}): ended"
        self._signal(vm, signal.SIGKILL)
        if vm.channel.fileno() >= 0:
            self.selector.unregister(vm.channel)
            vm.channel.close()

    def _event(self, vm: Vm, kind: str, event: dict[str, Any]) -> None:
        if kind == "running":
            vm.times.update(event["times"])
            vm.cpu_ns["child"] = event["cpu_ns"]
            vm.state = "running"
            self._answer(vm, "create", 201)
            self._answer(vm, "start", 200)
            if not vm.pooled:
                self._rehearse()
            # Once it no longer needs the CPU to start (a fork and a set-up
            # now would compete with its first instructions).
            self._after(REFILL_DELAY, lambda: self._refill(vm))
        elif kind == "prepared":
            vm.times.update(event["times"])
            pool = self.pools.get(vm.pool) if vm.pool else None
            if pool is not None and vm in pool.preparing:
                pool.preparing.remove(vm)
                pool.ready.append(vm)
                vm.state = "ready"
            ahead = self._container_pool_of(vm)
            if ahead is not None and vm in ahead.preparing:
                ahead.preparing.remove(vm)
                ahead.ready.append(vm)
                vm.state = "ready"
            if vm.pid in self.startable:
                vm.state = "ready"
                if self.startable[vm.pid] is not None:  # its start came first
                    self._go(vm)
        elif kind == "error":
            vm.error = event["message"]
            pool = self.pools.get(vm.pool) if vm.pool else None
            if pool is not None:
                pool.error = vm.error
            if vm.state == "starting":
                vm.listed = vm.pid in self.startable  # (its start says why it ended)
                status = 500 if event["internal"] else 400
                body = error_body(vm.error, event["status"])
                for kind in ("create", "create+wait", "start", "start+wait"):
                    self._answer(vm, kind, status, body)
                self._refill(vm)
        elif kind == "stats":
            waiting = self.stats_waiters.get(vm.pid)
            while waiting:
                conn = waiting.popleft()
                if not conn.done:
                    if "report" in event:
                        self._respond(conn, 200, event["report"])
                    else:
                        self._respond(conn, 503, error_body(event["error"]))
                    break
        elif kind == "final":
            vm.final = event["report"]
        elif kind == "imports":
            vm.imported_after_fork = event["imported_after_fork"]
        elif kind == "snapshot":
            self._snapshot_taken(vm, event)

    def _answer(self, vm: Vm, kind: str, status: int, body: Any = None) -> None:
        """Answer (and forget) the requests of ``kind`` waiting on ``vm``."""
        keep = []
        for conn, waiting in self.waiters.get(vm.pid, []):
            if waiting == kind:
                self._respond(conn, status, vm.view() if body is None else body)
            else:
                keep.append((conn, waiting))
        self.waiters[vm.pid] = keep

    def _reap(self, vm: Vm) -> None:
        if vm.channel.fileno() >= 0:
            self._channel(vm)  # its last words first
        _, wait_status = os.waitpid(vm.pid, 0)
        vm.exit_status, vm.signal = describe_status(wait_status)
        vm.state = "exited"
        self.selector.unregister(vm.pidfd)
        os.close(vm.pidfd)
        if vm.channel.fileno() >= 0:
            self.selector.unregister(vm.channel)
            vm.channel.close()
        self._close_relay(vm)
        del self.live[vm.pid]
        asked = self.startable.pop(vm.pid, None)
        if asked is not None:  # a start that came before it was prepared
            _close_fds(asked[1])
        failed = self.held.pop(vm.pid, None)
        if failed is not None:  # a container whose create failed: its state goes
            failed.remove()
        ahead = self._container_pool_of(vm)
        for waiting in (ahead.ready, ahead.preparing) if ahead is not None else ():
            if vm in waiting:
                waiting.remove(vm)
        if vm.snapshot is not None:
            self._snapshot_failed(vm, 409, f"VM {vm.id} ended before its snapshot was taken")
        pool = self.pools.get(vm.pool) if vm.pool else None
        if pool is not None:
            for held in (pool.ready, pool.preparing):
                if vm in held:
                    held.remove(vm)
        pending = self.waiters.pop(vm.pid, [])
        forget = any(kind == "delete" for _, kind in pending)
        for conn, kind in pending:
            started = "running" in vm.times
            if kind in ("create", "start") or kind.endswith("+wait") and not started:
                # it ended before its guest ran, and said nothing
                how = f"killed by {vm.signal}" if vm.signal else f"status {vm.exit_status}"
                vm.error = vm.error or f"pyvmm: the VM's process ended before its guest ran ({how})"
                vm.listed = False
                self._respond(conn, 500, error_body(vm.error, vm.exit_status))
            else:
                self._respond(conn, 200, vm.view())
        for conn in self.stats_waiters.pop(vm.pid, ()):
            if vm.final is not None:
                self._respond(conn, 200, vm.final)
            else:
                ended = f"VM {vm.id} ended before its guest ran"
                self._respond(conn, 409, error_body(ended, vm.exit_status))
        if forget or not vm.listed:
            self.vms.pop(vm.id, None)
        self._trim()

    def _trim(self) -> None:
        exited = [vm_id for vm_id, vm in self.vms.items() if vm.state == "exited"]
        for vm_id in exited[: max(0, len(exited) - MAX_EXITED)]:
            del self.vms[vm_id]


def _log(line: str) -> None:
    import sys

    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"pyvmm: {line}\n")
        sys.stderr.flush()


def _relay(vm_id: str) -> StderrRelay:
    try:
        return StderrRelay(vm_id)
    except OSError as err:
        raise HttpError(503, f"pyvmm: no pipe for the VM's log lines: {err.strerror}") from None


def _reserve_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _refuse(sock: socket.socket, status: int, message: str) -> None:
    """Answer a connection that is not served, without waiting, and close it."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(http.response(status, error_body(message)))
    sock.close()


def _passed_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return fds.tolist()


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _check_directory(path: str) -> None:
    """The socket's directory: nobody but root and this user may write it
    unless it is sticky (/tmp), else another user could put a socket of
    their own in the launcher's place."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        info = os.stat(directory)
    except OSError as err:
        raise PyvmmError(f"--api-sock={path}: {directory}: {err.strerror}") from None
    if info.st_uid not in (0, os.geteuid()):
        raise PyvmmError(
            f"--api-sock={path}: {directory} belongs to uid {info.st_uid}: "
            "put the socket in a directory of root's or the launcher's user"
        )
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise PyvmmError(
            f"--api-sock={path}: {directory} is writable by others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): another user could replace the socket"
        )


def serve(path: str, limits: Limits | None = None) -> int:
    """``pyvmm serve --api-sock PATH``: warm up, listen, serve."""
    from pyvmm.serve.warm import warm_up

    facts = warm_up()
    Launcher.take_signals()  # before the socket exists: it is always removed
    launcher = Launcher(path, facts, limits)
    _log(f"launcher {os.getpid()} listening on {path}")
    status = launcher.serve()
    _log(f"launcher {os.getpid()}: {stop_message(launcher.stopping)}")
    return status
