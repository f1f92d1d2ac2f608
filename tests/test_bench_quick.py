"""bench/pps.py --quick runs end to end: one shmstream mode, one repeat,
every table (receive, transmit, latency), and writes valid JSON and its
chart (matplotlib is in the test extra).

Timings are never asserted (docs/benchmarks.md); only that the run works
and that its raw numbers are there and consistent with each other.
"""

from __future__ import annotations

import json
import os
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
        + ["--tx-count", "20000", "--lat-count", "20"],
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
        assert tx["sent"] == 20000 and tx["errors"] == 0 and tx["cpu_us_frame"] > 0
    for lat in raw["summary"]["latency"]:
        assert lat["answered"] + lat["lost"] == 20 and lat["median_us"] > 0
    assert "## receive" in done.stdout and "## latency" in done.stdout
    png = prefix.with_suffix(".png")
    assert f"chart: {png}" in done.stdout
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def run_pps(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pps.py"), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=env,
    )


def test_pps_solo5_rows_receive_through_each_binding(tmp_path: Path) -> None:
    """--solo5: the one Solo5-API receiver, relinked onto pyvmm's runtime,
    unmodified on Solo5's bindings and under solo5-spt, each counts frames
    with no pattern error, on the path its row names."""
    prefix = tmp_path / "pps"
    done = run_pps(
        "--quick",
        "--solo5",
        "--solo5-hvt-seconds",
        "0",
        "--no-baseline",
        "--modes",
        "event",
        "--seconds",
        "0.5",
        "--no-tx",
        "--no-latency",
        "--no-chart",
        "--out",
        str(prefix),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    raw = json.loads(prefix.with_suffix(".json").read_text())
    rows = {r["mode"]: r for r in raw["summary"]["rx"]}
    assert set(rows) == {"event", "s5pyvmm-event", "s5ring-off", "s5ring-event", "solo5-spt"}
    for label, row in rows.items():
        assert row["frames"] > 0 and row["errors"] == 0, (label, row)
    (run,) = raw["rx"]["s5pyvmm-event"]
    assert run["case"]["guest"].endswith("udpsink-pyvmm.hvt")
    assert int(run["guest"]["frames"]) == rows["s5pyvmm-event"]["frames"]
    # Relinked: every frame through pyvmm's shmstream rings, none by hypercall.
    assert run["stats"]["shmstream"] and "solo5_ring" not in (run["stats"] or {})
    (run,) = raw["rx"]["s5ring-event"]
    assert run["case"]["guest"].endswith("udpsink-solo5.hvt")
    assert run["stats"]["solo5_ring"]["ring"]
    (run,) = raw["rx"]["solo5-spt"]
    assert run["case"]["path"].endswith("/solo5-spt") and run["guest_ended"]
    assert any(
        line.startswith("relinked s5pyvmm-event over event: ") for line in raw["solo5_ratios"]
    )
    assert "# relinked s5pyvmm-event over event: " in done.stdout


def test_pps_solo5_without_a_build_says_why_in_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PYVMM_SOLO5_ARCHIVE=str(tmp_path / "missing.tar.gz"))
    done = run_pps("--solo5", "--no-tx", "--no-latency", "--out", str(tmp_path / "p"), env=env)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"pps.py: --solo5: no Solo5 release archive at {tmp_path / 'missing.tar.gz'} "
        "(set PYVMM_SOLO5_ARCHIVE)"
    ]
    assert not (tmp_path / "p.json").exists()
