"""Integration: every guest in guests/ boots on real KVM with the right output
and exit status, exactly as it would under solo5-hvt."""

from __future__ import annotations

import pytest

from conftest import guest, run_pyvmm

pytestmark = pytest.mark.kvm


def test_hello_prints_and_exits_zero():
    result = run_pyvmm(guest("hello"))
    assert result.returncode == 0, result.stderr
    assert "Hello, world" in result.stdout
    assert result.stdout.rstrip().endswith("SUCCESS")
    assert result.stderr == ""


def test_args_passes_command_line_and_exit_status():
    result = run_pyvmm(guest("args"), "7", "foo", "--bar")
    assert "cmdline: 7 foo --bar" in result.stdout
    assert result.returncode == 7


def test_guest_options_after_kernel_belong_to_guest():
    result = run_pyvmm("--mem=32", "--", guest("args"), "--mem=64", "x")
    assert "cmdline: --mem=64 x" in result.stdout
    assert result.returncode == 0


def test_empty_command_line():
    result = run_pyvmm(guest("args"))
    assert "cmdline: \n" in result.stdout or result.stdout.rstrip().endswith("cmdline:")
    assert result.returncode == 0


def test_exit_status_is_masked_to_a_byte():
    result = run_pyvmm(guest("args"), "255")
    assert result.returncode == 255


def test_abort_exits_255():
    result = run_pyvmm(guest("abort"))
    assert result.returncode == 255


def test_sleep_poll_timeouts_and_clocks():
    result = run_pyvmm(guest("sleep"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_small_memory_is_enough_for_hello():
    result = run_pyvmm("--mem=4", guest("hello"))
    assert result.returncode == 0, result.stderr


def test_block_read_write_verify(disk):
    result = run_pyvmm(f"--block:storage={disk}", guest("blocktest"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert disk.read_bytes() != bytes(1 << 20)  # the guest really wrote the file


def test_block_with_4k_sectors(disk):
    result = run_pyvmm(
        f"--block:storage={disk}", "--block-sector-size:storage=4096", guest("blocktest")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
