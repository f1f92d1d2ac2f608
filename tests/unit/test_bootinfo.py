"""Boot info, manifest copy and command line land where the ABI says."""

from __future__ import annotations

import pytest

from pyvmm._native import lib
from pyvmm.common.errors import UsageError
from pyvmm.hvt.bootinfo import BootInfo, join_cmdline
from pyvmm.kvm.memory import GuestMemory


def test_boot_info_manifest_and_cmdline_layout():
    manifest = bytes(range(8)) * 27  # stands in for a 216-byte manifest
    with GuestMemory(4 << 20) as mem:
        gpa = BootInfo(
            mem_size=4 << 20,
            kernel_end=0x104000,
            cpu_cycle_freq=2_000_000_000,
            manifest=manifest,
            cmdline=b"hello world",
        ).write(mem)
        assert gpa == 0x10000
        info = mem.struct("struct hvt_boot_info", gpa, setup=True)
        assert info.mem_size == 4 << 20 and info.kernel_end == 0x104000
        assert info.cpu_cycle_freq == 2_000_000_000
        assert info.mft == 0x10080 and info.mft % 8 == 0
        assert mem.read(info.mft, len(manifest)) == manifest
        assert info.cmdline >= info.mft + len(manifest) and info.cmdline % 8 == 0
        assert mem.read_cstring(info.cmdline, 8192) == b"hello world"
        assert info.host_features == 0 and info.net_ring == 0
        # Without the feature bit, the extension slot stays empty.
        assert mem.read(lib.PYVMM_BOOT_EXT_GPA, 8) == bytes(8)


def test_boot_extension_is_written_with_its_feature_bit():
    with GuestMemory(8 << 20) as mem:
        BootInfo(
            mem_size=6 << 20,
            kernel_end=0x104000,
            cpu_cycle_freq=1,
            manifest=bytes(8),
            cmdline=b"",
            host_features=lib.PYVMM_FEATURE_BOOT_EXT,
            shm_region=6 << 20,
            shm_size=2 << 20,
            shm_mode=2,
        ).write(mem)
        ext = mem.struct("struct pyvmm_boot_ext", lib.PYVMM_BOOT_EXT_GPA, setup=True)
        assert ext.magic == lib.PYVMM_BOOT_EXT_MAGIC
        assert ext.version == lib.PYVMM_BOOT_EXT_VERSION == 1
        assert (ext.shm_region, ext.shm_size, ext.shm_mode) == (6 << 20, 2 << 20, 2)


def test_cmdline_joins_arguments_with_single_spaces():
    assert join_cmdline(["a", "--b", "c d"]) == b"a --b c d"
    assert join_cmdline([]) == b""


def test_cmdline_longer_than_the_abi_allows_is_refused():
    join_cmdline(["x" * 8191])
    with pytest.raises(UsageError, match="at most 8191"):
        join_cmdline(["x" * 8192])
