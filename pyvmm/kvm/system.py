"""/dev/kvm: capability checks, supported CPUID, VM creation, host facts."""

from __future__ import annotations

import errno
import os
import platform
from dataclasses import dataclass

from pyvmm._native import ffi, lib
from pyvmm.errors import HostError
from pyvmm.fd import OwnedFd
from pyvmm.kvm.ioctl import KvmError, ioctl
from pyvmm.kvm.vm import Vm

KVM_PATH = "/dev/kvm"
# KVM's API version has been 12 since Linux 2.6.22.
KVM_API_VERSION = 12
CPUID_MAX_ENTRIES = 256


@dataclass(frozen=True)
class HostInfo:
    """What the host's KVM provides, as ``pyvmm --version`` reports it."""

    machine: str
    flavour: str
    ioeventfd: bool
    stats_fd: bool
    readonly_mem: bool
    tsc_khz: int | None

    @property
    def default_cpl(self) -> int:
        """The level --cpl=auto gives a guest that declares user mode."""
        return 3 if self.flavour == "pvm" else 0


def kvm_flavour() -> str:
    """Which KVM implementation serves /dev/kvm (PVM changes what is fast)."""
    for module, name in (
        ("kvm_pvm", "pvm"),
        ("kvm_intel", "intel-vmx"),
        ("kvm_amd", "amd-svm"),
    ):
        if os.path.isdir(f"/sys/module/{module}"):
            return name
    return "arm64" if platform.machine() == "aarch64" else "unknown"


class System(OwnedFd):
    """An open /dev/kvm; a context manager that closes it."""

    def __init__(self, path: str = KVM_PATH) -> None:
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise HostError(
                f"{path} does not exist: this host has no KVM "
                "(enable virtualisation or load kvm_intel, kvm_amd or kvm_pvm)"
            ) from None
        except PermissionError:
            raise HostError(
                f"no permission to open {path}: run as root or join the group that owns it"
            ) from None
        except OSError as err:
            raise HostError(f"cannot open {path}: {err.strerror}") from None
        try:
            version = ioctl(self.fd, lib.KVM_GET_API_VERSION, call="KVM_GET_API_VERSION")
            if version != KVM_API_VERSION:
                raise HostError(f"unsupported KVM API version {version} (need 12)")
        except BaseException:
            os.close(self.fd)
            raise

    def check_extension(self, cap: int) -> int:
        return ioctl(self.fd, lib.KVM_CHECK_EXTENSION, cap, call="KVM_CHECK_EXTENSION")

    @property
    def vcpu_mmap_size(self) -> int:
        return ioctl(self.fd, lib.KVM_GET_VCPU_MMAP_SIZE, call="KVM_GET_VCPU_MMAP_SIZE")

    def supported_cpuid(self):
        """KVM_GET_SUPPORTED_CPUID as a cffi ``struct kvm_cpuid2 *`` (x86 only)."""
        nent = CPUID_MAX_ENTRIES
        while True:
            cpuid = ffi.new("struct kvm_cpuid2 *", {"entries": nent})
            cpuid.nent = nent
            try:
                ioctl(self.fd, lib.KVM_GET_SUPPORTED_CPUID, cpuid, call="KVM_GET_SUPPORTED_CPUID")
                return cpuid
            except KvmError as err:
                if err.errno != errno.E2BIG or nent >= 4096:
                    raise
                nent *= 2

    def tsc_khz(self) -> int | None:
        """The TSC frequency KVM gives guests (needs a throw-away VM and vCPU)."""
        if platform.machine() != "x86_64":
            return None
        try:
            with self.create_vm() as vm:
                return vm.create_vcpu(0).tsc_khz()
        except KvmError:
            return None

    def host_info(self) -> HostInfo:
        return HostInfo(
            machine=platform.machine(),
            flavour=kvm_flavour(),
            ioeventfd=bool(self.check_extension(lib.KVM_CAP_IOEVENTFD)),
            stats_fd=bool(self.check_extension(lib.KVM_CAP_BINARY_STATS_FD)),
            readonly_mem=bool(self.check_extension(lib.KVM_CAP_READONLY_MEM)),
            tsc_khz=self.tsc_khz(),
        )

    def create_vm(self) -> Vm:
        fd = ioctl(self.fd, lib.KVM_CREATE_VM, 0, call="KVM_CREATE_VM")
        return Vm(fd, self)
