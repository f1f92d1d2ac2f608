"""``pyvmm run --api-sock PATH [OPTIONS] KERNEL [ARGS...]``: the command, warm.

The client asks the launcher to create the VM with its own command line,
its working directory and its own stdout and stderr (passed over the
socket, SCM_RIGHTS), so the guest's console and pyvmm's lines appear where
the command's would, and to answer when the VM has ended (``"wait":
true``, on the same connection, so the end cannot be missed); it exits
with the guest's status. A stop signal while it waits is passed on to the VM (POST
/v1/vms/ID/stop with that signal), which ends as the command would: 128 + N
and the same line. Before it sends anything it checks who listens on the
socket (peer.py): root or its own user, else one line and nothing sent.
It imports nothing of the launcher's, so it starts as fast as the
interpreter and cli.py allow.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

from pyvmm.host.peer import peer_uid, trusted
from pyvmm.serve import http
from pyvmm.serve.routes import API_VERSION

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The paths' prefix: the API version this client speaks.
API = f"/{API_VERSION}"


class ClientError(Exception):
    """One line for stderr, status 1."""


def call(
    path: str, method: str, target: str, body: Any = None, fds: list[int] | None = None
) -> tuple[int, Any]:
    """One request over the API socket: (status, JSON body)."""
    sock = connect(path)
    try:
        send(sock, method, target, body, fds)
        return receive(sock)
    finally:
        sock.close()


def connect(path: str) -> socket.socket:
    """A connection to a launcher of root or of this user (else ClientError:
    the request, and the terminal's fds with it, go nowhere else)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        uid = peer_uid(sock)
    except OSError as err:
        sock.close()
        hint = f"is `pyvmm serve --api-sock={path}` running?"
        raise ClientError(f"--api-sock={path}: cannot connect: {err.strerror} ({hint})") from None
    if not trusted(uid):
        sock.close()
        raise ClientError(
            f"--api-sock={path}: the process listening there is uid {uid}, neither root "
            f"nor this user (uid {os.geteuid()}): nothing sent to it"
        )
    return sock


def send(
    sock: socket.socket, method: str, target: str, body: Any = None, fds: list[int] | None = None
) -> None:
    data = http.request_bytes(method, target, body)
    try:
        if fds:
            data = data[socket.send_fds(sock, [data], fds) :]
        if data:  # (sendall sends even nothing, and the launcher may have answered)
            sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the launcher answered and closed before reading it all: its answer is next
    except OSError as err:
        raise ClientError(f"cannot send to the launcher: {err.strerror}") from None


def receive(sock: socket.socket) -> tuple[int, Any]:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except InterruptedError:
            continue
        except ConnectionResetError:
            if chunks:  # the answer, then a close with our request unread
                break
            raise ClientError("the launcher closed the connection without an answer") from None
        except OSError as err:
            raise ClientError(f"the launcher's answer was cut: {err.strerror}") from None
        if not chunk:
            break
        chunks.append(chunk)
    if not chunks:
        raise ClientError("the launcher closed the connection without an answer (did it stop?)")
    try:
        return http.parse_response(b"".join(chunks))
    except ValueError as err:
        raise ClientError(f"the launcher's answer: {err}") from None


def _error_line(status: int, body: Any) -> str:
    message = body.get("error") if isinstance(body, dict) else None
    if not isinstance(message, str):
        message = f"the launcher answered {status}"
    return message if message.startswith("pyvmm: ") else f"pyvmm: {message}"


def run(path: str, argv: list[str]) -> int:
    """Create the VM and wait for its end on one connection (so its end is
    never missed); the guest's exit status. Stop signals go to the VM."""
    vm_id = f"run-{os.getpid()}-{time.monotonic_ns()}"  # known before the answer
    signals: list[int] = []
    read, write = socket.socketpair()
    write.setblocking(False)

    def record(signum: int, frame: Any) -> None:
        signals.append(signum)

    old = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
    for signum in STOP_SIGNALS:
        signal.signal(signum, record)
    body = {"argv": argv, "cwd": os.getcwd(), "id": vm_id, "wait": True}
    sock = connect(path)
    try:
        send(sock, "POST", f"{API}/vms", body, fds=[1, 2])
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ)
            sel.register(read, selectors.EVENT_READ)
            while True:
                while signals:  # passed on: the VM ends as the command would
                    name = signal.Signals(signals.pop(0)).name
                    call(path, "POST", f"{API}/vms/{vm_id}/stop", {"signal": name})
                if sock in [key.fileobj for key, _ in sel.select()]:
                    status, answer = receive(sock)
                    break
                read.recv(64)
    finally:
        sock.close()
        signal.set_wakeup_fd(old)
    if status != 200 or not isinstance(answer, dict):
        sys.stderr.write(_error_line(status, answer) + "\n")
        exit_status = answer.get("exit_status") if isinstance(answer, dict) else None
        return exit_status if isinstance(exit_status, int) and exit_status else 1
    return int(answer["exit_status"])


SNAPSHOT_USAGE = "snapshot --api-sock PATH [--stop] ID DIR"


def snapshot(path: str, args: list[str]) -> int:
    """``pyvmm snapshot``: POST /vms/ID/snapshot, DIR taken from this
    process's directory; the snapshot's one line on stdout, status 0."""
    stop = "--stop" in args
    operands = [a for a in args if a != "--stop"]
    options = [a for a in operands if a.startswith("-")]
    if options:
        raise ClientError(
            f"snapshot: Invalid option: `{options[0]}' (usage: pyvmm {SNAPSHOT_USAGE})"
        )
    if len(operands) != 2 or args.count("--stop") > 1:
        raise ClientError(
            f"snapshot: needs a VM's ID and a new DIR (usage: pyvmm {SNAPSHOT_USAGE})"
        )
    vm_id, directory = operands
    body = {"dir": os.path.abspath(directory), "stop": stop}
    status, answer = call(path, "POST", f"{API}/vms/{vm_id}/snapshot", body)
    if status != 200 or not isinstance(answer, dict):
        raise ClientError(_error_line(status, answer).removeprefix("pyvmm: "))
    then = "the VM ends" if stop else "the guest runs on"
    sys.stdout.write(
        f"pyvmm: snapshot of VM {vm_id} written to {answer['dir']} ({answer['pages']} pages of "
        f"memory, {answer['ms']} ms); {then}\n"
    )
    return 0
