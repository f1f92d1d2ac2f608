"""Run a guest from Python: the command line's options as keyword arguments.

    import io
    from pyvmm.api import Guest

    out = io.BytesIO()
    with Guest("guests/bin/udpsink.hvt", "10.0.0.2", "5000",
               mem=64, net={"service0": "tap100"}, shm="poll", console=out) as guest:
        print(guest.counters())    # a snapshot, any time, from any thread
        status = guest.wait(timeout=30)
    print(out.getvalue())          # what the guest wrote on its console

Keyword arguments are the long options without their dashes (``-`` as
``_``): a value for ``--opt=VALUE``, ``True`` for a flag, and for device
options a dict by device name (``net={"service0": "tap100"}`` is
``--net:service0=tap100``) or a plain value for the short form
(``net="tap100"``). They go through the command line's own parser, so
every check is the CLI's; its messages name these keyword arguments
(``mem=4097: ...``), not the command's options (a
``pyvmm.common.errors.PyvmmError``). ``console`` takes the guest's console output
(default: this process's standard output).

One guest runs at a time per process: stop signals are taken process-wide
while it runs (docs/python-api.md).
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from pyvmm.command.cli import core_options, parse_args
from pyvmm.common.errors import OutputError, PyvmmError, UsageError
from pyvmm.devices.console import ConsoleClosed
from pyvmm.vm.config import VmConfig
from pyvmm.vm.vmm import Vmm

_running = threading.Lock()  # one guest per process (signal handlers are global)

#: Where the console goes: a binary file (anything with ``write(bytes)``,
#: io.BytesIO to keep it) or a function called with each piece.
ConsoleTarget = BinaryIO | Callable[[bytes], Any]

#: The command's options that mean nothing for a guest run from Python, and
#: what to do instead.
NOT_HERE = {
    "help": "help(pyvmm.api.Guest) describes the keyword arguments",
    "version": "pyvmm.__version__ is the version",
    "host_info": "pyvmm.command.hostinfo.host_info(pyvmm.kvm.System()) gives the host's facts",
    "query_manifest": "pyvmm.command.query.describe(kernel) reads a kernel's declarations",
    "json": "pyvmm.command.query.describe(kernel) reads a kernel's declarations",
    "verbose": "configure logging.getLogger('pyvmm') (INFO says what pyvmm decided)",
    "quiet": "configure logging.getLogger('pyvmm')",
    "log_level": "configure logging.getLogger('pyvmm')",
    "trace": "the start-up timeline is the pyvmm command's (pyvmm --trace)",
    "no_sandbox": "the sandbox is off unless Guest(..., sandbox=True)",
}


def _keywords() -> dict[str, str]:
    """Keyword argument -> the option it stands for (``mem`` -> ``--mem``)."""
    from pyvmm.devices import option_table

    names = {
        name[2:].replace("-", "_"): name
        for opt in core_options()
        for name in opt.names
        if name.startswith("--")
    }
    for flag in option_table():
        names[flag.replace("-", "_")] = f"--{flag}"
    return names


def _check_keywords(options: dict[str, Any]) -> None:
    known = _keywords()
    for key, value in options.items():
        if key in NOT_HERE:
            raise UsageError(f"Guest(): {key}= is the pyvmm command's: {NOT_HERE[key]}")
        if key not in known:
            import difflib

            close = difflib.get_close_matches(key, [k for k in known if k not in NOT_HERE], 1)
            hint = f" (did you mean {close[0]}=?)" if close else ""
            raise UsageError(f"Guest(): unknown option {key}={value!r}{hint}")


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


# An option as the command's messages write it: --mem, --mem=64,
# --net:service0=tap100, --net:NAME=IFACE.
# A value ends before a blank or punctuation, and a message's own ':' or '.'.
_OPTION = re.compile(
    r"(?<![\w-])--([a-z][a-z0-9-]*)(?::([A-Za-z0-9]+))?(?:=((?:[^\s,;()'`]*[^\s,;()'`:.])?))?"
)


def _shown(value: str) -> str:
    return value if value.isdigit() else repr(value)


def api_words(text: str) -> str:
    """A message of the command line's, with each option it names written
    as the keyword argument that gives it: ``--mem=4097`` as ``mem=4097``,
    ``--net:service0=tap100`` as ``net={'service0': 'tap100'}``, ``--shm=off``
    as ``shm='off'``, a bare ``--no-net-ring`` as ``no_net_ring``."""
    keywords = {option: key for key, option in _keywords().items()}

    def spell(match: re.Match[str]) -> str:
        key = keywords.get(f"--{match.group(1)}")
        if key is None:
            return match.group(0)
        name, value = match.group(2), match.group(3)
        if name is not None:
            return f"{key}={{{name!r}: {_shown(value or '...')}}}"
        if value is not None:
            return f"{key}={_shown(value)}"
        return key

    text = text.replace("see pyvmm --help", "see help(pyvmm.api.Guest)")
    return _OPTION.sub(spell, text)


def _in_api_words(err: PyvmmError) -> PyvmmError:
    """``err`` itself (class and exit status kept), its message in the
    keyword arguments' words."""
    err.args = (api_words(str(err)),)
    return err


