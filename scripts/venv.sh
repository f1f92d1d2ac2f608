# Sourced by scripts/setup, scripts/test, scripts/demo and scripts/test-aarch64:
# the virtual environment pyvmm is installed into, first on PATH.
#
# A virtual environment is how a stock Debian machine takes packages from PyPI:
# its own python3 refuses `pip install` (PEP 668, "externally managed"), and
# a venv keeps pyvmm's dependencies apart from the system's. PYVMM_VENV moves
# it (default: .venv in this checkout).
PYVMM_VENV=${PYVMM_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv}
export PYVMM_VENV
export PATH="$PYVMM_VENV/bin:$PATH"
