"""The KVM layer refuses clearly where KVM is missing, and its structs come
from the kernel headers (checked against the sizes the ABI promises)."""

from __future__ import annotations

import pytest

from pyvmm._native import ffi
from pyvmm.common.errors import HostError
from pyvmm.kvm import System


def test_missing_kvm_device_is_a_clear_error(tmp_path):
    with pytest.raises(HostError, match="does not exist: this host has no KVM"):
        System(str(tmp_path / "kvm"))


def test_non_kvm_device_is_refused(tmp_path):
    path = tmp_path / "not-kvm"
    path.write_bytes(b"")
    with pytest.raises(HostError):
        System(str(path))


def test_abi_structs_have_the_documented_sizes():
    assert ffi.sizeof("struct hvt_boot_info") == 56
    assert ffi.sizeof("struct mft_entry") == 104
    assert ffi.offsetof("struct mft_entry", "attached") == 96
    assert ffi.sizeof("struct hvt_hc_block_read") == 40
    assert ffi.sizeof("struct hvt_hc_net_read") == 32
    assert ffi.offsetof("struct hvt_hc_poll", "ret") == 16
    assert ffi.offsetof("struct hvt_hc_halt", "exit_status") == 8
    assert ffi.offsetof("struct shm_ring", "cons") == 64
    assert ffi.offsetof("struct shm_ring", "slot") == 192
    # The shm_slot size: tests/unit/test_ring_protocol.py.
    assert ffi.offsetof("struct solo5_ring", "needs_kick") == 72
    assert ffi.offsetof("struct solo5_ring", "ent") == 128
    assert ffi.offsetof("struct solo5_ring", "com") == 128 + 1024 * 32
