"""The ABI's numbers the host checks or writes come from the headers the
guests compile against (read through cffi), so the two sides cannot drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyvmm._native import lib
from pyvmm.command.cli import parse_args
from pyvmm.common.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def test_guest_runtime_checks_the_boot_extension_version_by_its_name():
    """The guest's check reads the same constant the host writes
    (tests/unit/test_bootinfo.py checks the host writes it)."""
    source = (ROOT / "guests/runtime/net_shm.c").read_text()
    assert "ext->version != PYVMM_BOOT_EXT_VERSION" in source


def test_device_name_of_the_manifest_limit_is_accepted():
    name = "a" * lib.MFT_NAME_MAX
    config = parse_args([f"--net:{name}=tap0", "kernel"])
    assert config.devices["net"] == {name: "tap0"}


def test_device_name_over_the_manifest_limit_is_refused():
    name = "a" * (lib.MFT_NAME_MAX + 1)
    with pytest.raises(UsageError) as err:
        parse_args([f"--net:{name}=tap0", "kernel"])
    assert str(err.value) == (
        f"--net:{name}=tap0: invalid device name '{name}' (1-67 of [A-Za-z0-9])"
    )


def test_most_ring_slots_is_the_ring_headers_limit():
    assert lib.SHM_MAX_SLOTS == 32768
    config = parse_args([f"--shm-slots={lib.SHM_MAX_SLOTS}", "kernel"])
    assert config.devices["shm-slots"] == {None: 32768}


def test_ring_slots_over_the_limit_are_refused():
    with pytest.raises(UsageError) as err:
        parse_args([f"--shm-slots={2 * lib.SHM_MAX_SLOTS}", "kernel"])
    assert str(err.value) == "--shm-slots: 65536 is not a power of two in [2, 32768]"
