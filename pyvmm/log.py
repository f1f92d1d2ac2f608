"""pyvmm's log: what it decided and why, for -v / -vv / --log-level.

Messages go to the ``pyvmm`` logger; the command (cli.py) shows them on
stderr as ``pyvmm: ...`` lines at the level asked for: warnings by default
(only what solo5-hvt would print too, such as "adjusting memory to ..."),
``info`` with -v (privilege mode, device back ends, memory layout, ring
placement), ``debug`` with -vv (also the vCPU's registers when a run ends
in a fault), ``error`` with --quiet (no warnings). A program using pyvmm as
a library configures the logger as it likes.
"""

from __future__ import annotations

import logging

log = logging.getLogger("pyvmm")
