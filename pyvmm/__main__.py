"""``python -m pyvmm`` is the ``pyvmm`` command."""

import sys

from pyvmm.cli import main

sys.exit(main())
