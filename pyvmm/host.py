"""What this host's KVM provides, as ``pyvmm --version`` reports it."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from pyvmm._native import lib
from pyvmm.errors import HostError
from pyvmm.kvm.system import System, kvm_flavour


@dataclass(frozen=True)
class HostInfo:
    machine: str
    flavour: str
    ioeventfd: bool
    stats_fd: bool
    readonly_mem: bool
    cycle_freq: int | None


def cycle_freq(system: System) -> int | None:
    """The guest cycle counter's frequency in Hz (needs a throw-away VM),
    or None where pyvmm has no architecture support or KVM will not say."""
    from pyvmm.arch import host_arch

    try:
        arch = host_arch()
        with system.create_vm() as vm:
            return arch.cycle_freq(vm.create_vcpu(0))
    except HostError:
        return None


def host_info(system: System) -> HostInfo:
    return HostInfo(
        machine=platform.machine(),
        flavour=kvm_flavour(),
        ioeventfd=bool(system.check_extension(lib.KVM_CAP_IOEVENTFD)),
        stats_fd=bool(system.check_extension(lib.KVM_CAP_BINARY_STATS_FD)),
        readonly_mem=bool(system.check_extension(lib.KVM_CAP_READONLY_MEM)),
        cycle_freq=cycle_freq(system),
    )
