"""Debugging a guest: the GDB stub (gdbstub.py: the session; rsp.py: the
remote protocol's packets; gdbregs.py: x86_64's registers as gdb numbers
them; gdbviews.py: where a stopped guest's registers live), core files
(core.py, corelink.py), the guest's registers at a fault (regs.py) and
symbolised fault reports (symbols.py, report.py).

Everything here is set up before the sandbox goes on and reads the guest
only through the guest-memory accessor (pyvmm/kvm/memory.py); docs/debugging.md.
"""
