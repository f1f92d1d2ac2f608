"""Integration: every guest in guests/ boots on real KVM with the right output
and exit status, exactly as it would under solo5-hvt."""

from __future__ import annotations

import pytest

from conftest import engine_env, guest, run_pyvmm
from testkit import helpers

# Every guest runs at both privilege levels: 0 as solo5-hvt runs it, 3 in
# pyvmm's user-mode profile (the guests declare they can).
pytestmark = [pytest.mark.kvm, pytest.mark.parametrize("cpl", ["0", "3"])]


def test_hello_prints_and_exits_zero(cpl):
    result = run_pyvmm(f"--cpl={cpl}", guest("hello"))
    assert result.returncode == 0, result.stderr
    assert "Hello, world" in result.stdout
    assert result.stdout.rstrip().endswith("SUCCESS")
    assert result.stderr == ""


def test_a_program_with_its_own_c_library_links_and_runs(cpl):
    """guests/ownlibc.c uses solo5.h alone and defines memset, memcpy,
    memmove, memcmp and strlen itself, as Solo5 applications do: it links
    with the runtime (whose own are weak) and its own ones are called."""
    result = run_pyvmm(f"--cpl={cpl}", guest("ownlibc"), "a", "b")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [
        "cmdline: a b",
        "compare: 1",
        "own calls: 1",
        "SUCCESS",
    ], result.stdout


def test_args_passes_command_line_and_exit_status(cpl):
    result = run_pyvmm(f"--cpl={cpl}", guest("args"), "7", "foo", "--bar")
    assert "cmdline: 7 foo --bar" in result.stdout
    assert result.returncode == 7


def test_guest_options_after_kernel_belong_to_guest(cpl):
    result = run_pyvmm(f"--cpl={cpl}", "--mem=32", "--", guest("args"), "--mem=64", "x")
    assert "cmdline: --mem=64 x" in result.stdout
    assert result.returncode == 0


def test_empty_command_line(cpl):
    result = run_pyvmm(f"--cpl={cpl}", guest("args"))
    assert "cmdline: \n" in result.stdout or result.stdout.rstrip().endswith("cmdline:")
    assert result.returncode == 0


def test_largest_exit_status(cpl):
    # Masking statuses above 255: tests/test_documented.py (guests/edges.c).
    result = run_pyvmm(f"--cpl={cpl}", guest("args"), "255")
    assert result.returncode == 255


def test_abort_exits_255(cpl):
    result = run_pyvmm(f"--cpl={cpl}", guest("abort"))
    assert result.returncode == 255


def test_sleep_poll_timeouts_and_clocks(cpl):
    result = run_pyvmm(f"--cpl={cpl}", guest("sleep"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_small_memory_is_enough_for_hello(cpl):
    result = run_pyvmm(f"--cpl={cpl}", "--mem=4", guest("hello"))
    assert result.returncode == 0, result.stderr


def test_block_read_write_verify(cpl, disk):
    result = run_pyvmm(f"--cpl={cpl}", f"--block:storage={disk}", guest("blocktest"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    assert disk.read_bytes() != bytes(1 << 20)  # the guest really wrote the file


@pytest.mark.parametrize("engine", ["c", "python"])
def test_block_requests_checked_alike_by_c_and_python(cpl, disk, engine):
    """blocktest strict: good requests, then unaligned, partial, past-the-end
    and bad-handle ones sent as raw hypercalls. The C fast path answers the
    good ones and hands the others to Python, which answers everything
    with PYVMM_PY_HYPERCALLS=1: the guest sees the same results."""
    env = engine_env(engine)
    result = run_pyvmm(
        f"--cpl={cpl}",
        helpers.STATS,
        f"--block:storage={disk}",
        guest("blocktest"),
        "strict",
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "FAIL" not in result.stdout
    stats = helpers.parse_stats(result.stderr)
    if engine == "c":
        in_c = stats["hypercalls_in_c"]
        assert in_c["block_writes"] >= 256 and in_c["block_reads"] >= 256, in_c
    else:
        assert "hypercalls_in_c" not in stats


def test_block_benchmark_guest_checks_what_it_reads(cpl, disk):
    result = run_pyvmm(f"--cpl={cpl}", f"--block:storage={disk}", guest("blkbench"), "100", "512")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "read_ns: " in result.stdout


def test_block_with_4k_sectors(cpl, disk):
    result = run_pyvmm(
        f"--cpl={cpl}",
        f"--block:storage={disk}",
        "--block-sector-size:storage=4096",
        guest("blocktest"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_hello_reports_the_level_it_runs_at(cpl):
    result = run_pyvmm(f"--cpl={cpl}", guest("hello"))
    assert result.returncode == 0, result.stderr
    assert f"cpl: {cpl}" in result.stdout.splitlines()
