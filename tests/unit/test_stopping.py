"""The one stop and error policy (pyvmm.common.stopping) that the command and a
serve child share: what each kind of ending says and the status it gives."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from pyvmm.common import stopping
from pyvmm.common.errors import Stopped, UsageError


def test_a_pyvmm_error_is_its_line_and_its_status(capsys):
    def body() -> int:
        raise UsageError("--mem: not a number")

    assert stopping.contained(body) == 1
    assert capsys.readouterr().err == "pyvmm: --mem: not a number\n"


def test_the_explanation_given_replaces_the_message(capsys):
    def body() -> int:
        raise Stopped(15)

    assert stopping.contained(body, lambda err: f"{err} (hint)") == 143
    assert capsys.readouterr().err == "pyvmm: stopped by SIGTERM (Exiting on signal 15) (hint)\n"


def test_a_bug_is_the_one_internal_error_line_and_status_1(capsys, monkeypatch):
    monkeypatch.delenv("PYVMM_DEBUG", raising=False)
    err = KeyError("slot")

    def body() -> int:
        raise err

    assert stopping.contained(body) == 1
    line = capsys.readouterr().err
    assert line == stopping.internal_error_line(err) + "\n"
    assert line == (
        "pyvmm: internal error: KeyError: 'slot' (PYVMM_DEBUG=1 shows where; please report it)\n"
    )


def test_pyvmm_debug_shows_the_bug_itself(monkeypatch):
    monkeypatch.setenv("PYVMM_DEBUG", "1")

    def body() -> int:
        raise KeyError("slot")

    with pytest.raises(KeyError):
        stopping.contained(body)


def test_a_keyboard_interrupt_without_the_entry_point_is_sigint(capsys):
    def body() -> int:
        raise KeyboardInterrupt

    assert stopping.contained(body) == 130
    assert capsys.readouterr().err == "pyvmm: stopped by SIGINT (Exiting on signal 2)\n"


# In a process of its own: the handlers are the process's.
ONE_STOP = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from pyvmm.common import stopping
stopping.handle_stop_signals()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
except stopping.Stop:
    os.kill(os.getpid(), signal.SIGINT)  # while the first is handled: nothing
    print("stopped", stopping.stop_signal())
try:
    stopping.check()  # the recorded stop, raised again at a checkpoint
except stopping.Stop:
    print("checked", stopping.stop_signal())
"""


def test_the_first_stop_signal_raises_once_and_is_remembered():
    done = subprocess.run(
        [sys.executable, "-c", ONE_STOP, str(ROOT)], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "stopped 15\nchecked 15\n", "")
