"""The pyvmm command's entry point: stop signals handled from its first line.

Importing the rest of pyvmm takes a while (cffi, the loader, the device
kinds); a Ctrl-C or SIGTERM in that time must end pyvmm like one at any
other moment: exit status 128 + signal and one line on stderr, never a
traceback, never a message from whatever the signal interrupted. So this
module imports nothing of pyvmm's but the trace marks and the stop policy
(pyvmm.common.stopping), installs its handler for SIGINT, SIGTERM and SIGHUP
before anything else, and only then imports the command: cli.py, or
pyvmm.serve for the ``serve`` and ``run`` subcommands.

The interpreter's own start-up, before this module runs, is covered by the
native launcher (csrc/launcher.c, the installed ``pyvmm`` command): it
blocks the stop signals (and SIGUSR1) before it execs the interpreter, and
blocked signals stay blocked across exec. ``main`` unblocks them once its
handlers are in, so a signal sent at any moment since the launcher started
is delivered here, to the handler. ``python3 -m pyvmm`` has no launcher: a
signal in its interpreter's first milliseconds gets Python's own handling.

The handler records the first signal and raises ``stopping.Stop`` (at the next
Python instruction, as KeyboardInterrupt would); whatever that exception
becomes on its way out (Python wraps some, such as a RuntimeError from
``__set_name__``), ``main`` reports the recorded signal. While a guest
runs, C handlers take over (pyvmm_signals_install) and the run ends with
the same status and line (errors.Stopped).

``exit`` ends the process once the status is known and everything that
outlives it (taps, files, the guest's output) is settled: it flushes and
calls os._exit, leaving memory and the remaining descriptors to the kernel
instead of waiting for the interpreter's finalisation (docs/startup.md).
"""

import _signal
import sys

from pyvmm.common import trace

trace.early("interpreter start")

from pyvmm.common import stopping  # noqa: E402  (after the mark: the interpreter's own start)

#: The warm launcher and its client (pyvmm.serve), the command's first word.
SUBCOMMANDS = (["serve"], ["run"], ["snapshot"])


def main() -> int:
    # SIGUSR1 asks a running guest's counters (statsview.py); before the
    # guest runs there are none to print, and it must not kill pyvmm.
    _signal.signal(_signal.SIGUSR1, _signal.SIG_IGN)
    sys.unraisablehook = stopping.quiet_unraisable(sys.unraisablehook)
    status = 1
    try:
        # From the first handler on, a stop raises Stop: inside this try.
        stopping.handle_stop_signals()
        # Blocked by the launcher (or by whoever started pyvmm): a signal
        # pending since then is delivered now, to the handler.
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, stopping.LAUNCH_BLOCKED)
        argv = sys.argv[1:]
        if argv[:1] in SUBCOMMANDS:
            from pyvmm.serve import main as command
        else:
            from pyvmm.command.cli import main as command
        status = command(argv)
        # The status is known: a signal from now on changes nothing (and
        # one that comes first is still caught here).
        stopping.ignore_stop_signals()
    except BaseException:
        if not stopping.stop_signal():
            raise
    stop = stopping.stop_signal()
    if stop:
        stopping.ignore_stop_signals()  # a second signal now changes nothing
        stopping.say(stopping.stop_line(stop))
        return 128 + stop
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
