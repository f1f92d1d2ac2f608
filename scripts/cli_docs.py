#!/usr/bin/env python3
"""Write docs/pyvmm.1 and scripts/pyvmm-completion.bash from pyvmm's option
table (pyvmm/command/clidocs.py); with --check, only say whether they are stale."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyvmm.command import clidocs  # noqa: E402

FILES = {
    ROOT / "docs" / "pyvmm.1": clidocs.man_page,
    ROOT / "scripts" / "pyvmm-completion.bash": clidocs.bash_completion,
}


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for path, make in FILES.items():
        text = make()
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not check:
            path.write_text(text)
    for path in stale:
        print(f"{'stale' if check else 'wrote'}: {path}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
