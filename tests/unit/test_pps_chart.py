"""bench/pps.py's chart, drawn from the committed run's JSON (no KVM, no
measuring): everything a reader needs is on it and nothing is cut off,
and `--redraw` refuses a bad file with one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "pps-results.json"
sys.path.insert(0, str(ROOT))

# matplotlib is in the test extra (pyproject.toml): no skip when it is missing.
from bench import pps, pps_chart  # noqa: E402


@pytest.fixture(scope="module")
def raw() -> dict:
    return json.loads(RESULTS.read_text())


@pytest.fixture(scope="module")
def fig(raw):
    import matplotlib.pyplot as plt

    fig = pps_chart.figure(raw, pps.SUMMARIZERS)
    fig.canvas.draw()
    yield fig
    plt.close(fig)


def texts(fig) -> list:
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_no_text_is_cut_off(fig):
    renderer = fig.canvas.get_renderer()
    width, height = fig.canvas.get_width_height()
    for t in texts(fig):
        box = t.get_window_extent(renderer)
        assert box.x0 >= -1 and box.x1 <= width + 1, t.get_text()
        assert box.y0 >= -1 and box.y1 <= height + 1, t.get_text()


def test_each_panel_says_which_way_is_better_and_uses_readable_units(fig):
    rx, tx, lat = fig.axes[:3]  # axes[3]: receive's exits axis
    assert "higher is better" in rx.get_title(loc="left")
    assert "higher is better" in tx.get_title(loc="left")
    assert "lower is better" in lat.get_title(loc="left")
    assert "µs" in lat.get_ylabel()
    assert not [t.get_text() for t in texts(fig) if " us" in t.get_text()]
    ticks = [t.get_text() for t in rx.get_yticklabels() if t.get_text()]
    assert "200k" in ticks and not any(len(t) > 5 for t in ticks), ticks


def test_emulated_tender_is_marked(fig, raw):
    assert raw["machine"]["kvm"] == "pvm"
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "solo5-hvt\n(emulated)" in labels
    assert "instruction emulator" in fig.get_supxlabel()


def test_transmit_panel_shows_every_row(fig, raw):
    tx = fig.axes[1]
    labels = [t.get_text().split("\n")[0] for t in tx.get_xticklabels()]
    assert labels == pps_chart.modes_of(raw)
    # Each transmit row's value is printed (a bar too short to see still
    # reads), and the row transmit did not run says so.
    printed = {t.get_text() for t in tx.texts}
    for row in raw["summary"]["tx"]:
        assert pps_chart.short(row["host_pps"]) in printed, row["mode"]
    assert "not run:\nreceive-only guest" in printed


def test_whiskers_are_the_lowest_and_highest_run(raw):
    runs = pps_chart.Runs(raw, "rx", pps.SUMMARIZERS["rx"])
    each = [pps.summarize_rx(r)["received"] for r in raw["rx"]["poll"]]
    med = runs.value("poll", "received")
    assert runs.whisker("poll", "received") == pytest.approx((med - min(each), max(each) - med))
    assert min(each) < med < max(each)


def test_bars_carry_error_bars(fig):
    for ax in fig.axes[:3]:
        bars = [c for c in ax.containers if hasattr(c, "errorbar")]
        assert bars and all(c.errorbar is not None for c in bars)


def test_redraw_writes_png_beside_the_json(tmp_path):
    saved = tmp_path / "run.json"
    shutil.copy(RESULTS, saved)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pps.py"), "--redraw", str(saved)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    png = saved.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20000


@pytest.mark.parametrize(
    "content", ["{not json", json.dumps([1, 2]), json.dumps({"summary": {"rx": [{"x": 1}]}})]
)
def test_redraw_refuses_a_bad_file_in_one_line(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pps.py"), "--redraw", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not bad.with_suffix(".png").exists()
