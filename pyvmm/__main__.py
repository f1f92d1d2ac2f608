"""``python -m pyvmm`` is the ``pyvmm`` command (pyvmm.entry: signals first)."""

from pyvmm.entry import run

run()
