"""bench/ctr.py's one run of ``ctr run --rm``: a run whose output ctr lost
(exit 0, nothing printed: ctr's copy of a short-lived container's stdout
races its exit) is run again under a new id and counted, any other failure
ends the benchmark, and a traced run's breakdown reads only its own calls.
A fake ctr (a Python one-liner) stands in for containerd."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ctr():
    spec = importlib.util.spec_from_file_location("bench_ctr", ROOT / "bench" / "ctr.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeContainerd:
    """run_argv: a command that prints the output from try ``good_from``
    on (counted in a file), exiting with ``status``."""

    def __init__(self, tmp_path: Path, output: str, good_from: int, status: int = 0) -> None:
        self.count = tmp_path / "tries"
        self.output, self.good_from, self.status = output, good_from, status
        self.ids: list[str] = []

    def run_argv(self, ref, cid, options=(), runtime=None, runc_root=None):
        self.ids.append(cid)
        script = (
            "import pathlib, sys\n"
            f"p = pathlib.Path({str(self.count)!r})\n"
            "n = int(p.read_text()) + 1 if p.exists() else 1\n"
            "p.write_text(str(n))\n"
            f"print({self.output!r} if n >= {self.good_from} else '')\n"
            f"sys.exit({self.status})\n"
        )
        return [sys.executable, "-c", script]


def _row(ctr):
    return ctr.Row("runc, static hello", "ref", "runc", "/run/x")


def test_a_run_whose_output_ctr_lost_is_run_again_under_a_new_id(ctr, tmp_path, monkeypatch):
    monkeypatch.setattr(ctr, "LOST_OUTPUT", {})
    ctd = FakeContainerd(tmp_path, ctr.OUTPUT, good_from=2)
    begin, end, used = ctr.ctr_run(ctd, _row(ctr), "b1-hello", "runc")
    assert ctd.ids == ["b1-hello", "b1-hellor1"] and used == "b1-hellor1"
    assert 0 < begin < end
    assert ctr.LOST_OUTPUT == {"runc, static hello": 1}


def test_output_lost_every_time_ends_the_benchmark(ctr, tmp_path, monkeypatch):
    monkeypatch.setattr(ctr, "LOST_OUTPUT", {})
    ctd = FakeContainerd(tmp_path, ctr.OUTPUT, good_from=99)
    with pytest.raises(SystemExit, match=f"without 'Hello, world' on its output {ctr.TRIES} times"):
        ctr.ctr_run(ctd, _row(ctr), "b1-hello", "runc")
    assert len(ctd.ids) == ctr.TRIES


def test_a_failed_run_is_not_tried_again(ctr, tmp_path, monkeypatch):
    monkeypatch.setattr(ctr, "LOST_OUTPUT", {})
    ctd = FakeContainerd(tmp_path, ctr.OUTPUT, good_from=1, status=3)
    with pytest.raises(SystemExit, match="ctr run: exit status 3"):
        ctr.ctr_run(ctd, _row(ctr), "b1-hello", "runc")
    assert ctd.ids == ["b1-hello"] and ctr.LOST_OUTPUT == {}


def test_the_breakdown_reads_only_the_calls_after_the_runs_fork(ctr):
    ms = 1_000_000
    earlier = [("create", 1 * ms, 2 * ms), ("start", 3 * ms, 4 * ms), ("delete", 5 * ms, 6 * ms)]
    mine = [("create", 20 * ms, 22 * ms), ("start", 23 * ms, 24 * ms), ("delete", 26 * ms, 27 * ms)]
    parts = ctr.breakdown(earlier + mine, 10 * ms, 30 * ms)
    assert parts["create"] == 2 and parts["start"] == 1 and parts["delete"] == 1
