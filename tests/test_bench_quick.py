"""bench/pps.py --quick runs end to end: one shmstream mode, one repeat,
every table (receive, transmit, latency), and writes valid JSON and its
chart (matplotlib is in the test extra).

Timings are never asserted (docs/benchmarks.md); only that the run works
and that its raw numbers are there and consistent with each other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.kvm, pytest.mark.netns]


def test_pps_quick_writes_json_and_chart(tmp_path: Path) -> None:
    prefix = tmp_path / "pps"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pps.py"), "--quick", "--modes", "poll"]
        + ["--seconds", "0.5", "--repeat", "1", "--ring-guest", "", "--out", str(prefix)]
        + ["--tx-count", "2000", "--lat-count", "20"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    raw = json.loads(prefix.with_suffix(".json").read_text())
    (run,) = raw["rx"]["poll"]
    base, rx = raw["summary"]["rx"]
    assert (base["mode"], rx["mode"]) == ("process", "poll")
    # Every frame the guest counted passed the tap, and the sender sent it.
    assert 0 < rx["frames"] <= run["tap"]["tx_packets"] <= run["sent"]["sent"]
    assert rx["errors"] == 0 and base["errors"] == 0 and base["frames"] > 0
    assert "kvm_exits_s" in rx and "io_cpu" in rx
    # Every row is a ratio to the baseline process of the same repeat.
    assert base["ratio"] == 1.0 and rx["ratio"] > 0 and rx["cpu_us_frame"] > 0
    for run in (r for runs in raw["tx"].values() for r in runs):
        assert run["ended"], f"{run['case']}: udpsend did not end:\n{run['output_tail']}"
    for tx in raw["summary"]["tx"]:
        assert tx["sent"] == 2000 and tx["errors"] == 0 and tx["cpu_us_frame"] > 0
    for lat in raw["summary"]["latency"]:
        assert lat["answered"] + lat["lost"] == 20 and lat["median_us"] > 0
    assert "## receive" in done.stdout and "## latency" in done.stdout
    png = prefix.with_suffix(".png")
    assert f"chart: {png}" in done.stdout
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
