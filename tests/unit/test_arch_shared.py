"""What both architectures share is written once: the line a fault gets
when the registers cannot be read, the kept boot tables, and the flags a
deprivileged guest runs with whichever way it returns to its code."""

from __future__ import annotations

import types

import pytest

from pyvmm.arch import REGISTERS_UNAVAILABLE, ArchBase
from pyvmm.arch.aarch64 import ARCH as AARCH64
from pyvmm.arch.x86_64 import ARCH as X86_64
from pyvmm.arch.x86_64 import cpu, traps

# A vCPU whose descriptor KVM refuses: every register read fails.
GONE = types.SimpleNamespace(fd=-1)


@pytest.mark.parametrize("read", [X86_64.where, X86_64.registers])
def test_unreadable_registers_give_the_one_line(read):
    assert read(GONE) == REGISTERS_UNAVAILABLE


def test_both_architectures_keep_boot_tables_the_shared_way():
    assert isinstance(X86_64, ArchBase) and isinstance(AARCH64, ArchBase)
    assert type(X86_64).boot_tables is type(AARCH64).boot_tables is ArchBase.boot_tables


@pytest.mark.parametrize(
    "asked",
    [0, cpu.RFLAGS_IF, cpu.RFLAGS_IOPL, cpu.RFLAGS_VM, (1 << 22) - 1, cpu.RFLAGS_TF],
)
def test_the_guest_never_sets_if_iopl_or_vm(asked):
    flags = traps._guest_rflags(asked)
    assert flags & (cpu.RFLAGS_IF | cpu.RFLAGS_IOPL | cpu.RFLAGS_VM) == 0
    assert flags & cpu.RFLAGS_RESERVED
    kept = ~(cpu.RFLAGS_IF | cpu.RFLAGS_IOPL | cpu.RFLAGS_VM | cpu.RFLAGS_RESERVED)
    assert flags & kept == asked & kept