class _Console:
    """The guest's console into a caller's file or function (on the vCPU
    thread); anything it raises ends the run as a console error would (a
    pipe whose reader went away: status 141, as the command's stdout)."""

    def __init__(self, target: ConsoleTarget) -> None:
        write = getattr(target, "write", None)
        if write is None and not callable(target):
            raise UsageError(
                f"Guest(): console={target!r} is neither a binary file (with write()) "
                "nor a function taking bytes"
            )
        self._write = write if write is not None else target

    def write(self, data) -> None:
        try:
            self._write(bytes(data))
        except BrokenPipeError:  # its reader went away: 141, as the command
            raise ConsoleClosed() from None
        except Exception as err:
            raise OutputError(
                f"console: {type(err).__name__}: {err} (the guest was stopped)"
            ) from None


class Guest:
    """One guest run, prepared from options; ``start()`` it once, or use it
    as a context manager (``with Guest(...) as guest:``): started on entry,
    stopped (if it still runs) and waited for on exit."""

    def __init__(
        self,
        kernel: str,
        *args: str,
        sandbox: bool = False,
        console: ConsoleTarget | None = None,
        **options: Any,
    ) -> None:
        _check_keywords(options)
        try:
            config = parse_args(options_to_argv(kernel, args, options))
        except PyvmmError as err:
            raise _in_api_words(err) from None
        if not isinstance(config, VmConfig):
            raise UsageError(f"not a run: {config}")
        # The seccomp filter covers the whole process for good: only on request.
        config.sandbox = sandbox
        self.config = config
        self._console = _Console(console) if console is not None else None
        self._vmm: Vmm | None = None
        self._thread: threading.Thread | None = None
        self._status: int | None = None
        self._error: BaseException | None = None
        self._final: dict[str, Any] | None = None  # the counters at the end
        self._ready = threading.Event()
        self._done = threading.Event()

    def __enter__(self) -> Guest:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop a guest that still runs (as SIGTERM would) and wait for its
        thread, so nothing of the run outlives the block."""
        self.stop()
        if self._thread is not None:
            self._done.wait()
            self._thread.join()

    def start(self) -> None:
        """Prepare (every error raised here, as the CLI reports it, in the
        keyword arguments' words) and run the guest on a new thread, the
        vCPU thread."""
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
                if self._console is not None and self._vmm.hypercalls is not None:
                    self._vmm.hypercalls.console = self._console
            except BaseException as err:
                self._error = _in_api_words(err) if isinstance(err, PyvmmError) else err
                return
            finally:
                self._ready.set()
            with self._vmm:
                try:
                    self._status = self._vmm.run()
                finally:
                    self._final = self._vmm.counters()
        except PyvmmError as err:
            self._error = _in_api_words(err)
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
