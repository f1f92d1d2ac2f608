"""Debugging a guest: core files (core.py, corelink.py), the guest's
registers at a fault (regs.py) and symbolised fault reports (symbols.py,
report.py).

Everything here is set up before the sandbox goes on and reads the guest
only through the guest-memory accessor (pyvmm/memory.py); docs/debugging.md.
"""
