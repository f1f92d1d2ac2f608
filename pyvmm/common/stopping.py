"""How a pyvmm process stops, and how it says what went wrong: one policy
for the command (entry.py, cli.py, the ``serve`` and ``run`` subcommands)
and for a VM's own process under the warm launcher (serve/child.py).

- A stop signal (SIGINT, SIGTERM, SIGHUP) before the guest runs raises
  ``Stop`` at the next Python instruction, once: a second one while the
  first is handled changes nothing, so clean-up finishes. The process then
  ends with 128 + signal and ``stop_line``. While a guest runs, C handlers
  take over (pyvmm_signals_install) and ``errors.Stopped`` ends the run the
  same way.
- An error a user, a file or a guest caused (a ``PyvmmError``): its one
  line and its exit status (``contained``).
- A pyvmm bug: the one ``internal_error_line`` and status 1;
  ``PYVMM_DEBUG=1`` shows the traceback.
- pyvmm's log lines: logging is imported only for the first line shown
  (``defer_logging``); most runs show none.

entry.py imports this module before it installs the handlers, so it
imports nothing heavy: ``_signal`` (not ``signal``, whose enums cost a
millisecond), ``sys`` and ``pyvmm.common.errors``.
"""

from __future__ import annotations

import _signal
import os
import sys

from pyvmm.common.errors import OutputError, PyvmmError, stop_message

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (docs/startup.md)
if TYPE_CHECKING:
    from collections.abc import Callable

STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)
#: What the launcher blocks: the stop signals and SIGUSR1 (the counters).
LAUNCH_BLOCKED = (*STOP_SIGNALS, _signal.SIGUSR1)
_stop = 0
_delivered = False  # Stop was raised for _stop (and not swallowed since)


class Stop(BaseException):
    """Raised by the handler; caught only where the process ends (entry.main,
    a serve child's main), which report the recorded signal."""


def _on_stop(signum: int, frame: object) -> None:
    global _stop, _delivered
    if _delivered:
        return  # the first signal is being handled: clean-up must finish
    _stop = _stop or signum
    _delivered = True
    raise Stop(_stop)


def handle_stop_signals() -> None:
    """From now on a stop signal raises ``Stop`` (in the main thread)."""
    for signum in STOP_SIGNALS:
        _signal.signal(signum, _on_stop)


def ignore_stop_signals() -> None:
    """The exit status is known: a stop signal from now on changes nothing."""
    for signum in STOP_SIGNALS:
        _signal.signal(signum, _signal.SIG_IGN)


def stop_signal() -> int:
    """The stop signal caught before (or after) the guest ran, or 0."""
    return _stop


def check() -> None:
    """Raise the stop if one was recorded and lost on its way (a checkpoint
    before the guest runs)."""
    global _delivered
    if _stop:
        _delivered = True
        raise Stop(_stop)


def quiet_unraisable(hook: Callable) -> Callable:
    """``sys.unraisablehook``: a ``Stop`` raised where Python cannot
    propagate it (a ``__del__``, a weakref callback) is sent again to the
    main thread, once this hook has returned, so that it is raised
    elsewhere (or taken by the C handlers if a guest runs by then); after a
    stop, other unraisable errors are the clean-up's and stay quiet."""

    def quiet(unraisable) -> None:
        global _delivered
        if isinstance(unraisable.exc_value, Stop):
            import threading

            _delivered = False
            done = threading.Event()
            threading.Thread(target=_resend, args=(done, _stop), daemon=True).start()
            done.set()
            return
        if not _stop:
            hook(unraisable)

    return quiet


def _resend(done, signum: int) -> None:
    import threading
    import time

    done.wait()
    time.sleep(0.001)  # the hook returns right after setting done
    _signal.pthread_kill(threading.main_thread().ident, signum)


def stop_line(signum: int) -> str:
    """The line a run ended by stop signal ``signum`` ends with."""
    return f"pyvmm: {stop_message(signum)}"


def internal_error(err: BaseException) -> str:
    """What a pyvmm bug is called wherever it is reported."""
    return f"internal error: {type(err).__name__}: {err}"


def internal_error_line(err: BaseException) -> str:
    """The one line of a process ended by a pyvmm bug (status 1)."""
    return f"pyvmm: {internal_error(err)} (PYVMM_DEBUG=1 shows where; please report it)"


def say(line: str) -> None:
    """One line on stderr (sys.stderr is None if fd 2 was closed at start)."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def contained(body: Callable[[], int], explain: Callable[[PyvmmError], str] = str) -> int:
    """``body()``'s exit status, with the command's error policy: a
    ``PyvmmError`` is its one line (``explain``) and its status, a pyvmm bug
    the internal-error line and 1. After a stop signal the exception goes
    on to where the stop is reported (entry.main)."""
    try:
        return body()
    except PyvmmError as err:
        if _stop:
            raise
        if sys.stdout is not None:
            try:
                sys.stdout.flush()
            except OSError:
                pass
        say(f"pyvmm: {explain(err)}")
        return err.exit_status
    except KeyboardInterrupt:  # called without pyvmm.entry (tests, a program)
        say(stop_line(_signal.SIGINT))
        return 128 + _signal.SIGINT
    except Exception as err:
        if _stop or os.environ.get("PYVMM_DEBUG"):
            raise
        say(internal_error_line(err))
        return 1


def standard_fds() -> None:
    """Refuse a closed stdout at once (the guest's console goes there), and
    hold fds 0 and 2 open if they are closed, so that no device or file
    pyvmm opens later gets one of them."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        if fd == 1:
            raise OutputError(
                "standard output is closed: the guest's console output would be lost "
                "(redirect it to a file or /dev/null instead)"
            )
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)


def setup_logging(level: str) -> None:
    """pyvmm's log lines on stderr, one line each, from ``level`` up."""
    import logging

    from pyvmm.common.log import log

    class _LineFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return "pyvmm: " + " ".join(super().format(record).split("\n"))

    handler = logging.StreamHandler(sys.stderr if sys.stderr is not None else sys.__stderr__)
    handler.setFormatter(_LineFormatter())
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(level.upper())


def defer_logging(level: str) -> None:
    """As ``setup_logging``, but logging is imported only for the first
    line shown (most runs show none: pyvmm.common.log)."""
    from pyvmm.common.log import log

    log.defer(
        {"error": 40, "warning": 30, "info": 20, "debug": 10}[level],
        lambda: setup_logging(level),
    )
