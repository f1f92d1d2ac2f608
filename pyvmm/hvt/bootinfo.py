"""Low memory at entry: boot info, the guest's manifest copy, the command line.

All three live in the read-only low area (0x10000-0xfffff) that the guest's
page tables map without write access; offsets come from the ABI header.
"""

from __future__ import annotations

import os

from pyvmm._native import ffi, lib
from pyvmm.common.errors import UsageError
from pyvmm.common.record import Record
from pyvmm.kvm.memory import GuestMemory

BOOT_INFO_GPA = lib.HVT_BOOT_INFO_BASE
CMDLINE_SIZE = lib.HVT_CMDLINE_SIZE


def _align8(value: int) -> int:
    return (value + 7) & ~7


def join_cmdline(args: list[str]) -> bytes:
    """The guest arguments as solo5-hvt passes them: joined by single spaces.

    Each argument goes over as the bytes it was on pyvmm's own command line
    (os.fsencode undoes Python's decoding), whatever its encoding.
    """
    cmdline = b" ".join(os.fsencode(arg) for arg in args)
    if len(cmdline) >= CMDLINE_SIZE:
        raise UsageError(
            f"guest command line is {len(cmdline)} bytes, at most {CMDLINE_SIZE - 1} are allowed"
        )
    if b"\0" in cmdline:
        raise UsageError("guest command line contains a NUL byte")
    return cmdline


class BootInfo(Record):
    """What the guest finds at boot: hvt's boot info and what pyvmm adds."""

    __slots__ = (
        "mem_size",
        "kernel_end",
        "cpu_cycle_freq",
        "manifest",
        "cmdline",
        "host_features",
        "net_ring",
        "shm_region",
        "shm_size",
        "shm_mode",
    )

    def __init__(
        self,
        mem_size: int,
        kernel_end: int,
        cpu_cycle_freq: int,
        manifest: bytes,
        cmdline: bytes,
        host_features: int = 0,
        net_ring: int = 0,
        shm_region: int = 0,
        shm_size: int = 0,
        shm_mode: int = 0,
    ) -> None:
        self.mem_size = mem_size
        self.kernel_end = kernel_end
        self.cpu_cycle_freq = cpu_cycle_freq
        self.manifest = manifest
        self.cmdline = cmdline
        self.host_features = host_features
        self.net_ring = net_ring
        # pyvmm's boot extension (written when host_features says so).
        self.shm_region = shm_region
        self.shm_size = shm_size
        self.shm_mode = shm_mode

    def write(self, memory: GuestMemory) -> int:
        """Place everything in guest memory; returns the boot info GPA."""
        # The manifest copy follows pyvmm's boot extension slot (present or
        # not), so the extension has a fixed address guests can rely on.
        mft_gpa = _align8(lib.PYVMM_BOOT_EXT_GPA + ffi.sizeof("struct pyvmm_boot_ext"))
        cmdline_gpa = _align8(mft_gpa + len(self.manifest))
        memory.write(mft_gpa, self.manifest)
        memory.write(cmdline_gpa, self.cmdline + b"\0")
        if self.host_features & lib.PYVMM_FEATURE_BOOT_EXT:
            ext = memory.struct("struct pyvmm_boot_ext", lib.PYVMM_BOOT_EXT_GPA, setup=True)
            ext.magic = lib.PYVMM_BOOT_EXT_MAGIC
            ext.version = lib.PYVMM_BOOT_EXT_VERSION
            ext.shm_region = self.shm_region
            ext.shm_size = self.shm_size
            ext.shm_mode = self.shm_mode
        info = memory.struct("struct hvt_boot_info", BOOT_INFO_GPA, setup=True)
        info.mem_size = self.mem_size
        info.kernel_end = self.kernel_end
        info.cpu_cycle_freq = self.cpu_cycle_freq
        info.cmdline = cmdline_gpa
        info.mft = mft_gpa
        info.host_features = self.host_features
        info.guest_features = 0
        info.net_ring = self.net_ring
        return BOOT_INFO_GPA
