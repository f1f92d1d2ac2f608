"""A VM file descriptor: memory slots, vCPUs, ioeventfds."""

from __future__ import annotations

import os

from pyvmm._native import ffi, lib
from pyvmm.common.fd import OwnedFd
from pyvmm.kvm.ioctl import ioctl
from pyvmm.kvm.vcpu import Vcpu


class Vm(OwnedFd):
    """One VM; closing it closes every vCPU it created."""

    def __init__(self, fd: int, vcpu_mmap_size: int) -> None:
        self.fd = fd
        # The size of each vCPU's kvm_run mapping (a /dev/kvm fact).
        self.vcpu_mmap_size = vcpu_mmap_size
        self.vcpus: list[Vcpu] = []

    def close(self) -> None:
        for vcpu in self.vcpus:
            vcpu.close()
        self.vcpus.clear()
        super().close()

    def set_memory(
        self, slot: int, gpa: int, size: int, host_addr: int, *, readonly: bool = False
    ) -> None:
        region = ffi.new(
            "struct kvm_userspace_memory_region *",
            {
                "slot": slot,
                "flags": lib.KVM_MEM_READONLY if readonly else 0,
                "guest_phys_addr": gpa,
                "memory_size": size,
                "userspace_addr": host_addr,
            },
        )
        ioctl(self.fd, lib.KVM_SET_USER_MEMORY_REGION, region, call="KVM_SET_USER_MEMORY_REGION")

    def add_ioeventfd(
        self, eventfd: int, addr: int, length: int, *, pio: bool, datamatch: int | None = None
    ) -> None:
        """Let a guest port/MMIO write signal ``eventfd`` without exiting to us."""
        flags = lib.KVM_IOEVENTFD_FLAG_PIO if pio else 0
        if datamatch is not None:
            flags |= lib.KVM_IOEVENTFD_FLAG_DATAMATCH
        req = ffi.new(
            "struct kvm_ioeventfd *",
            {
                "datamatch": datamatch or 0,
                "addr": addr,
                "len": length,
                "fd": eventfd,
                "flags": flags,
            },
        )
        ioctl(self.fd, lib.KVM_IOEVENTFD, req, call="KVM_IOEVENTFD")

    def create_vcpu(self, index: int = 0) -> Vcpu:
        fd = ioctl(self.fd, lib.KVM_CREATE_VCPU, index, call="KVM_CREATE_VCPU")
        try:
            vcpu = Vcpu(fd, index, self.vcpu_mmap_size)
            # arm64 asks the VM for the vCPU's preferred target.
            vcpu.vm_fd = self.fd
        except BaseException:
            os.close(fd)
            raise
        self.vcpus.append(vcpu)
        return vcpu
