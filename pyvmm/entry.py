"""The pyvmm command's entry point: stop signals handled from its first line.

Importing the rest of pyvmm takes a while (cffi, the loader, the device
kinds); a Ctrl-C or SIGTERM in that time must end pyvmm like one at any
other moment: exit status 128 + signal and one line on stderr, never a
traceback, never a message from whatever the signal interrupted. So this
module imports nothing of pyvmm's but the trace marks, installs a handler
for SIGINT, SIGTERM and SIGHUP before anything else, and only then imports
the command.

The interpreter's own start-up, before this module runs, is covered by the
native launcher (csrc/launcher.c, the installed ``pyvmm`` command): it
blocks the stop signals (and SIGUSR1) before it execs the interpreter, and
blocked signals stay blocked across exec. ``main`` unblocks them once its
handlers are in, so a signal sent at any moment since the launcher started
is delivered here, to the handler. ``python3 -m pyvmm`` has no launcher: a
signal in its interpreter's first milliseconds gets Python's own handling.

The handler records the first signal and raises ``_Stop`` (at the next
Python instruction, as KeyboardInterrupt would); whatever that exception
becomes on its way out (Python wraps some, such as a RuntimeError from
``__set_name__``), ``main`` reports the recorded signal. While a guest
runs, C handlers take over (pyvmm_signals_install) and the run ends with
the same status and line (vmm.Stopped).

``exit`` ends the process once the status is known and everything that
outlives it (taps, files, the guest's output) is settled: it flushes and
calls os._exit, leaving memory and the remaining descriptors to the kernel
instead of waiting for the interpreter's finalisation (docs/startup.md).
"""

import _signal
import sys

from pyvmm import trace

trace.early("interpreter start")

STOP_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)
#: What the launcher blocks: the stop signals and SIGUSR1 (the counters).
LAUNCH_BLOCKED = (*STOP_SIGNALS, _signal.SIGUSR1)
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


def check() -> None:
    """Raise the stop if one was recorded and lost on its way (a checkpoint
    before the guest runs)."""
    global _delivered
    if _stop:
        _delivered = True
        raise _Stop(_stop)


def main() -> int:
    # SIGUSR1 asks a running guest's counters (statsview.py); before the
    # guest runs there are none to print, and it must not kill pyvmm.
    _signal.signal(_signal.SIGUSR1, _signal.SIG_IGN)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    status = 1
    try:
        # From the first handler on, a stop raises _Stop: inside this try.
        for signum in STOP_SIGNALS:
            _signal.signal(signum, _on_stop)
        # Blocked by the launcher (or by whoever started pyvmm): a signal
        # pending since then is delivered now, to _on_stop.
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, LAUNCH_BLOCKED)
        from pyvmm.cli import main as cli_main

        status = cli_main()
        # The status is known: a signal from now on changes nothing (and
        # one that comes first is still caught here).
        for signum in STOP_SIGNALS:
            _signal.signal(signum, _signal.SIG_IGN)
    except BaseException:
        if not _stop:
            raise
    if _stop:
        for signum in STOP_SIGNALS:  # a second signal now changes nothing
            _signal.signal(signum, _signal.SIG_IGN)
        from pyvmm.errors import stop_message

        try:
            sys.stderr.write(f"pyvmm: {stop_message(_stop)}\n")
            sys.stderr.flush()
        except (OSError, AttributeError):
            pass
        return 128 + _stop
    return status


def exit_process(status: int) -> None:
    """End the process with ``status`` without the interpreter's
    finalisation: everything that outlives the process is closed by now
    (the run's ExitStack), so only the standard streams need flushing."""
    trace.mark("flush and exit")
    trace.finish()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    import os

    os._exit(status)


def launched(start_ns: str) -> None:
    """The launcher's way in (csrc/launcher.c): the process started at
    ``start_ns`` (CLOCK_BOOTTIME); site-packages added without running
    their start-up files (the interpreter runs with -I -S)."""
    trace.set_start(int(start_ns))
    try:
        import _cffi_backend  # noqa: F401
    except ImportError:
        sys.path += [p for p in _site_packages() if p not in sys.path]
    exit_process(main())


def _site_packages() -> list[str]:
    """Where the interpreter's packages are, without running site: in a
    virtual environment (scripts/setup makes one) its own site-packages,
    which ``-S`` leaves out (site is what reads pyvenv.cfg)."""
    import os

    prefix = os.path.dirname(os.path.dirname(sys.executable))
    if os.path.exists(os.path.join(prefix, "pyvenv.cfg")):
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        return [os.path.join(prefix, "lib", version, "site-packages")]
    import site

    return site.getsitepackages()


def run() -> None:
    """``python3 -m pyvmm`` and the Python console script."""
    exit_process(main())
