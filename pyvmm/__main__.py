"""``python -m pyvmm`` is the ``pyvmm`` command (pyvmm.command.entry: signals first)."""

from pyvmm.command.entry import run

run()
