"""The aarch64 port on arm64 KVM: register ids and struct layouts against
the kernel headers' own macros (regids.c), and every aarch64 guest booting
under pyvmm with the right output and exit status, hypercalls answered by
the C fast path and by Python alike, faults read from ESR/FAR."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

# Collected on aarch64 hosts only (tests/conftest.py): scripts/test-aarch64.
from conftest import engine_env, guest, popen_pyvmm, run_pyvmm
from testkit import helpers

HERE = Path(__file__).resolve().parent


def test_register_ids_and_layouts_match_the_kernel_headers():
    from pyvmm._native import ffi, lib
    from pyvmm.arch.aarch64 import regs

    printed = dict(
        line.split() for line in subprocess.check_output([HERE / "regids"], text=True).splitlines()
    )
    ours = regs.table()
    for name, value in ours.items():
        assert int(printed[name]) == value, name
    assert int(printed["sizeof_kvm_regs"]) == ffi.sizeof("struct kvm_regs")
    assert int(printed["sizeof_kvm_vcpu_init"]) == ffi.sizeof("struct kvm_vcpu_init")
    for name in ("KVM_ARM_VCPU_INIT", "KVM_ARM_PREFERRED_TARGET", "KVM_SET_ONE_REG"):
        assert int(printed[name]) == getattr(lib, name), name


def test_host_info_names_the_arch():
    result = run_pyvmm("--host-info")
    assert result.returncode == 0, result.stderr
    assert "host: aarch64, KVM flavour arm64" in result.stdout
    assert "PSCI 0.2: yes" in result.stdout and "IPA bits: " in result.stdout


@pytest.mark.parametrize("engine", ["c", "python"])
def test_hello(engine):
    result = run_pyvmm(guest("hello"), env=engine_env(engine))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Hello, world" in result.stdout
    assert result.stdout.rstrip().endswith("SUCCESS")


def test_args_and_exit_status():
    result = run_pyvmm("--mem=32", "--", guest("args"), "7", "foo", "--bar")
    assert "cmdline: 7 foo --bar" in result.stdout
    assert result.returncode == 7, result.stderr


def test_abort_exits_255():
    assert run_pyvmm(guest("abort")).returncode == 255


def test_sleep_poll_timeouts_and_clocks():
    result = run_pyvmm(guest("sleep"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("engine", ["c", "python"])
def test_block(disk, engine):
    result = run_pyvmm(
        helpers.STATS,
        f"--block:storage={disk}",
        guest("blocktest"),
        "strict",
        env=engine_env(engine),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "FAIL" not in result.stdout
    stats = helpers.parse_stats(result.stderr)
    if engine == "c":
        assert stats["hypercalls_in_c"]["block_writes"] >= 256, stats
    assert disk.read_bytes() != bytes(1 << 20)


def test_cpl3_is_refused_in_one_line():
    result = run_pyvmm("--cpl=3", guest("hello"))
    assert result.returncode != 0
    assert "kernel" in result.stderr and "Traceback" not in result.stderr


def fault(name: str) -> str:
    result = run_pyvmm(guest(name))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILURE" not in result.stdout and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyvmm: guest fault"), result.stderr
    return lines[0]


def test_write_to_text_is_stopped():
    assert "write to read-only memory" in fault("fault_wtext")


def test_executing_data_is_stopped():
    assert "instruction fetch from non-executable memory" in fault("fault_xdata")


def test_page_zero_is_unmapped():
    assert "unmapped page zero" in fault("fault_zeropage")


def test_bad_pointer_is_refused():
    assert "outside guest memory" in fault("fault_badptr")


def test_sigterm_stops_a_spinning_guest():
    proc = popen_pyvmm(guest("spin"))
    assert proc.stdout.readline() == "spinning\n"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err


def test_kvm_reports_what_it_offers():
    from pyvmm._native import lib
    from pyvmm.kvm import System

    with System() as system:
        assert system.check_extension(lib.KVM_CAP_ONE_REG)
        assert system.check_extension(lib.KVM_CAP_IOEVENTFD)
        assert system.check_extension(lib.KVM_CAP_ARM_PSCI_0_2)
    assert os.path.exists("/dev/kvm")
