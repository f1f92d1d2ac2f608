"""The launcher: one single-threaded process, a selectors loop, a child per VM.

It never has a second thread, so that every fork copies a process in a
known state: requests, the VMs' channels (child.py), their pidfds (a
pidfd becomes readable when its process ends, so no SIGCHLD handler is
needed) and the stop signals (through ``signal.set_wakeup_fd``) are all
events of one ``selectors`` loop, and timeouts are a small heap of
deadlines. docs/serve.md has the API.
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
from pyvmm.errors import PyvmmError, stop_message
from pyvmm.serve import http
from pyvmm.serve.http import HttpError, Request
from pyvmm.serve.vms import ID_OK, KNOWN_KEYS, Vm, describe_status, pool_key, prepare, spawn
from pyvmm.serve.warm import HostFacts

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


class Conn:
    """One client connection: a request in, one response out."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = http.RequestReader()
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
    def __init__(self, path: str, facts: HostFacts) -> None:
        import selectors

        self.path = path
        self.facts = facts
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
        #: The last create's command line and directory (``_rehearse``).
        self._last_create: dict[str, Any] | None = None
        self.stopping = 0
        self.listener = self._listen(path)
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        self.selector.register(self.listener, 1, self._accept)
        self.selector.register(self._wake_r, 1, self._woken)

    # -- the socket --------------------------------------------------------------

    def _listen(self, path: str) -> socket.socket:
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
        if not self.stopping:
            self._unlink()
        self._wake_r.close()
        self._wake_w.close()
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

    # -- connections -------------------------------------------------------------

    def _accept(self, mask: int) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return  # try again on the next event
                raise
            sock.setblocking(False)
            conn = Conn(sock)
            self.conns.add(conn)
            self.selector.register(sock, 1, lambda m, c=conn: self._readable(c))

    def _readable(self, conn: Conn) -> None:
        try:
            data, ancillary, flags, _ = conn.sock.recvmsg(
                65536, socket.CMSG_SPACE(_RECV_FDS * 4), socket.MSG_CMSG_CLOEXEC
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, ancillary, flags = b"", [], 0
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                conn.fds += fds.tolist()
        if not data:  # the client went away (a waiting one too)
            self._drop(conn)
            return
        if conn.reader is None:
            return  # a request is being answered: more bytes are ignored
        if conn.arrived_ns is None:
            conn.arrived_ns = time.monotonic_ns()
        try:
            if flags & socket.MSG_CTRUNC:
                raise HttpError(400, f"at most {_RECV_FDS} file descriptors per request")
            request = conn.reader.feed(data)
            if request is None:
                self._continue(conn)
                return
        except HttpError as err:
            self._respond(conn, err.status, {"error": str(err)})
            return
        conn.reader = None
        request.fds, conn.fds = conn.fds, []
        try:
            answer = self._dispatch(conn, request)
        except HttpError as err:
            answer = (err.status, {"error": str(err)})
        except Exception as err:  # a launcher bug: this request fails, serving goes on
            answer = (500, {"error": f"pyvmm: internal error: {type(err).__name__}: {err}"})
        finally:
            for fd in request.fds:
                os.close(fd)
        if answer is not None:
            self._respond(conn, *answer)

    def _continue(self, conn: Conn) -> None:
        """curl waits for "100 Continue" before a large body."""
        head = conn.reader._head if conn.reader is not None else None
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
        parts = [p for p in req.path.split("/") if p]
        if not parts:
            self._allow(req, "GET")
            return 200, {"pyvmm": __version__, "pid": os.getpid(), "vms": len(self.vms)}
        if parts == ["pool"]:
            return self._pool(req)
        if parts[0] != "vms" or len(parts) > 3:
            raise HttpError(404, f"no such resource: {req.path}")
        if len(parts) == 1:
            if req.method == "GET":
                return 200, {"vms": [vm.view() for vm in self.vms.values()]}
            self._allow(req, "POST")
            return self._create(conn, req)
        vm = self.vms.get(parts[1])
        if vm is None:
            raise HttpError(404, f"no VM with id {parts[1]!r}")
        action = parts[2] if len(parts) == 3 else ""
        if action == "":
            if req.method == "DELETE":
                return self._stop(conn, vm, req, forget=True)
            self._allow(req, "GET")
            return 200, vm.view()
        if action == "stop":
            self._allow(req, "POST")
            return self._stop(conn, vm, req, forget=False)
        if action == "wait":
            self._allow(req, "GET")
            return self._wait(conn, vm)
        if action == "stats":
            self._allow(req, "GET")
            return self._stats(conn, vm)
        raise HttpError(404, f"no such resource: {req.path}")

    @staticmethod
    def _allow(req: Request, method: str) -> None:
        if req.method != method:
            raise HttpError(405, f"{req.method} {req.path}: use {method}")

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
            prepared = prepare(body, req.fds, self.facts)
            self._last_create = {"argv": prepared.argv, "cwd": prepared.cwd}
            vm_id = self._new_id(prepared.id)
            vm = spawn(vm_id, prepared, arrived, self.close_in_child)
            self._track(vm)
        self.vms[vm.id] = vm
        # "wait": true answers at the end (the client's one connection).
        kind = "create+wait" if body.get("wait") is True else "create"
        self.waiters[vm.pid].append((conn, kind))
        vm.cpu_ns["launcher"] = time.thread_time_ns() - cpu
        return None

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

    # -- pools ---------------------------------------------------------------------

    def _pool(self, req: Request) -> tuple[int, Any]:
        if req.method == "GET":
            return 200, {"pools": [pool.view() for pool in self.pools.values()]}
        if req.method == "DELETE":
            for pool in self.pools.values():
                for vm in pool.ready + pool.preparing:
                    self._signal(vm, signal.SIGTERM)
                    self._after(STOP_GRACE, lambda v=vm: self._signal(v, signal.SIGKILL))
            self.pools.clear()
            return 200, {"pools": []}
        self._allow(req, "POST")
        if self.stopping:
            raise HttpError(503, "pyvmm: the launcher is stopping")
        body = req.json()
        size = body.pop("size", 1)
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_POOL:
            raise HttpError(400, f'"size" must be an integer from 1 to {MAX_POOL}')
        if {"id", "stdout", "stderr"} & set(body):
            raise HttpError(400, "a pool takes argv and cwd (ids and consoles come with a create)")
        prepare(body, [], self.facts)  # the command's errors, now
        key = pool_key(body)
        pool = self.pools.setdefault(key, Pool(key, size))
        pool.size, pool.error = size, None
        self._fill(pool)
        return 201, pool.view()

    def _fill(self, pool: Pool) -> None:
        """Prepare VMs until the pool holds its size (not while stopping)."""
        if self.stopping or self.pools.get(pool.key) is not pool:
            return
        argv, cwd = pool.key
        while len(pool.ready) + len(pool.preparing) < pool.size:
            try:
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
            value = body.get(key)
            if value is not None:
                if not isinstance(value, str) or not value or "\0" in value:
                    raise HttpError(400, f'"{key}" must be a non-empty string')
                console[key] = value
        if len(fds) > 2:
            raise HttpError(400, f"at most 2 file descriptors (stdout, stderr), got {len(fds)}")
        vm_id = body.get("id")
        if vm_id is not None and (not isinstance(vm_id, str) or not ID_OK.match(vm_id)):
            raise HttpError(400, f'"id" must be 1-64 of [A-Za-z0-9_.-], not {vm_id!r}')
        vm_id = self._new_id(vm_id)
        vm = pool.ready.pop(0)
        try:
            socket.send_fds(vm.channel, [b"go" + json.dumps(console).encode()], fds)
        except OSError as err:
            self._signal(vm, signal.SIGKILL)
            raise HttpError(503, f"pyvmm: a pooled VM did not take its start: {err}") from None
        vm.id, vm.listed, vm.pooled, vm.pool = vm_id, True, True, None
        vm.state, vm.arrived_ns, vm.refill = "starting", arrived, pool.key
        return vm

    def _rehearse(self) -> None:
        """The last create prepared again and thrown away, once its VM runs.

        A fork leaves every page of this process shared with the child and
        write-protected, so the next request's parse and plan took a
        copy-on-write fault on each page they write: 1-1.3 ms of CPU
        instead of 0.15 (docs/serve.md). Doing the same work now, while
        nothing waits for it, takes those faults off the next request's
        path; the pages are the ones the next request would copy anyway."""
        last = self._last_create
        if last is None:
            return
        with contextlib.suppress(Exception):
            prepare(dict(last), [], self.facts)

    def _refill(self, vm: Vm) -> None:
        """A pooled VM has started (or failed to): prepare the next one."""
        key, vm.refill = vm.refill, None
        pool = self.pools.get(key) if key is not None else None
        if pool is not None:
            self._fill(pool)

    def _stop(self, conn: Conn, vm: Vm, req: Request, *, forget: bool) -> tuple[int, Any] | None:
        name = req.json().get("signal", "SIGTERM")
        signum = STOP_REQUEST_SIGNALS.get(name) if isinstance(name, str) else None
        if signum is None:
            known = ", ".join(STOP_REQUEST_SIGNALS)
            raise HttpError(400, f"signal: {name!r} is not one of {known}")
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
                raise HttpError(409, f"VM {vm.id} ended before its guest ran: no counters")
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
                self._respond(conn, 504, {"error": late})

        self._after(STATS_TIMEOUT, too_late)
        return None

    # -- the VMs' processes ------------------------------------------------------

    def _channel(self, vm: Vm) -> None:
        """What the child says (child.py's events)."""
        import json

        while vm.channel.fileno() >= 0:
            try:
                packet = vm.channel.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                packet = b""
            if not packet:
                self.selector.unregister(vm.channel)
                vm.channel.close()
                return
            try:
                event = json.loads(packet)
                self._event(vm, event["event"], event)
            except (ValueError, KeyError, TypeError):
                continue  # a child is not trusted to speak well

    def _event(self, vm: Vm, kind: str, event: dict[str, Any]) -> None:
        if kind == "running":
            vm.times.update(event["times"])
            vm.cpu_ns["child"] = int(event["cpu_ns"])
            vm.state = "running"
            self._answer(vm, "create", 201)
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
        elif kind == "error":
            vm.error = str(event["message"])
            pool = self.pools.get(vm.pool) if vm.pool else None
            if pool is not None:
                pool.error = vm.error
            if vm.state == "starting":
                vm.listed = False
                status = 500 if event.get("internal") else 400
                body = {"error": vm.error, "exit_status": event.get("status")}
                self._answer(vm, "create", status, body)
                self._answer(vm, "create+wait", status, body)
                self._refill(vm)
        elif kind == "stats":
            waiting = self.stats_waiters.get(vm.pid)
            while waiting:
                conn = waiting.popleft()
                if not conn.done:
                    if "report" in event:
                        self._respond(conn, 200, event["report"])
                    else:
                        self._respond(conn, 503, {"error": str(event.get("error"))})
                    break
        elif kind == "final":
            vm.final = event["report"]
        elif kind == "imports":
            vm.imported_after_fork = list(event["imported_after_fork"])

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
        self._channel(vm)  # its last words first
        _, wait_status = os.waitpid(vm.pid, 0)
        vm.exit_status, vm.signal = describe_status(wait_status)
        vm.state = "exited"
        self.selector.unregister(vm.pidfd)
        os.close(vm.pidfd)
        if vm.channel.fileno() >= 0:
            self.selector.unregister(vm.channel)
            vm.channel.close()
        del self.live[vm.pid]
        pool = self.pools.get(vm.pool) if vm.pool else None
        if pool is not None:
            for held in (pool.ready, pool.preparing):
                if vm in held:
                    held.remove(vm)
        pending = self.waiters.pop(vm.pid, [])
        forget = any(kind == "delete" for _, kind in pending)
        for conn, kind in pending:
            if kind == "create" or kind == "create+wait" and "running" not in vm.times:
                # it ended before its guest ran, and said nothing
                how = f"killed by {vm.signal}" if vm.signal else f"status {vm.exit_status}"
                vm.error = vm.error or f"pyvmm: the VM's process ended before its guest ran ({how})"
                vm.listed = False
                self._respond(conn, 500, {"error": vm.error})
            else:
                self._respond(conn, 200, vm.view())
        for conn in self.stats_waiters.pop(vm.pid, ()):
            if vm.final is not None:
                self._respond(conn, 200, vm.final)
            else:
                self._respond(conn, 409, {"error": f"VM {vm.id} ended before its guest ran"})
        if forget or not vm.listed:
            self.vms.pop(vm.id, None)
        self._trim()

    def _trim(self) -> None:
        exited = [vm_id for vm_id, vm in self.vms.items() if vm.state == "exited"]
        for vm_id in exited[: max(0, len(exited) - MAX_EXITED)]:
            del self.vms[vm_id]


def serve(path: str) -> int:
    """``pyvmm serve --api-sock PATH``: warm up, listen, serve."""
    from pyvmm.serve.warm import warm_up

    facts = warm_up()
    Launcher.take_signals()  # before the socket exists: it is always removed
    launcher = Launcher(path, facts)
    import sys

    sys.stderr.write(f"pyvmm: launcher {os.getpid()} listening on {path}\n")
    sys.stderr.flush()
    status = launcher.serve()
    sys.stderr.write(f"pyvmm: {stop_message(launcher.stopping)}\n")
    return status
