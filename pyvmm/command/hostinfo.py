"""What this host's KVM provides, as ``pyvmm --version`` reports it."""

from __future__ import annotations

import os

from pyvmm._native import lib
from pyvmm.common.errors import HostError
from pyvmm.kvm.system import System, kvm_flavour


class HostInfo:
    """What --version reports (a plain class: no dataclasses on its path)."""

    def __init__(
        self,
        *,
        machine: str,
        flavour: str,
        ioeventfd: bool,
        stats_fd: bool,
        readonly_mem: bool,
        cycle_freq: int | None,
        arch_features: tuple[str, ...] = (),
    ) -> None:
        self.machine = machine
        self.flavour = flavour
        self.ioeventfd = ioeventfd
        self.stats_fd = stats_fd
        self.readonly_mem = readonly_mem
        self.cycle_freq = cycle_freq
        #: What KVM offers that only this architecture has (KVM_CHECK_EXTENSION).
        self.arch_features = arch_features


# arm64: KVM capabilities worth knowing about a real host (pyvmm needs none
# but PSCI 0.2 and ONE_REG); the constants exist in an arm64 build only.
ARM64_CAPS = (
    ("PSCI 0.2", "KVM_CAP_ARM_PSCI_0_2"),
    ("IPA bits", "KVM_CAP_ARM_VM_IPA_SIZE"),
    ("SVE", "KVM_CAP_ARM_SVE"),
    ("pointer auth", "KVM_CAP_ARM_PTRAUTH_ADDRESS"),
    ("PMUv3", "KVM_CAP_ARM_PMU_V3"),
    ("AArch32 EL1", "KVM_CAP_ARM_EL1_32BIT"),
)


def arch_features(system: System) -> tuple[str, ...]:
    if os.uname().machine != "aarch64":
        return ()
    features = []
    for label, cap in ARM64_CAPS:
        value = system.check_extension(getattr(lib, cap))
        shown = str(value) if label == "IPA bits" else ("yes" if value else "no")
        features.append(f"{label}: {shown}")
    return tuple(features)


def cycle_freq(system: System) -> int | None:
    """The guest cycle counter's frequency in Hz (needs a throw-away VM),
    or None where pyvmm has no architecture support or KVM will not say.

    Read here with the one call each architecture's ``Arch.cycle_freq``
    makes, not through pyvmm.arch: importing an architecture (page tables,
    CPU state, decoder) would be most of --version's time (docs/startup.md);
    tests/test_documented.py checks both give the same value."""
    machine = os.uname().machine
    try:
        if machine == "aarch64" and hasattr(lib, "pyvmm_arm64_cntfrq"):
            return int(lib.pyvmm_arm64_cntfrq())
        if machine != "x86_64" or not hasattr(lib, "KVM_GET_TSC_KHZ"):
            return None
        from pyvmm.kvm.ioctl import ioctl

        with system.create_vm() as vm:
            vcpu = vm.create_vcpu(0)
            return ioctl(vcpu.fd, lib.KVM_GET_TSC_KHZ, call="KVM_GET_TSC_KHZ") * 1000
    except HostError:
        return None


def host_info(system: System) -> HostInfo:
    return HostInfo(
        machine=os.uname().machine,
        flavour=kvm_flavour(),
        ioeventfd=bool(system.check_extension(lib.KVM_CAP_IOEVENTFD)),
        stats_fd=bool(system.check_extension(lib.KVM_CAP_BINARY_STATS_FD)),
        readonly_mem=bool(system.check_extension(lib.KVM_CAP_READONLY_MEM)),
        cycle_freq=cycle_freq(system),
        arch_features=arch_features(system),
    )
