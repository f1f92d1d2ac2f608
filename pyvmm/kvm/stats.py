"""KVM's own per-vCPU statistics (KVM_GET_STATS_FD): the honest exit count.

pyvmm's run loop only sees exits that reach user space; KVM counts all of
them (ioeventfd kicks, halts, emulated instructions ...). The binary stats
format is self-describing: a header, descriptors with names, then data.
"""

from __future__ import annotations

import os

from pyvmm._native import ffi, lib
from pyvmm.kvm.ioctl import KvmError, ioctl


class KvmStats:
    """An open stats fd; ``read()`` returns {name: value} for scalar stats."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        header = ffi.new("struct kvm_stats_header *")
        ffi.buffer(header)[:] = os.pread(fd, ffi.sizeof(header[0]), 0)
        desc_size = ffi.sizeof("struct kvm_stats_desc") + header.name_size
        raw = os.pread(fd, desc_size * header.num_desc, header.desc_offset)
        self._fields: list[tuple[str, int]] = []
        for i in range(header.num_desc):
            chunk = raw[i * desc_size : (i + 1) * desc_size]
            desc = ffi.from_buffer("struct kvm_stats_desc *", chunk)
            name = bytes(chunk[ffi.sizeof("struct kvm_stats_desc") :]).split(b"\0", 1)[0]
            if desc.size == 1:  # histograms have size > 1; keep scalars
                self._fields.append((name.decode(), header.data_offset + desc.offset))

    @classmethod
    def open(cls, vcpu_fd: int) -> KvmStats | None:
        """The vCPU's stats, or None where the kernel has no stats fd."""
        try:
            fd = ioctl(vcpu_fd, lib.KVM_GET_STATS_FD, call="KVM_GET_STATS_FD")
        except KvmError:
            return None
        return cls(fd)

    def read(self) -> dict[str, int]:
        values = {}
        for name, offset in self._fields:
            values[name] = int.from_bytes(os.pread(self.fd, 8, offset), "little")
        return values

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
