"""KVM's own per-vCPU statistics (KVM_GET_STATS_FD): the honest exit count.

pyvmm's run loop only sees exits that reach user space; KVM counts all of
them (ioeventfd kicks, halts, emulated instructions ...). The binary stats
format is self-describing: a header, descriptors with names, then data.
"""

from __future__ import annotations

import os

from pyvmm._native import ffi, lib
from pyvmm.kvm.ioctl import KvmError, ioctl

#: The scalar fields of a stats file, by its header's bytes: the
#: descriptors are the kernel's and the same for every vCPU it runs, so
#: they are read once per process (the warm launcher reads them before it
#: forks, pyvmm/serve/warm.py: 0.3 ms of every VM's start).
_layouts: dict[bytes, list[tuple[str, int]]] = {}


class KvmStats:
    """An open stats fd; ``read()`` returns {name: value} for scalar stats."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # The layout is read at the first read(), not here: a cold start's
        # set-up would pay 0.2 ms for it before the guest's first instruction.
        self._fields: list[tuple[str, int]] | None = None

    def _layout(self) -> list[tuple[str, int]]:
        size = ffi.sizeof("struct kvm_stats_header")
        raw_header = os.pread(self.fd, size, 0)
        fields = _layouts.get(raw_header)
        if fields is None:
            fields = _layouts[raw_header] = _scalars(self.fd, raw_header)
        return fields

    @classmethod
    def open(cls, vcpu_fd: int) -> KvmStats | None:
        """The vCPU's stats, or None where the kernel has no stats fd."""
        try:
            fd = ioctl(vcpu_fd, lib.KVM_GET_STATS_FD, call="KVM_GET_STATS_FD")
        except KvmError:
            return None
        return cls(fd)

    def read(self) -> dict[str, int]:
        if self._fields is None:
            self._fields = self._layout()
        values = {}
        for name, offset in self._fields:
            values[name] = int.from_bytes(os.pread(self.fd, 8, offset), "little")
        return values

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _scalars(fd: int, raw_header: bytes) -> list[tuple[str, int]]:
    """(name, offset in the file) of each scalar statistic."""
    header = ffi.new("struct kvm_stats_header *")
    ffi.buffer(header)[:] = raw_header
    desc_size = ffi.sizeof("struct kvm_stats_desc") + header.name_size
    raw = os.pread(fd, desc_size * header.num_desc, header.desc_offset)
    fields = []
    for i in range(header.num_desc):
        chunk = raw[i * desc_size : (i + 1) * desc_size]
        desc = ffi.from_buffer("struct kvm_stats_desc *", chunk)
        name = bytes(chunk[ffi.sizeof("struct kvm_stats_desc") :]).split(b"\0", 1)[0]
        if desc.size == 1:  # histograms have size > 1; keep scalars
            fields.append((name.decode(), header.data_offset + desc.offset))
    return fields
