"""Deprivileged execution: unmodified kernel-mode guests at CPL 3, their
privileged instructions trapped and emulated (docs/pvm.md).

The oracle is the guest itself: solo5seq performs Solo5's privileged
start-up sequence, then checks what it can observe (FS base, its own
exception handlers on its IST stacks, CR2, error codes), and must print the
same lines and exit with the same status at CPL 0, where the CPU does
everything for real.
"""

from __future__ import annotations

import os
import re

import pytest

from conftest import guest, run_pyvmm
from testkit.helpers import STATS, parse_stats

pytestmark = pytest.mark.kvm

PVM = os.path.exists("/sys/module/kvm_pvm")  # asked of the kernel, not of pyvmm


def lines_without_timing(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("elapsed_us:")]


def run_seq(mode: str, *args: str):
    result = run_pyvmm(STATS, f"--cpl={mode}", guest("solo5seq"), *args, timeout=300)
    return result, parse_stats(result.stderr)


def test_solo5_sequence_gives_the_same_result_deprivileged_as_at_cpl0():
    at0, stats0 = run_seq("0")
    dep, stats = run_seq("deprivileged")
    assert at0.returncode == 0, at0.stdout + at0.stderr
    assert dep.returncode == 0, dep.stdout + dep.stderr
    assert lines_without_timing(dep.stdout) == lines_without_timing(at0.stdout)
    assert "SUCCESS" in dep.stdout.splitlines()
    assert (stats0["privilege"], stats0["cpl"]) == ("kernel", 0)
    assert (stats["privilege"], stats["cpl"]) == ("deprivileged", 3)
    # Every step of the sequence was trapped and emulated once, and the
    # three deliberate faults went to the guest's own handlers.
    traps = stats["traps"]
    for name in ("wrmsr", "lgdt", "retf", "mov_to_sreg", "ltr", "lidt", "cli", "sti"):
        assert traps.get(name) == 1, (name, traps)
    for name in ("#UD", "#PF", "#GP"):
        assert traps.get(f"deliver {name}") == 1, (name, traps)
    assert traps["iret"] == 3 and traps["mov_from_cr"] == 1


def emulated_instructions(stats: dict) -> int:
    """KVM's own count of instructions its emulator ran (KVM_GET_STATS_FD)."""
    return stats["kvm"]["insn_emulation"]


def test_deprivileged_computes_natively_on_pvm():
    """The compute loop's instructions reach the CPU, not an emulator.

    Counted, not timed: on kvm_pvm every CPL 0 instruction goes through
    KVM's emulator, so its count grows with the loop; deprivileged, the
    loop runs at CPL 3 and the count stays that of the start-up sequence.
    The speed this buys is bench/cpl.py's to show.
    """
    at0_small, at0_small_stats = run_seq("0", "1")
    at0, at0_stats = run_seq("0", "256")
    dep_small, dep_small_stats = run_seq("deprivileged", "1")
    dep, dep_stats = run_seq("deprivileged", "256")
    for result in (at0_small, at0, dep_small, dep):
        assert result.returncode == 0, result.stdout + result.stderr
    checksum = re.compile(r"^checksum: 0x[0-9a-f]+$", re.M)
    assert checksum.findall(at0.stdout) == checksum.findall(dep.stdout) != []
    assert checksum.findall(at0_small.stdout) == checksum.findall(dep_small.stdout) != []
    assert checksum.findall(at0.stdout) != checksum.findall(at0_small.stdout)
    if PVM:
        words = (256 - 1) * 1024 // 8
        at0_growth = emulated_instructions(at0_stats) - emulated_instructions(at0_small_stats)
        dep_growth = emulated_instructions(dep_stats) - emulated_instructions(dep_small_stats)
        assert at0_growth >= words, (at0_growth, words)
        assert dep_growth < words // 100, (dep_growth, words)


def test_a_trap_report_and_abort_match_cpl0():
    at0, _ = run_seq("0", "abort")
    dep, _ = run_seq("deprivileged", "abort")
    assert at0.returncode == dep.returncode == 255
    assert dep.stdout == at0.stdout
    assert "Solo5: trap: type=#PF ec=0x0" in dep.stdout
    assert "Solo5: trap: cr2=0x10" in dep.stdout


def test_an_unemulated_privileged_instruction_ends_the_run_in_one_line():
    at0, _ = run_seq("0", "cr3")
    assert at0.returncode == 0 and "solo5seq: cr3 reloaded" in at0.stdout
    dep = run_pyvmm("--cpl=deprivileged", guest("solo5seq"), "cr3")
    assert dep.returncode == 1
    message = dep.stderr.strip().splitlines()
    assert len(message) == 1, dep.stderr
    assert re.fullmatch(
        r"pyvmm: guest fault: privileged instruction pyvmm does not emulate \(mov_to_cr\): "
        r"bytes 0f 22 d8 at rip=0x[0-9a-f]+ at solo5_app_main\+0x[0-9a-f]+; run it with --cpl=0",
        message[0],
    )


def test_auto_runs_guests_without_the_note_deprivileged_on_pvm():
    result = run_pyvmm(STATS, guest("solo5seq"), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    stats = parse_stats(result.stderr)
    assert stats["privilege"] == ("deprivileged" if PVM else "kernel")


@pytest.mark.parametrize(
    ("name", "args", "status", "expect"),
    [
        ("hello", (), 0, "SUCCESS"),
        ("args", ("7",), 7, None),
        ("compute", ("64",), 0, "SUCCESS"),
        ("abort", (), 255, "solo5_abort() called"),
        ("fault_zeropage", (), 1, "access to unmapped page zero at 0x0"),
        ("fault_wtext", (), 1, "write to read-only memory at 0x100030"),
        ("fault_xdata", (), 1, "instruction fetch from non-executable memory"),
        ("fault_badptr", (), 1, "bad pointer in puts hypercall"),
    ],
)
def test_every_guest_runs_deprivileged(name, args, status, expect):
    """pyvmm's own guests, forced deprivileged: the note does not matter
    there, and faults are reported as at CPL 0."""
    result = run_pyvmm("--cpl=deprivileged", guest(name), *args)
    assert result.returncode == status, result.stdout + result.stderr
    if expect is not None:
        assert expect in result.stdout + result.stderr


def test_host_info_says_what_auto_does():
    result = run_pyvmm("--host-info")
    assert result.returncode == 0
    if PVM:
        assert "others deprivileged" in result.stdout
    else:
        assert "--cpl=auto runs guests at CPL 0" in result.stdout
