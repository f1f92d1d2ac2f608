"""A vCPU file descriptor and its mapped kvm_run.

Register access differs by architecture (x86 has KVM_GET_REGS, aarch64
KVM_GET_ONE_REG), so it lives under pyvmm/arch/, not here.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct

from pyvmm._native import ffi, lib
from pyvmm.kvm import exits
from pyvmm.kvm.ioctl import KvmError

# KVM_SET_GUEST_DEBUG: _IOW(KVMIO, 0x9b, struct kvm_guest_debug); the
# struct (control, pad, then x86_64's kvm_guest_debug_arch: debugreg[8])
# is 72 bytes. x86_64 only: arm64's arch part differs.
_GUEST_DEBUG = struct.Struct("<II8Q")
KVM_SET_GUEST_DEBUG = (1 << 30) | (_GUEST_DEBUG.size << 16) | (0xAE << 8) | 0x9B
GUESTDBG_ENABLE = 0x1
GUESTDBG_SINGLESTEP = 0x2
GUESTDBG_USE_HW_BP = 0x20000
#: KVM_RUN returns at once while this byte of kvm_run is set
#: (``__u8 request_interrupt_window; __u8 immediate_exit;``).
_IMMEDIATE_EXIT = 1


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

    def set_guest_debug(self, control: int, debugregs: tuple[int, ...] = (0,) * 8) -> None:
        """KVM_SET_GUEST_DEBUG (x86_64): single step and DR0-DR3 breakpoints
        that exit to pyvmm (``exits.Debug``) instead of reaching the guest."""
        arg = ffi.new("char[]", _GUEST_DEBUG.pack(control, 0, *debugregs))
        ret = lib.pyvmm_ioctl_ptr(self.fd, KVM_SET_GUEST_DEBUG, arg)
        if ret < 0:
            raise KvmError("KVM_SET_GUEST_DEBUG", -ret)

    def set_immediate_exit(self, on: bool) -> None:
        """Make the next KVM_RUN return at once (EINTR) or not: with a
        signal to this vCPU's thread, the kick that interrupts a running
        guest without a race between the check and the entry."""
        if self._run is not None:
            self._run[_IMMEDIATE_EXIT] = b"\x01" if on else b"\x00"

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
