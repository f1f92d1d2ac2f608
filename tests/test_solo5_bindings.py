"""pyvmm's guest runtime as a Solo5 bindings target (docs/solo5-bindings.md).

Solo5's own hvt test programs, built from the release archive by
scripts/solo5_build.py and relinked from their unchanged objects with
``-z solo5-abi=pyvmm``, run under pyvmm with the expectation Solo5's
tests.bats states (the case table is scripts/solo5_check.py's): the network
cases in every --shm mode, with tests.bats' flood pings inside a namespace
each case makes, the rest once. Then the same binaries on the solo5-hvt
built from the same archive (no rings: hypercalls), at CPL 0 under pyvmm
(the runtime's own trap handlers), a Solo5 program using the batching and
zero-copy calls, and the build script's cache, lock and install command.

Where /dev/kvm exists the Solo5 archive must be there too: a missing one
fails these tests (it is in ../shared on every machine), it never skips them.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from pyvmm.kvm.system import kvm_flavour
from scripts import solo5_build, solo5_check
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

MODES = ("off", "poll", "event", "hybrid")
# A hang guard, not a measure: tests.bats' 60 s is tight for a flood of
# 100000 pings on a loaded 2-core machine, and the count is what is checked.
TIMEOUT = 300.0
MEM = 4096  # MiB, as tests.bats' hvt_run
PVM = kvm_flavour() == "pvm"
# The mode a relinked program gets by default: it declares user mode.
DEFAULT_PRIVILEGE = "user" if PVM else "kernel"


@pytest.fixture(scope="session")
def solo5() -> solo5_build.Solo5Build:
    """Solo5 built from the archive (once per machine), pyvmm's bindings
    installed into its toolchain, its test programs relinked."""
    try:
        return solo5_build.ensure(log=lambda message: print(f"solo5-build: {message}"))
    except solo5_build.BuildError as err:
        pytest.fail(f"Solo5 from the release archive: {err}")


def run(solo5, name: str, *extra: str, bindings: str = "pyvmm", tender: str = "pyvmm"):
    case = solo5_check.CASE_NAMES[name]
    build_tender = solo5_check.make_tender(tender, solo5)
    kernel = solo5_check.programs(solo5, bindings) / f"{case.kernel}.hvt"
    return solo5_check.run_case(case, kernel, build_tender, bindings, MEM, list(extra), TIMEOUT)


def describe(result) -> str:
    return (
        f"{result.case.name}: {result.verdict} (status {result.status}), expected "
        f"{result.expected}\n{result.output[-3000:]}\npings: {result.pings}"
    )


# -- Solo5's test programs, relinked, under pyvmm ---------------------------------

ONCE = [
    c.name for c in solo5_check.CASES if not c.nets and not c.info and c.name not in ("dumpcore",)
]


@pytest.mark.parametrize("name", ONCE)
def test_relinked_program_meets_tests_bats(solo5, name):
    result = run(solo5, name)
    assert result.verdict == "PASS", describe(result)
    if not result.case.direct and result.stats is not None:
        assert result.privilege == DEFAULT_PRIVILEGE, describe(result)


def test_relinked_dumpcore_writes_the_core_tests_bats_looks_for(solo5):
    """tests.bats runs test_dumpcore under solo5-hvt-debug --dumpcore=DIR:
    status 255 and the core file the output names, in DIR."""
    result = run(solo5, "dumpcore")
    assert result.verdict == "PASS", describe(result)
    assert "dumpcore: dumping guest core to: " in result.output, describe(result)


def received(summary: str) -> tuple[int, int]:
    """(transmitted, received) from ping's summary line."""
    words = summary.replace(",", "").split()
    return int(words[words.index("packets") - 1]), int(words[words.index("received") - 1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", solo5_check.NET_CASES)
def test_relinked_network_program_in_every_mode(solo5, name, mode):
    result = run(solo5, name, f"--shm={mode}")
    assert result.verdict == "PASS", describe(result)
    for summary, ping in zip(result.pings, result.case.pings, strict=True):
        count = int(ping[ping.index("-c") + 1])
        assert received(summary) == (count, count), describe(result)
    stats = result.stats
    assert stats is not None and result.privilege == DEFAULT_PRIVILEGE, describe(result)
    names = [device for device, _ in result.case.nets]
    if name == "net_mtu":  # a 9000-byte MTU cannot use shmstream slots
        assert "shmstream" not in stats, describe(result)
    elif mode == "off":
        assert "shmstream" not in stats, describe(result)
        assert stats["hypercalls"]["net_write"] > 0, describe(result)
    else:
        shm = stats["shmstream"]
        assert shm["mode"] == mode
        assert sorted(shm["devices"]) == sorted(names), describe(result)
        # Every frame through the rings: not one net hypercall.
        assert "net_read" not in stats["hypercalls"], describe(result)
        assert "net_write" not in stats["hypercalls"], describe(result)
        sent = sum(int(p[p.index("-c") + 1]) for p in result.case.pings)
        rx = sum(shm["devices"][d]["rx_frames"] for d in names)
        tx = sum(shm["devices"][d]["tx_frames"] for d in names)
        assert rx >= sent and tx >= sent, describe(result)


# At CPL 0 (solo5-hvt's level, emulated on a PVM host) the runtime loads its
# own IDT: a trap is reported and the guest aborts, tests.bats' 255 + ABORT.
@pytest.mark.parametrize("name", ["exception", "zeropage", "notls", "xnow"])
def test_relinked_traps_abort_at_cpl0(solo5, name):
    result = run(solo5, name, "--cpl=0")
    assert result.privilege == "kernel"
    assert result.status == 255, describe(result)
    assert "pyvmm-rt: trap: vector 14 (#PF)" in result.output, describe(result)
    assert result.verdict == "PASS", describe(result)


# -- the same binaries on a stock solo5-hvt: no rings, hypercalls ------------------


@pytest.mark.parametrize("name", ["hello", "quiet", "globals", "tls", "blk", "ssp", "exception"])
def test_relinked_program_runs_on_solo5_hvt(solo5, name):
    result = run(solo5, name, tender="solo5-hvt")
    assert result.verdict == "PASS", describe(result)


def test_relinked_network_program_answers_on_solo5_hvt(solo5):
    """test_net without its limit serves until stopped: a few pings (guest
    code runs at CPL 0, which a PVM host emulates, so no flood)."""
    kernel = solo5.pyvmm_tests / "test_net.hvt"
    with NetNamespace(prefix="pyvmm-s5hvt-") as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        proc = ns.popen(
            [str(solo5.solo5_hvt), "--mem=64", "--net:service0=tap100", "--", str(kernel)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            line = ""
            for line in proc.stdout:
                if "Serving ping on 10.0.0.2" in line:
                    break
            assert "Serving ping" in line, line
            pings = ns.run(
                ["ping", "-c", "5", "-i", "0.2", "-W", "10", "10.0.0.2"],
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    assert " 5 received" in pings.stdout, pings.stdout + pings.stderr


# -- the batching and zero-copy calls: a Solo5 program that uses them ---------------

APPS = Path(__file__).resolve().parent / "solo5apps"


@pytest.fixture(scope="session")
def batch_ping(solo5, tmp_path_factory) -> Path:
    """tests/solo5apps/batch_ping.c built with Solo5's toolchain: manifest
    from solo5-elftool, compiled by its cc, linked by cc -z solo5-abi=pyvmm."""
    out = tmp_path_factory.mktemp("batch_ping")
    steps = [
        [str(solo5.elftool), "gen-manifest", str(APPS / "batch_ping.json"), str(out / "mft.c")],
        [str(solo5.cc), "-O2", "-Wall", "-Wextra", "-Werror", "-c", str(out / "mft.c")],
        [str(solo5.cc), "-O2", "-Wall", "-Wextra", "-Werror", "-c", str(APPS / "batch_ping.c")],
        [str(solo5.cc), "-z", "solo5-abi=pyvmm", "batch_ping.o", "mft.o", "-o", "batch_ping.hvt"],
    ]
    for argv in steps:
        done = subprocess.run(argv, cwd=out, capture_output=True, text=True)
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return out / "batch_ping.hvt"


@pytest.mark.parametrize("mode", MODES)
def test_batching_calls_answer_a_flood(batch_ping, mode, tmp_path):
    count = 5000
    stats_file = tmp_path / "stats.json"
    with NetNamespace(prefix="pyvmm-s5batch-") as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        proc, _ = ns.start_pyvmm(
            f"--shm={mode}",
            f"--stats-json={stats_file}",
            "--net:service0=tap100",
            "--",
            str(batch_ping),
            str(count),
        )
        pings = ns.run(
            ["ping", "-fq", "-c", str(count), "-w", "120", "10.0.0.2"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert f"answered {count} echo requests" in out and "SUCCESS" in out, out + err
    assert f"{count} packets transmitted, {count} received" in pings.stdout, pings.stdout
    stats = json.loads(stats_file.read_text().splitlines()[-1])
    hypercalls = stats["hypercalls"]
    if mode == "off":
        # solo5_net_queue is solo5_net_write there, the zero-copy read a net_read.
        assert hypercalls["net_write"] >= count and hypercalls["net_read"] >= count
    else:
        device = stats["shmstream"]["devices"]["service0"]
        assert device["tx_frames"] >= count and device["rx_frames"] >= count
        assert "net_write" not in hypercalls and "net_read" not in hypercalls


def test_jumbo_tap_is_served_by_hypercalls_with_rings_on(batch_ping, tmp_path):
    """A 9000-byte MTU does not fit a shmstream slot: that device gets the
    hvt hypercalls (and the zero-copy read the runtime's own buffer), the
    guest still starts and answers 8000-byte pings, as under solo5-hvt."""
    stats_file = tmp_path / "stats.json"
    with NetNamespace(prefix="pyvmm-s5jumbo-") as ns:
        ns.add_tap("tap100", address="10.0.0.1/24", mtu=9000)
        proc, _ = ns.start_pyvmm(
            "--shm=poll",
            f"--stats-json={stats_file}",
            "--net:service0=tap100",
            "--",
            str(batch_ping),
            "20",
        )
        pings = ns.run(
            ["ping", "-c", "20", "-i", "0.05", "-s", "8000", "-W", "5", "10.0.0.2"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "SUCCESS" in out, out + err
    assert "20 packets transmitted, 20 received" in pings.stdout, pings.stdout
    stats = json.loads(stats_file.read_text().splitlines()[-1])
    assert "shmstream" not in stats
    assert stats["hypercalls"]["net_write"] >= 20 and stats["hypercalls"]["net_read"] >= 20


# -- the build script: cache, stamp, lock, install ----------------------------------


def test_second_ensure_reuses_the_build(solo5):
    stamp = solo5.stamp.read_text()
    started = time.monotonic()
    again = solo5_build.ensure(log=lambda message: None)
    assert again.root == solo5.root and again.pyvmm_tests == solo5.pyvmm_tests
    assert solo5.stamp.read_text() == stamp  # not rebuilt
    assert json.loads(stamp)["archive_sha256"] == solo5_build.sha256_of(solo5_build.archive_path())
    assert time.monotonic() - started < 120  # a hang guard: no Solo5 build


def test_stamp_of_another_archive_does_not_match(solo5, tmp_path):
    fake = solo5_build.Solo5Build(tmp_path / "solo5", solo5.triple)
    fake.root.mkdir()
    assert not solo5_build.stamp_matches(fake, "0" * 64)  # no stamp
    real = json.loads(solo5.stamp.read_text())
    assert solo5_build.stamp_matches(solo5, real["archive_sha256"])
    assert not solo5_build.stamp_matches(solo5, "0" * 64)
