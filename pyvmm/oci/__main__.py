"""``python3 -m pyvmm.oci``: the pyvmm-oci runtime command."""

import sys

from pyvmm.oci.runtime import main

sys.exit(main())
