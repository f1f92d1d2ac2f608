"""/dev/kvm: capability checks, VM creation, which KVM this is."""

from __future__ import annotations

import os

from pyvmm._native import lib
from pyvmm.common.errors import HostError
from pyvmm.common.fd import OwnedFd
from pyvmm.kvm.ioctl import ioctl
from pyvmm.kvm.vm import Vm

KVM_PATH = "/dev/kvm"
# KVM's API version has been 12 since Linux 2.6.22.
KVM_API_VERSION = 12

#: /dev/kvm's answers (API version, extensions, the kvm_run size) by
#: (request, argument): facts of the host's KVM, the same through every
#: open of it, so asked once per process (the warm launcher asks before it
#: forks, pyvmm/serve/warm.py; an ioctl is 20-50 us under kvm_pvm).
_answers: dict[tuple[int, int], int] = {}


def _ask(fd: int, request: int, arg: int, call: str) -> int:
    key = (request, arg)
    answer = _answers.get(key)
    if answer is None:
        answer = _answers[key] = ioctl(fd, request, arg, call=call)
    return answer


def kvm_flavour() -> str:
    """Which KVM implementation serves /dev/kvm (PVM changes what is fast)."""
    for module, name in (
        ("kvm_pvm", "pvm"),
        ("kvm_intel", "intel-vmx"),
        ("kvm_amd", "amd-svm"),
    ):
        if os.path.isdir(f"/sys/module/{module}"):
            return name
    return "arm64" if os.uname().machine == "aarch64" else "unknown"


class System(OwnedFd):
    """An open /dev/kvm; a context manager that closes it."""

    def __init__(self, path: str = KVM_PATH) -> None:
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise HostError(
                f"Could not open: {path}: {path} does not exist: this host has no KVM "
                "(enable virtualisation or load kvm_intel, kvm_amd or kvm_pvm)"
            ) from None
        except PermissionError:
            from pyvmm.kvm.access import advice

            raise HostError(f"Could not open: {path}: no permission: {advice(path)}") from None
        except OSError as err:
            raise HostError(f"Could not open: {path}: {err.strerror}") from None
        try:
            # Asked of this fd every time (not from _answers): it is what
            # says the file opened is a KVM at all.
            version = ioctl(self.fd, lib.KVM_GET_API_VERSION, 0, call="KVM_GET_API_VERSION")
            if version != KVM_API_VERSION:
                raise HostError(f"KVM: API version is {version}, pyvmm requires version 12")
        except BaseException:
            os.close(self.fd)
            raise

    def check_extension(self, cap: int) -> int:
        return _ask(self.fd, lib.KVM_CHECK_EXTENSION, cap, "KVM_CHECK_EXTENSION")

    @property
    def vcpu_mmap_size(self) -> int:
        return _ask(self.fd, lib.KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE")

    def create_vm(self) -> Vm:
        fd = ioctl(self.fd, lib.KVM_CREATE_VM, 0, call="KVM_CREATE_VM")
        try:
            return Vm(fd, self.vcpu_mmap_size)
        except BaseException:
            os.close(fd)
            raise
