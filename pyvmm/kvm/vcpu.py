"""A vCPU file descriptor and its mapped kvm_run.

Register access differs by architecture (x86 has KVM_GET_REGS, aarch64
KVM_GET_ONE_REG), so it lives under pyvmm/arch/, not here.
"""

from __future__ import annotations

import errno
import mmap
import os

from pyvmm._native import ffi, lib
from pyvmm.kvm import exits
from pyvmm.kvm.ioctl import KvmError


class Vcpu:
    def __init__(self, fd: int, index: int, mmap_size: int) -> None:
        self.fd = fd
        self.index = index
        # The VM's fd (Vm.create_vcpu sets it): arm64's vCPU init asks the VM.
        self.vm_fd = -1
        self._run_map = mmap.mmap(fd, mmap_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._run = ffi.from_buffer(self._run_map)
        self.run_area = self._run
        self._exit = ffi.new("struct pyvmm_exit *")

    def close(self) -> None:
        if self.fd >= 0:
            ffi.release(self._run)
            self._run = self.run_area = None
            self._run_map.close()
            os.close(self.fd)
            self.fd = -1

    def run(self, fast_path=None) -> exits.VcpuExit:
        """Enter the guest until its next exit; the GIL is released meanwhile.

        With a ``struct pyvmm_fastpath *`` the exits it answers in C
        (csrc/hcfast.h) never come back here: this returns the next other one.
        """
        if fast_path is None:
            ret = lib.pyvmm_vcpu_run(self.fd, self._run, self._exit)
        else:
            ret = lib.pyvmm_vcpu_run_fast(self.fd, self._run, self._exit, fast_path)
        if ret == -errno.EINTR:
            return exits.Interrupted()
        if ret == -errno.EFAULT:
            gpa = self._exit.fault_gpa if self._exit.reason == lib.PYVMM_EXIT_MEMORY_FAULT else None
            return exits.MemoryFault(gpa, self._exit.fault_flags)
        if ret < 0:
            raise KvmError("KVM_RUN", -ret)
        return exits.decode(self._exit)
