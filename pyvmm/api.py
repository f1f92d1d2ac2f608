"""Run a guest from Python: the command line's options as keyword arguments.

    from pyvmm.api import Guest

    guest = Guest("guests/bin/udpsink.hvt", "10.0.0.2", "5000",
                  mem=64, net={"service0": "tap100"}, shm="poll")
    guest.start()                  # runs on its own thread
    print(guest.counters())        # a snapshot, any time, from any thread
    status = guest.wait(timeout=30)

Keyword arguments are the long options without their dashes (``-`` as
``_``): a value for ``--opt=VALUE``, ``True`` for a flag, and for device
options a dict by device name (``net={"service0": "tap100"}`` is
``--net:service0=tap100``) or a plain value for the short form
(``net="tap100"``). They go through the command line's own parser, so
every check and message is the CLI's (a ``pyvmm.errors.PyvmmError``).

One guest runs at a time per process: stop signals are taken process-wide
while it runs (docs/api.md).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from pyvmm.cli import parse_args
from pyvmm.config import VmConfig
from pyvmm.errors import PyvmmError, UsageError
from pyvmm.vmm import Vmm

_running = threading.Lock()  # one guest per process (signal handlers are global)


def options_to_argv(kernel: str, args: tuple[str, ...], options: dict[str, Any]) -> list[str]:
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, dict):
            argv += [f"{flag}:{name}={item}" for name, item in value.items()]
        else:
            argv.append(f"{flag}={value}")
    return [*argv, "--", str(kernel), *map(str, args)]


class Guest:
    """One guest run, prepared from options; ``start()`` it once."""

    def __init__(self, kernel: str, *args: str, sandbox: bool = False, **options: Any) -> None:
        config = parse_args(options_to_argv(kernel, args, options))
        if not isinstance(config, VmConfig):
            raise UsageError(f"not a run: {config}")
        # The seccomp filter covers the whole process for good: only on request.
        config.sandbox = sandbox
        self.config = config
        self._vmm: Vmm | None = None
        self._thread: threading.Thread | None = None
        self._status: int | None = None
        self._error: BaseException | None = None
        self._final: dict[str, Any] | None = None  # the counters at the end
        self._ready = threading.Event()
        self._done = threading.Event()

    def start(self) -> None:
        """Prepare (every error raised here, as the CLI reports it) and run
        the guest on a new thread, the vCPU thread."""
        if self._thread is not None:
            raise RuntimeError("this guest was started already")
        if not _running.acquire(blocking=False):
            raise RuntimeError("another pyvmm guest runs in this process")
        self._thread = threading.Thread(target=self._run, name="pyvmm-vcpu", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None and self._vmm is None:
            self._thread.join()
            raise self._error

    def _run(self) -> None:
        try:
            try:
                self._vmm = Vmm(self.config)
            except BaseException as err:
                self._error = err
                return
            finally:
                self._ready.set()
            with self._vmm:
                try:
                    self._status = self._vmm.run()
                finally:
                    self._final = self._vmm.counters()
        except PyvmmError as err:
            self._error = err
            self._status = err.exit_status
        except BaseException as err:  # a pyvmm bug: kept for wait() to raise
            self._error = err
        finally:
            self._done.set()
            _running.release()

    def counters(self) -> dict[str, Any]:
        """The counters so far (docs/stats.md), from any thread."""
        if self._vmm is None:
            raise RuntimeError("the guest has not started")
        if self._final is not None:
            return self._final
        return self._vmm.counters()

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop the guest as that stop signal would (status 128 + signum)."""
        if self._thread is None or self._done.is_set():
            return
        vmm = self._vmm
        while vmm is not None and not self._done.is_set():
            # The signal goes to the vCPU thread, where pyvmm's C handler
            # takes it, but only once the run has installed that handler.
            if vmm.running.wait(0.01):
                with vmm.running_lock:
                    if vmm.running.is_set():
                        signal.pthread_kill(self._thread.ident, signum)
                        return

    def wait(self, timeout: float | None = None) -> int:
        """The exit status, as the pyvmm command would exit with; raises
        TimeoutError if the guest still runs after ``timeout`` seconds."""
        if self._thread is None:
            raise RuntimeError("the guest has not started")
        if not self._done.wait(timeout):
            raise TimeoutError(f"the guest still runs after {timeout} s")
        self._thread.join()
        if self._error is not None and not isinstance(self._error, PyvmmError):
            raise self._error
        assert self._status is not None
        return self._status

    @property
    def error(self) -> PyvmmError | None:
        """What ended the run when it was not the guest's own exit."""
        return self._error if isinstance(self._error, PyvmmError) else None
