"""bench/pps.py --solo5's comparisons: each taken per repeat (rows of one
repeat ran back to back), reported as the median with its range and
judged against its goal."""

from __future__ import annotations

from bench.pps import paired_ratio, solo5_ratios


def test_paired_ratio_pairs_repeats_and_skips_a_missing_run() -> None:
    assert paired_ratio([10, 20, None], [10, 10, 5]) == (1.5, 1.0, 2.0)
    assert paired_ratio([None], [1]) is None


def test_each_comparison_is_made_from_its_rows() -> None:
    rates = {
        "poll": [100.0, 200.0, 100.0],
        "event": [100.0, 100.0, 100.0],
        "hybrid": [90.0, 90.0, 90.0],
        "s5pyvmm-event": [80.0, 95.0, 120.0],
        "s5ring-event": [1000.0, 3000.0, 2500.0],
        "solo5-hvt": [100.0, 100.0, 100.0],
    }
    lines = solo5_ratios(rates)
    assert lines == [
        "relinked s5pyvmm-event over event: 0.95x (per repeat 0.80-1.20; target >= 0.9x: ok)",
        "unmodified s5ring-event over solo5-hvt: 25.00x (per repeat 10.00-30.00; "
        "target >= 20x: ok)",
        # poll's median (100) ties event's: the first of the modes is the best.
        "hybrid over the best mode, poll: 0.90x (per repeat 0.45-0.90; target within 20%: ok)",
    ]


def test_a_ratio_below_its_goal_says_so() -> None:
    lines = solo5_ratios({"poll": [100.0], "s5pyvmm-poll": [50.0], "hybrid": [10.0]})
    assert lines == [
        "relinked s5pyvmm-poll over poll: 0.50x (per repeat 0.50-0.50; target >= 0.9x: below)",
        "hybrid over the best mode, poll: 0.10x (per repeat 0.10-0.10; target within 20%: below)",
    ]
