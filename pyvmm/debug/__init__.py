"""Debugging a guest: core files (core.py), symbolised fault reports
(symbols.py, report.py) and the GDB remote stub (gdbstub.py).

Everything here is set up before the sandbox goes on and reads the guest
only through the guest-memory accessor (pyvmm/memory.py); docs/debugging.md.
"""
