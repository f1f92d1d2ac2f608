"""``python -m pyvmm`` is the ``pyvmm`` command (pyvmm.entry: signals first)."""

import sys

from pyvmm.entry import main

sys.exit(main())
