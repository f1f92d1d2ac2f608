"""``pyvmm run --api-sock PATH [OPTIONS] KERNEL [ARGS...]``: the command, warm.

The client asks the launcher to create the VM with its own command line,
its working directory and its own stdout and stderr (passed over the
socket, SCM_RIGHTS), so the guest's console and pyvmm's lines appear where
the command's would; then it waits for the end and exits with the guest's
status. A stop signal while it waits is passed on to the VM (POST
/vms/ID/stop with that signal), which ends as the command would: 128 + N
and the same line. It imports nothing of the launcher's, so it starts as
fast as the interpreter and cli.py allow.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
from typing import Any

from pyvmm.serve import http

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as err:
        sock.close()
        raise ClientError(f"--api-sock={path}: cannot connect: {err.strerror}") from None
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
    except OSError as err:
        raise ClientError(f"cannot send to the launcher: {err.strerror}") from None


def receive(sock: socket.socket) -> tuple[int, Any]:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except InterruptedError:
            continue
        except OSError as err:
            raise ClientError(f"the launcher's answer was cut: {err.strerror}") from None
        if not chunk:
            break
        chunks.append(chunk)
    try:
        return http.parse_response(b"".join(chunks))
    except ValueError as err:
        raise ClientError(f"the launcher's answer: {err}") from None


def _error_line(status: int, body: Any) -> str:
    message = body.get("error") if isinstance(body, dict) else None
    if not isinstance(message, str):
        message = f"the launcher answered {status}"
    return message if message.startswith("pyvmm: ") else f"pyvmm: {message}"


class _Waiter:
    """Waits for GET /vms/ID/wait while passing stop signals on."""

    def __init__(self, path: str, vm_id: str) -> None:
        self.path = path
        self.vm_id = vm_id
        self.signals: list[int] = []
        self.read, self.write = socket.socketpair()
        self.write.setblocking(False)

    def _record(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)

    def wait(self) -> Any:
        old = signal.set_wakeup_fd(self.write.fileno(), warn_on_full_buffer=False)
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._record)
        sock = connect(self.path)
        try:
            send(sock, "GET", f"/vms/{self.vm_id}/wait")
            with selectors.DefaultSelector() as sel:
                sel.register(sock, selectors.EVENT_READ)
                sel.register(self.read, selectors.EVENT_READ)
                while True:
                    self._pass_signals()
                    ready = [key.fileobj for key, _ in sel.select()]
                    if sock in ready:
                        return receive(sock)
                    self.read.recv(64)
        finally:
            sock.close()
            signal.set_wakeup_fd(old)

    def _pass_signals(self) -> None:
        while self.signals:
            name = signal.Signals(self.signals.pop(0)).name
            call(self.path, "POST", f"/vms/{self.vm_id}/stop", {"signal": name})


def run(path: str, argv: list[str]) -> int:
    """Create the VM, wait for its end; the guest's exit status."""
    waiter_signals: list[int] = []

    def early(signum: int, frame: Any) -> None:
        waiter_signals.append(signum)

    for signum in STOP_SIGNALS:  # until the VM exists, a stop is kept for it
        signal.signal(signum, early)
    body = {"argv": argv, "cwd": os.getcwd()}
    status, answer = call(path, "POST", "/vms", body, fds=[1, 2])
    if status != 201:
        sys.stderr.write(_error_line(status, answer) + "\n")
        exit_status = answer.get("exit_status") if isinstance(answer, dict) else None
        return exit_status if isinstance(exit_status, int) and exit_status else 1
    waiter = _Waiter(path, str(answer["id"]))
    waiter.signals += waiter_signals
    status, final = waiter.wait()
    if status != 200 or not isinstance(final, dict):
        raise ClientError(_error_line(status, final)[len("pyvmm: ") :])
    return int(final["exit_status"])
