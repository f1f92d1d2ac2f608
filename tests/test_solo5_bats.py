"""Solo5's own test suite, tests/tests.bats from the release archive,
unmodified, with pyvmm as both solo5-hvt and solo5-hvt-debug
(scripts/solo5_bats.py; docs/solo5-bindings.md).

bats runs the 28 hvt cases of tests.bats over a temporary copy of the
built Solo5 tree whose two tenders are symlinks to pyvmm's launcher, inside
a namespace holding tests.bats' taps. Four cases are OpenBSD-only (bats
skips them on Linux); of the 24 it runs, 23 pass, test_dumpcore among them
(solo5-hvt-debug's --dumpcore, its core file checked by tests.bats itself).
The one failure, xnow, is the guest's own fault on a write to its text,
where tests.bats expects solo5-hvt's report of a read-only host mapping:
the reason is in docs/solo5-bindings.md. About a minute here (the bats
run 35 s of it).
"""

from __future__ import annotations

import subprocess
import sys
import unittest.mock
from pathlib import Path

import pytest
from pyroute2 import netns

from scripts import solo5_bats

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

ROOT = Path(__file__).resolve().parent.parent
HVT_CASES = 28
#: tests.bats runs these on OpenBSD only ("not supported on Linux").
OPENBSD_ONLY = {"rnow hvt", "xnor hvt", "rnox hvt", "wnox hvt"}
#: tests.bats' own flaky-case rule: test_time's "slept too little" on a
#: Debian host is a skip, not a failure.
FLAKY = {"time hvt": "flaky, ignored"}
#: The one case pyvmm cannot pass as tests.bats words it (docs/solo5-bindings.md).
KNOWN_FAILURES = {"xnow hvt"}
AT_LEAST = 23  # of the 24 hvt cases tests.bats runs on Linux


def fake_bats(where: Path, body: str) -> Path:
    """A ``bats`` that does ``body`` instead of running tests.bats."""
    where.mkdir(exist_ok=True)
    fake = where / "bats"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    return fake


def bats_run(*args: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "solo5_bats.py"), *args],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    return done.returncode, done.stdout, done.stderr


def our_namespaces() -> list[str]:
    return [name for name in netns.listnetns() if name.startswith("pyvmm-s5bats-")]


def temp_trees() -> set[Path]:
    import tempfile

    return set(Path(tempfile.gettempdir()).glob("pyvmm-solo5-bats-*"))


@pytest.fixture(scope="module")
def pyvmm_run() -> tuple[int, str, str, set[Path]]:
    before = temp_trees()
    status, out, err = bats_run("--tender", "pyvmm")
    return status, out, err, temp_trees() - before


def test_tests_bats_with_pyvmm_as_solo5_hvt_and_solo5_hvt_debug(pyvmm_run):
    status, out, err, _ = pyvmm_run
    summary = solo5_bats.parse_tap(out.splitlines())
    shown = f"{out[-3000:]}\n{err[-2000:]}"
    # Every hvt case of tests.bats ran and was reported: nothing passes by
    # not running.
    assert summary.planned == HVT_CASES, shown
    assert summary.run == HVT_CASES, shown
    assert set(summary.skipped) - OPENBSD_ONLY <= set(FLAKY), shown
    assert OPENBSD_ONLY <= set(summary.skipped), shown
    for name, reason in summary.skipped.items():
        assert reason == FLAKY.get(name, "not supported on Linux"), (name, reason)
    # solo5-hvt-debug's --dumpcore: tests.bats checks the core file itself.
    assert "dumpcore hvt" in summary.passed, shown
    assert set(summary.failed) <= KNOWN_FAILURES, shown
    flaky_skips = len(set(summary.skipped) & set(FLAKY))
    assert len(summary.passed) >= AT_LEAST - flaky_skips, shown
    # The summary line says the same, and a failed case fails the script.
    assert f"solo5-bats: {summary.line('pyvmm')}" in out
    assert status == (1 if summary.failed else 0), shown


def test_xnow_fails_for_its_documented_reason(pyvmm_run):
    """The guest's own trap handler (255 + ABORT) or pyvmm's fault line in
    user mode reports the write to read-only text, not a host mapping."""
    _, out, _, _ = pyvmm_run
    summary = solo5_bats.parse_tap(out.splitlines())
    if "xnow hvt" not in summary.failed:
        pytest.fail("xnow hvt passes now: update KNOWN_FAILURES and docs/solo5-bindings.md")
    text = "\n".join(summary.output["xnow hvt"])
    assert "test_xnow" in text, text
    assert "Fatal trap" in text or "write to read-only memory" in text, text


def test_the_namespace_and_the_copy_are_gone_afterwards(pyvmm_run):
    assert our_namespaces() == []
    assert pyvmm_run[3] == set()


def test_namespace_removed_when_bats_cannot_run(tmp_path):
    """A bats that fails at once still leaves no namespace or tree behind."""
    fake = fake_bats(tmp_path, "echo 'not a TAP stream'; exit 3")
    before = temp_trees()
    with unittest.mock.patch.object(solo5_bats, "ensure_bats", return_value=str(fake)):
        status = solo5_bats.main(["--tender", "pyvmm"])
    assert status == 1
    assert our_namespaces() == []
    assert temp_trees() - before == set()


def test_sigterm_removes_the_namespace_and_the_copy(tmp_path):
    """SIGTERM while bats runs: status 143, one line, nothing left."""
    import os
    import signal
    import time

    fake = fake_bats(tmp_path / "bin", f"touch {tmp_path}/started; echo 1..1; exec sleep 600")
    before = temp_trees()
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "solo5_bats.py")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(600):  # until bats runs inside the namespace (a hang guard)
        if (tmp_path / "started").exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    assert (tmp_path / "started").exists(), proc.communicate(timeout=60)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert err.strip().splitlines()[-1] == "solo5-bats: stopped by signal 15", err
    assert our_namespaces() == []
    assert temp_trees() - before == set()


def test_tap_parsing():
    lines = [
        "1..4",
        "ok 1 hello hvt",
        "ok 2 rnow hvt # skip not supported on Linux",
        "not ok 3 xnow hvt",
        "# (in test file tests.bats, line 363)",
        "# Solo5: ABORT: cpu_x86_64.c:182: Fatal trap",
        "ok 4 time hvt # skip (flaky, ignored)",
        "# a comment after a passing case",
    ]
    summary = solo5_bats.parse_tap(lines)
    assert summary.planned == 4 and summary.run == 4
    assert summary.passed == ["hello hvt"]
    assert summary.failed == ["xnow hvt"]
    assert summary.skipped == {"rnow hvt": "not supported on Linux", "time hvt": "flaky, ignored"}
    assert summary.output["xnow hvt"][-1] == "Solo5: ABORT: cpu_x86_64.c:182: Fatal trap"
    assert summary.line("pyvmm") == ("pyvmm: 4 hvt cases: 1 passed, 1 failed (xnow hvt), 2 skipped")
