"""Thin, typed bindings of the KVM API: one class per file descriptor.

``System`` owns /dev/kvm, ``Vm`` a VM fd, ``Vcpu`` a vCPU fd and its mapped
kvm_run; ``Vcpu.run()`` returns a typed exit from ``exits``. Struct layouts
and ioctl numbers come from <linux/kvm.h> through the cffi extension.
"""

from pyvmm.kvm.exits import (
    FailEntry,
    Hlt,
    InternalError,
    Interrupted,
    IoIn,
    IoOut,
    MemoryFault,
    Mmio,
    Shutdown,
    SystemEvent,
    UnknownExit,
    VcpuExit,
)
from pyvmm.kvm.system import System
from pyvmm.kvm.vcpu import Vcpu
from pyvmm.kvm.vm import Vm

__all__ = [
    "FailEntry",
    "Hlt",
    "InternalError",
    "Interrupted",
    "IoIn",
    "IoOut",
    "MemoryFault",
    "Mmio",
    "Shutdown",
    "System",
    "SystemEvent",
    "UnknownExit",
    "Vcpu",
    "VcpuExit",
    "Vm",
]
