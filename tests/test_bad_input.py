"""Every bad input gets one clear line on stderr and a non-zero exit, never a
traceback, whatever the cause: command line, unikernel file or devices."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from conftest import ROOT, guest, run_pyvmm
from testkit import helpers

pytestmark = pytest.mark.kvm

# A CPU this process may not run on, however many the machine has. (The bad
# --cpl value is tests/test_cpl.py's.)
UNUSABLE_CPU = max(os.sched_getaffinity(0)) + 1


def assert_error(result, *words: str, status: int = 1) -> str:
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("pyvmm: ")
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def patched(tmp_path, name: str, offset: int, data: bytes):
    blob = bytearray(guest(name).read_bytes())
    blob[offset : offset + len(data)] = data
    path = tmp_path / f"{name}-patched.hvt"
    path.write_bytes(bytes(blob))
    return path


def test_unknown_option():
    assert_error(run_pyvmm("--frobnicate", guest("hello")), "Invalid option: `--frobnicate'")


def test_missing_kernel_argument():
    assert_error(run_pyvmm("--mem=32"), "Missing KERNEL operand")


def test_kernel_file_missing(tmp_path):
    assert_error(run_pyvmm(tmp_path / "nope.hvt"), "nope.hvt", "No such file")


def test_kernel_not_elf(tmp_path):
    path = tmp_path / "text.hvt"
    path.write_text("hello, I am not a unikernel\n" * 10)
    assert_error(run_pyvmm(path), "not an ELF")


def test_kernel_truncated(tmp_path):
    path = tmp_path / "short.hvt"
    path.write_bytes(guest("hello").read_bytes()[:100])
    assert_error(run_pyvmm(path), "truncated")


def test_kernel_wrong_architecture(tmp_path):
    path = patched(tmp_path, "hello", 18, struct.pack("<H", 183))  # EM_AARCH64
    assert_error(run_pyvmm(path), "aarch64")


def test_kernel_without_abi_note(tmp_path):
    blob = guest("hello").read_bytes()
    offset = blob.index(struct.pack("<I", 0x31494241))  # the ABI1 note type
    path = patched(tmp_path, "hello", offset, struct.pack("<I", 0x12345678))
    assert_error(run_pyvmm(path), "ABI")


def test_kernel_with_wrong_abi_version(tmp_path):
    path = helpers.with_abi_version(guest("hello"), tmp_path / "hello-abi9.hvt", 9)
    assert_error(run_pyvmm(path), "version")


def as_abi_version_1(tmp_path, name: str):
    return helpers.with_abi_version(guest(name), tmp_path / f"{name}-abi1.hvt", 1)


def test_kernel_with_abi_version_1_names_the_option(tmp_path):
    line = assert_error(run_pyvmm(as_abi_version_1(tmp_path, "hello")), "ABI version 1")
    assert "--legacy-abi" in line


def test_legacy_abi_boots_a_version_1_kernel(tmp_path):
    result = run_pyvmm("--legacy-abi", as_abi_version_1(tmp_path, "hello"))
    assert result.returncode == 0, result.stderr
    assert "Hello, world" in result.stdout and result.stdout.rstrip().endswith("SUCCESS")
    assert result.stderr == ""


def test_legacy_abi_with_a_ring_mode_is_refused(tmp_path):
    path = as_abi_version_1(tmp_path, "ping")
    result = run_pyvmm("--legacy-abi", "--shm=poll", "--net=tap-not-there", path, "10.0.0.2")
    assert_error(result, "ABI version 1, which knows no rings")


def test_kernel_with_invalid_manifest(tmp_path):
    blob = guest("hello").read_bytes()
    desc = blob.index(struct.pack("<I", 0x3154464D)) + 4 + 8 + 4  # 8-aligned descriptor
    path = patched(tmp_path, "hello", desc, struct.pack("<I", 2))  # manifest version 2
    assert_error(run_pyvmm(path), "manifest")


def test_entry_point_outside_memory(tmp_path):
    path = patched(tmp_path, "hello", 24, struct.pack("<Q", 0x7FFF0000))
    assert_error(run_pyvmm("--mem=32", path), "entry")


def test_memory_too_small_for_kernel():
    assert_error(run_pyvmm("--mem=1", guest("hello")), "--mem")


def test_memory_not_a_number():
    assert_error(run_pyvmm("--mem=lots", guest("hello")), "--mem")


def test_block_device_not_attached():
    assert_error(run_pyvmm(guest("blocktest")), "storage", "not attached")


def test_block_file_missing(tmp_path):
    assert_error(
        run_pyvmm(f"--block:storage={tmp_path}/none.img", guest("blocktest")), "storage", "none.img"
    )


def test_device_not_in_manifest(disk):
    assert_error(run_pyvmm(f"--block:other={disk}", guest("hello")), "other", "manifest")


def test_device_of_wrong_kind(disk):
    assert_error(run_pyvmm(f"--net:storage={disk}", guest("blocktest")), "storage", "block")


def test_net_device_not_attached():
    assert_error(run_pyvmm(guest("ping")), "service0", "not attached")


def test_short_net_option_needs_single_net_device(disk):
    assert_error(run_pyvmm("--net=tap0", guest("hello")), "exactly one net device")


def test_tap_missing():
    assert_error(run_pyvmm("--net:service0=pyvmmnotap0", guest("ping")), "pyvmmnotap0")


def test_bad_block_sector_size(disk):
    assert_error(
        run_pyvmm(
            f"--block:storage={disk}", "--block-sector-size:storage=1000", guest("blocktest")
        ),
        "1000",
    )


def test_command_line_too_long():
    assert_error(run_pyvmm(guest("args"), "x" * 9000), "command line")


def test_help_and_version_exit_zero():
    result = run_pyvmm("--help")
    assert result.returncode == 0 and "usage: pyvmm" in result.stdout
    result = run_pyvmm("--version")
    assert result.returncode == 0 and "pyvmm" in result.stdout and "KVM" in result.stdout


@pytest.mark.parametrize(
    "option, words",
    [
        ("--shm=fast", ["--shm", "fast", "off, poll, event, hybrid"]),
        ("--shm-slots=3", ["--shm-slots", "power of two"]),
        ("--shm-slots=65536", ["--shm-slots", "power of two"]),
        ("--hybrid-budget=0", ["--hybrid-budget", "positive integer"]),
        ("--hybrid-budget=soon", ["--hybrid-budget", "positive integer"]),
        (f"--pin=vcpu={UNUSABLE_CPU}", ["--pin", f"CPU {UNUSABLE_CPU} is not available"]),
        ("--pin=gpu=0", ["--pin", "vcpu=N or io=N"]),
        ("--pin=vcpu=\u00b2", ["--pin", "vcpu=N or io=N"]),  # isdigit() would say yes
        ("--hybrid-budget=4294967296", ["--hybrid-budget", "more than 1000000"]),
        ("--net-ring-kicks=vcpu", ["--net-ring-kicks", "'vcpu' is not one of thread, exit"]),
        ("--net=@2147483648", ["not a file descriptor number"]),
        ("--net=@99999999999999999999", ["not a file descriptor number"]),
    ],
)
def test_bad_option_values(option, words):
    # --shm=hybrid for --hybrid-budget; not with --shm itself (given once).
    mode = [] if option.startswith("--shm=") else ["--shm=hybrid"]
    assert_error(run_pyvmm(*mode, option, guest("ping")), *words)


@pytest.mark.parametrize(
    "options, words",
    [
        (["--hybrid-budget=100"], ["--hybrid-budget applies only to --shm=hybrid"]),
        (["--shm=event", "--hybrid-budget=100"], ["applies only to --shm=hybrid"]),
        (["--shm-slots=64"], ["--shm-slots", "gets no shmstream region"]),
        (["--shm=poll", "--net-ring-kicks=exit"], ["applies only to --shm=event or hybrid"]),
        (["--shm=off", "--net-ring-kicks=exit"], ["applies only to --shm=event or hybrid"]),
        (["--net:service0=tapA", "--net=tapB"], ["'service0' given twice"]),
    ],
)
def test_options_that_cannot_apply_are_refused(options, words):
    kernel = guest("ping") if any(o.startswith("--net") for o in options) else guest("hello")
    assert_error(run_pyvmm(*options, kernel, "10.0.0.2"), *words)


def test_kernel_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "kernel.fifo"
    os.mkfifo(fifo)
    assert_error(run_pyvmm(fifo, timeout=20), "not a regular file")


def test_guest_arguments_pass_as_raw_bytes():
    """An argument that is not valid UTF-8 reaches the guest byte for byte."""
    raw = b"caf\xe9"
    result = subprocess.run(
        [sys.executable, "-m", "pyvmm", os.fsencode(guest("args")), b"3", raw],
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 3, result.stderr
    assert b"cmdline: 3 " + raw in result.stdout


def test_pin_needs_a_value():
    assert_error(run_pyvmm("--pin"), "--pin", "missing value")
