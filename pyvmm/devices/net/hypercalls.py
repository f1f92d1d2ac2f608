"""net_write and net_read: one frame per hypercall, through the tap.

The C fast path (csrc/hcfast.c) answers the clean cases of both; these
handlers answer everything else, so the rules and their errors live here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyvmm._native import lib
from pyvmm.devices.net.device import NetDevice
from pyvmm.kvm.memory import GuestMemory

OK = lib.HVT_RET_OK
AGAIN = lib.HVT_RET_AGAIN
EINVAL = lib.HVT_RET_EINVAL
EUNSPEC = lib.HVT_RET_EUNSPEC


class NetHypercalls:
    def __init__(self, memory: GuestMemory, nets: Mapping[int, NetDevice]) -> None:
        self.memory = memory
        self.nets = nets

    def table(self) -> dict[int, Callable[[int], None]]:
        return {
            lib.HVT_HYPERCALL_NET_WRITE: self.net_write,
            lib.HVT_HYPERCALL_NET_READ: self.net_read,
        }

    def net_write(self, gpa: int) -> None:
        # Request fields from a copy, read once; only results go back.
        arg, guest = self.memory.request("struct hvt_hc_net_write", gpa, what="net_write hypercall")
        device = self.nets.get(arg.handle)
        if device is None or arg.len > device.max_frame:
            guest.ret = EINVAL
            return
        try:
            device.write(self.memory.buffer(arg.data, arg.len, what="net_write hypercall"))
        except OSError:
            guest.ret = EUNSPEC
            return
        guest.ret = OK

    def net_read(self, gpa: int) -> None:
        arg, guest = self.memory.request("struct hvt_hc_net_read", gpa, what="net_read hypercall")
        device = self.nets.get(arg.handle)
        if device is None:
            guest.ret = EINVAL
            return
        buf = self.memory.buffer(arg.data, arg.len, write=True, what="net_read hypercall")
        try:
            length = device.read_into(buf)
        except OSError:
            guest.ret = EUNSPEC
            return
        if length is None:
            guest.ret = AGAIN
            return
        guest.len = length
        guest.ret = OK
