"""bench/ctr.py runs end to end: one counted round of every row (cold,
warm, runc), each with its breakdown, and nothing left behind.

Timings are never asserted (docs/benchmarks.md); only that every row ran
and was broken down, and that the warm row was the warm path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need_tool

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.kvm


def test_one_round_gives_every_row_and_its_breakdown():
    for tool in ("containerd", "ctr", "containerd-shim-runc-v2", "runc", "gcc"):
        need_tool(tool)
    before = set(os.listdir("/tmp"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ctr.py"), "-n", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "warm: not available" not in out, out
    table, breakdown = out.split("breakdown of the traced runs")
    for row in ("pyvmm-oci cold", "pyvmm-oci warm", "runc, static hello"):
        assert f"\n{row} " in table, out
    lines = {line.split("  ")[0]: line.split() for line in breakdown.splitlines() if line}
    for part in (
        "ctr to the snapshot",  # containerd's steps, from its debug log
        "container to the shim",
        "shim to create (rootfs mount)",
        "create",
        "start",
        "delete",
        "delete to the shim's end",
        "container deleted to ctr's exit",
    ):
        cells = lines[part][-3:]
        assert all(cell != "-" for cell in cells), (part, cells)
    # The VM's phases: the cold VM's interpreter, the warm VM's hand-over.
    cold, warm, runc = lines["pyvmm start"][-3:]
    assert cold != "-" and (warm, runc) == ("-", "-")
    cold, warm, runc = lines["launcher hand-over"][-3:]
    assert warm != "-" and (cold, runc) == ("-", "-")
    assert "cleaned up after containerd" not in done.stderr
    left = {
        n for n in set(os.listdir("/tmp")) - before if n.startswith(("bench-ctr-", "pyvmm-oci-"))
    }
    assert not left, left
