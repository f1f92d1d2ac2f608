"""A guest that faults or passes a bad pointer is stopped with a one-line
message and a non-zero exit; the host process never crashes."""

from __future__ import annotations

import pytest

from conftest import guest, run_pyvmm

# Every guest runs at both privilege levels: 0 as solo5-hvt runs it, 3 in
# pyvmm's user-mode profile (the guests declare they can).
pytestmark = [pytest.mark.kvm, pytest.mark.parametrize("cpl", ["0", "3"])]


def assert_stopped(result, *words: str) -> None:
    # README: a guest that faults or passes a bad pointer: exit status 1.
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILURE" not in result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pyvmm: guest fault")
    for word in words:
        assert word in lines[0]


def test_write_to_own_text_is_stopped(cpl):
    assert_stopped(run_pyvmm(f"--cpl={cpl}", guest("fault_wtext")), "read-only")


def test_execute_data_is_stopped(cpl):
    assert_stopped(run_pyvmm(f"--cpl={cpl}", guest("fault_xdata")), "non-executable")


def test_read_page_zero_is_stopped(cpl):
    assert_stopped(run_pyvmm(f"--cpl={cpl}", guest("fault_zeropage")))


def test_bad_hypercall_pointer_is_stopped(cpl):
    assert_stopped(run_pyvmm(f"--cpl={cpl}", guest("fault_badptr")), "outside guest memory")
