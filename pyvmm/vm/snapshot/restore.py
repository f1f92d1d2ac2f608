"""Restoring a snapshot in a new process (``pyvmm --restore=DIR``).

``Restore.open`` reads and checks the snapshot before any host resource is
touched: the metadata's format, version and checksum, every field's type
and range, the vCPU state's checksum and part sizes, the memory file's
size. ``configure`` turns it into the run's settings (the unikernel, its
memory, arguments and privilege mode come from the snapshot; the devices
from the command line), ``check_plan`` compares the plan made from them
with the snapshot's, the unikernel's identity included. Then, in place of
a boot, ``load_memory`` maps the memory file MAP_PRIVATE over guest memory
(pages load on demand and a guest write copies one) and ``load_vcpu``
sets the vCPU's state, its TSC moved on by the wall-clock time since the
snapshot: the guest's monotonic clock continues from the snapshot's
without going back, and a wall clock kept as boot time plus monotonic
time (Solo5's) is right again.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from pyvmm.common import trace
from pyvmm.common.errors import UsageError
from pyvmm.common.sizes import MIB
from pyvmm.devices import attaching_option, kinds, option_table
from pyvmm.kvm.ioctl import KvmError
from pyvmm.loader import DeviceType, page_protections
from pyvmm.vm.snapshot import vcpu as cpu_state
from pyvmm.vm.snapshot.format import (
    FORMAT,
    Field,
    SnapshotError,
    memory_size_ok,
    open_directory,
    open_memory,
    read_metadata,
    read_state,
)
from pyvmm.vm.snapshot.identity import FILE_KEYS, same_kernel

if TYPE_CHECKING:
    from pyvmm.kvm import System, Vcpu
    from pyvmm.kvm.memory import GuestMemory
    from pyvmm.loader import Kernel
    from pyvmm.vm.config import VmConfig
    from pyvmm.vm.plan import Plan

#: plan.mode -> the --cpl that asks for it.
_CPL_OF_MODE = {"kernel": "0", "user": "3", "deprivileged": "deprivileged"}


def _plan_options(path: str, saved: object) -> dict[str, object]:
    """The kinds' plan options the snapshot was taken with, each checked as
    its option's parser checks the command line's."""
    if not isinstance(saved, dict):
        raise refuse(path, "its plan options are not an object")
    table = option_table()
    options = {}
    for flag, value in saved.items():
        known = table.get(flag)
        if known is None or known[1].per_device:
            raise refuse(path, f"its plan has an unknown option '--{flag}'")
        opt = known[1]
        try:
            ok = (
                value is True
                if not opt.takes_value
                else (type(value) in (str, int) and opt.parse(f"--{flag}", str(value)) == value)
            )
        except UsageError as err:
            raise refuse(path, str(err)) from None
        if not ok:
            raise refuse(path, f"its plan option '--{flag}' has a bad value")
        options[flag] = value
    return options


def refuse(path: str, why: str) -> SnapshotError:
    return SnapshotError(f"--restore: {path}: {why}")


class Restore:
    """A snapshot, checked, and what it puts in place of a boot."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.memory_fd = -1
        #: The plan check_plan has passed (a launcher checks before its fork).
        self.checked: Plan | None = None
        dir_fd = open_directory(path)
        try:
            self._read(dir_fd)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(dir_fd)

    def _read(self, dir_fd: int) -> None:
        path = self.path
        meta = Field(read_metadata(dir_fd, path), "snapshot")
        if meta.text("format") != FORMAT:
            raise refuse(path, "not a pyvmm snapshot")
        machine = os.uname().machine
        if meta.text("arch") != machine:
            raise refuse(path, f"taken on an {meta.text('arch')} host, this one is {machine}")
        kernel = meta.object("kernel")
        self.kernel_path = kernel.text("path")
        self.kernel_sha256 = kernel.text("sha256")
        self.kernel_file = None  # a snapshot without it: the hash decides
        if kernel.value.get("file") is not None:
            file = kernel.object("file")
            self.kernel_file = {
                key: file.integer(key, -(1 << 63) if key.endswith("time_ns") else 0)
                for key in FILE_KEYS
            }
        plan = meta.object("plan")
        self.mem_size = plan.integer("mem_size")
        if not memory_size_ok(self.mem_size):
            raise refuse(path, f"memory size {self.mem_size} is not a 2 MiB multiple up to 4 GiB")
        self.usable = plan.integer("usable", 1, self.mem_size)
        self.mode = plan.text("mode")
        if self.mode not in _CPL_OF_MODE:
            raise refuse(path, f"unknown privilege mode '{self.mode}'")
        self.guest_args = plan.strings("guest_args")
        self.cmdline = plan.text("cmdline")
        self.legacy_abi = plan.flag("legacy_abi")
        self.no_net_ring = plan.flag("no_net_ring")
        self.options = _plan_options(path, plan.value.get("options", {}))
        types = {kind.type.name.lower() for kind in kinds()}
        self.devices = []
        for dev in meta.objects("devices"):
            kind = dev.text("type")
            if kind not in types:
                raise refuse(path, f"device '{dev.text('name')}' is of an unknown type '{kind}'")
            geometry = None
            if kind == "block":
                geometry = (dev.integer("capacity"), dev.integer("block_size", 1, 1 << 20))
            self.devices.append((dev.text("name"), dev.integer("handle", 0, 63), geometry))
        self.device_state = meta.value.get("device_state", {})
        labels = {kind.label for kind in kinds()}
        if not isinstance(self.device_state, dict) or not set(self.device_state) <= labels:
            raise refuse(path, "its device state names a device kind this pyvmm does not have")
        shadow = meta.value.get("shadow")
        self.shadow = None if shadow is None else Field(shadow, "snapshot.shadow").value
        clock = meta.object("clock")
        self.tsc = clock.integer("tsc")
        self.tsc_khz = clock.integer("tsc_khz", 1, 1 << 32)
        self.wall_ns = clock.integer("wall_ns")
        self.arch_state = cpu_state.for_arch(machine)
        sizes = self.arch_state.state_sizes()
        self.state = read_state(dir_fd, path, meta.object("cpu_state"), sizes)
        missing = self.arch_state.missing_part(self.state)
        if missing:
            raise refuse(path, missing)
        memory = meta.object("memory")
        if memory.integer("size") != self.mem_size:
            raise refuse(path, "the memory file's size and the plan's differ")
        self.memory_fd = open_memory(dir_fd, path, self.mem_size)

    def close(self) -> None:
        if self.memory_fd >= 0:
            os.close(self.memory_fd)
            self.memory_fd = -1

    # -- before the plan ------------------------------------------------------
    def configure(self, config: VmConfig) -> None:
        """The snapshot's settings for this run (its devices stay the command line's)."""
        if config.guest_args:
            raise SnapshotError("--restore: the guest's arguments come from the snapshot")
        config.kernel = self.kernel_path
        config.mem_mib = self.mem_size // MIB
        config.guest_args = list(self.guest_args)
        config.cpl = _CPL_OF_MODE[self.mode]
        config.legacy_abi = self.legacy_abi
        for flag, (_, opt) in option_table().items():
            if not opt.per_device and flag in config.devices:
                raise SnapshotError(
                    f"--restore: --{flag}: a restored guest keeps the snapshot's (leave it out)"
                )
        for flag, value in self.options.items():
            config.devices[flag] = {None: value}
        if self.no_net_ring:
            config.devices.setdefault("no-net-ring", {})[None] = True

    def check_plan(self, plan: Plan) -> None:
        """The plan made now must be the snapshot's: same unikernel, memory,
        layout, mode, arguments and devices."""
        if plan is self.checked:  # checked already, by the launcher before its fork
            return
        path = self.path
        # (no hash where the file is the one the snapshot read, unchanged;
        # hashed once per loaded kernel: a launcher checks many restores of one)
        if not same_kernel(plan.kernel, self.kernel_sha256, self.kernel_file):
            raise refuse(
                path,
                f"{plan.kernel.path} is not the unikernel the snapshot was taken of (changed?)",
            )
        if (plan.mem_size, plan.usable) != (self.mem_size, self.usable):
            raise refuse(path, "its memory layout differs from this run's plan")
        if plan.mode != self.mode:
            raise refuse(path, f"taken in {self.mode} mode, this host runs it in {plan.mode} mode")
        if plan.cmdline.hex() != self.cmdline:
            raise refuse(path, "its guest command line does not match its arguments")
        planned = sorted((r.name, r.handle) for _, r in plan.devices)
        saved = sorted((name, handle) for name, handle, _ in self.devices)
        if planned != saved:
            attach = {
                entry.index: attaching_option(kind)
                for kind in kinds()
                for entry in plan.kernel.manifest.devices(kind.type)
            }
            want = ", ".join(
                f"--{attach[handle].flag}:{name}={attach[handle].metavar}"
                if handle in attach
                else name
                for name, handle in saved
            )
            want = want or "none"
            raise refuse(path, f"the devices differ from the snapshot's (it needs: {want})")
        self.checked = plan

    def check_devices(self, devices) -> None:
        """Each block device attached has the snapshot's geometry (the
        guest has read it)."""
        geometry = {name: g for name, _, g in self.devices}
        for kind, device in devices:
            if kind.type != DeviceType.BLOCK or geometry.get(device.name) is None:
                continue
            capacity, block_size = geometry[device.name]
            if (device.capacity, device.block_size) != (capacity, block_size):
                raise refuse(
                    self.path,
                    f"block device '{device.name}' is {device.capacity} bytes in blocks of "
                    f"{device.block_size}, the snapshot's was {capacity} in blocks of {block_size}",
                )

    def load_devices(self, planned, services, devices) -> None:
        """Each kind's host side as the snapshot saved it (its rings' indices,
        its counters), checked against this run's, before its service starts."""
        for kind, decided in planned:
            service = next((s for k, s in services if k is kind), None)
            own = {device.handle: device for k, device in devices if k is kind}
            try:
                kind.restore_state(self.device_state.get(kind.label), decided, service, own)
            except UsageError as err:
                raise refuse(self.path, str(err).removeprefix("pyvmm: ")) from None
        trace.mark("device state set from the snapshot")

    # -- in place of a boot ---------------------------------------------------
    def load_memory(self, memory: GuestMemory, kernel: Kernel) -> None:
        err = memory.map_file(0, self.mem_size, self.memory_fd, 0)
        if err:
            raise refuse(self.path, f"cannot map its memory: {os.strerror(err)}")
        memory.protect_all((r.start, r.length, r.protection) for r in page_protections(kernel))
        self.close()  # the mapping holds the file
        trace.mark("snapshot memory mapped (MAP_PRIVATE)")

    def load_vcpu(self, system: System, vcpu: Vcpu, tsc_khz: int) -> None:
        """The saved state, its clock counter (x86_64's TSC, aarch64's
        virtual counter) moved on by the wall-clock time since the snapshot."""
        arch_state = self.arch_state
        if tsc_khz != self.tsc_khz:
            raise refuse(
                self.path,
                f"taken where the TSC runs at {self.tsc_khz} kHz, here at {tsc_khz} kHz",
            )
        try:
            arch_state.prepare(system, vcpu, self.state)
        except KvmError as err:
            why = str(err).removeprefix("pyvmm: ")
            raise refuse(self.path, f"this KVM refuses its vCPU set-up: {why}") from None
        gap_ns = max(0, time.time_ns() - self.wall_ns)
        tsc = self.tsc + gap_ns * self.tsc_khz // 1_000_000
        arch_state.apply(vcpu, arch_state.with_counter(self.state, tsc))
        # Some KVMs keep the guest's TSC the host's and ignore the write
        # (PVM: the host's TSC, which went on since the snapshot too); one
        # behind the snapshot's would make the guest's clock go back.
        if arch_state.read_counter(vcpu) < self.tsc:
            raise refuse(self.path, "this KVM did not set the TSC: the guest's clock would go back")
        trace.mark("vCPU state set from the snapshot")

    def load_shadow(self, handler: object) -> None:
        """The deprivileged trap emulator's shadow state, as it was."""
        shadow = getattr(handler, "shadow", None)
        if shadow is None or self.shadow is None:
            if (shadow is None) != (self.shadow is None):
                raise refuse(self.path, "its trap emulator state does not match the mode")
            return
        for name, kind in type(shadow).__annotations__.items():
            value = self.shadow.get(name)
            ok = value is None if "None" in str(kind) and value is None else isinstance(value, int)
            if not ok:
                raise refuse(self.path, f"its trap emulator field '{name}' is missing or bad")
            setattr(shadow, name, value)
