"""The pyvmm command's entry point: stop signals handled from its first line.

Importing the rest of pyvmm takes a while (cffi, the loader, the device
kinds); a Ctrl-C or SIGTERM in that time must end pyvmm like one at any
other moment: exit status 128 + signal and one line on stderr, never a
traceback, never a message from whatever the signal interrupted. So this
module imports nothing of pyvmm's, installs a handler for SIGINT, SIGTERM
and SIGHUP before anything else, and only then imports the command.

The handler records the first signal and raises ``_Stop`` (at the next
Python instruction, as KeyboardInterrupt would); whatever that exception
becomes on its way out (Python wraps some, such as a RuntimeError from
``__set_name__``), ``main`` reports the recorded signal. While a guest
runs, C handlers take over (pyvmm_signals_install) and the run ends with
the same status and line (vmm.Stopped). A signal that arrives before the
interpreter runs this module (its own start-up, a few milliseconds) ends
the process as it would any program, by the signal (a shell shows 128 + N).
"""

import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_stop = 0
_delivered = False  # _Stop was raised for _stop (and not swallowed since)


class _Stop(BaseException):
    """Raised by the handler; never caught anywhere but in main()."""


def _on_stop(signum, frame):
    global _stop, _delivered
    if _delivered:
        return  # the first signal is being handled: clean-up must finish
    _stop = _stop or signum
    _delivered = True
    raise _Stop(_stop)


def stop_signal() -> int:
    """The stop signal caught before (or after) the guest ran, or 0."""
    return _stop


def _unraisable(hook):
    def quiet(unraisable):
        global _delivered
        if isinstance(unraisable.exc_value, _Stop):
            # Raised where Python cannot propagate it (a __del__, a weakref
            # callback): send the signal again to the main thread, once this
            # hook has returned, so that it is raised elsewhere (or taken by
            # the C handlers if a guest runs by then).
            _delivered = False
            done = threading.Event()
            threading.Thread(target=_resend, args=(done, _stop), daemon=True).start()
            done.set()
            return
        if not _stop:
            hook(unraisable)

    return quiet


def _resend(done, signum: int) -> None:
    import time

    done.wait()
    time.sleep(0.001)  # the hook returns right after setting done
    signal.pthread_kill(threading.main_thread().ident, signum)


def check() -> None:
    """Raise the stop if one was recorded and lost on its way (a checkpoint
    before the guest runs)."""
    global _delivered
    if _stop:
        _delivered = True
        raise _Stop(_stop)


def main() -> int:
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_stop)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    status = 1
    try:
        from pyvmm.cli import main as cli_main

        status = cli_main()
    except BaseException:
        if not _stop:
            raise
    if _stop:
        for signum in STOP_SIGNALS:  # a second signal now changes nothing
            signal.signal(signum, signal.SIG_IGN)
        from pyvmm.errors import stop_message

        try:
            sys.stderr.write(f"pyvmm: {stop_message(_stop)}\n")
            sys.stderr.flush()
        except (OSError, AttributeError):
            pass
        return 128 + _stop
    return status
