"""What the launcher does once, so that no VM child pays for it again.

Every module a run can need is imported before the first fork (the child
then imports nothing: ``imported_after_fork`` in a VM's final report says
so), the host's facts are read once, and pure computations that depend on
the unikernel and not on the host (the page tables of a memory layout) are
done in the launcher before the fork and kept: the architecture keeps them
when asked (``Arch.keep_boot_tables``), so the next VM of the same image
and mode gets them for free, and its child shares them copy-on-write.
A unikernel read and checked once is kept while its file is unchanged.
Finally ``gc.freeze()`` moves everything imported into the permanent
generation, so a child's garbage collections never write to those pages
and the interpreter's pages stay shared between VMs.

What a VM's child must not keep of the others (``forget_other_images``):
the unikernels the launcher read for other VMs. The rest of the heap it
copies is documented in docs/security.md.
"""

from __future__ import annotations

import gc
import importlib
import os
import platform
import weakref
from collections import OrderedDict
from typing import Any

#: Imported in the launcher, every module in them: everything ``Vmm`` and
#: the child's runner can reach, including what a run imports only when it
#: needs it (the tap code, the trap emulator, --stats, --user).
PACKAGES = ("pyvmm.devices", "pyvmm.hvt", "pyvmm.kvm", "pyvmm.loader")
MODULES = (
    "ctypes",
    "json",
    "logging",
    "pwd",
    "pyvmm.vm.vmm",
    "pyvmm.vm.plan",
    "pyvmm.vm.stats",
    "pyvmm.vm.statsview",
    "pyvmm.host.sandbox",
    "pyvmm.vm.faults",
    "pyvmm.devices.iothread",
    "pyvmm.host.netns",
    "pyvmm.arch",
    "pyvmm.serve.child",
)
#: The host architecture's package (every module in it).
HOST_PACKAGES = {"x86_64": "pyvmm.arch.x86_64", "aarch64": "pyvmm.arch.aarch64"}


class HostFacts:
    """The host's facts a plan needs, read once."""

    def __init__(self) -> None:
        from pyvmm.kvm.system import kvm_flavour

        self.machine = platform.machine()
        self.flavour = kvm_flavour()
        self.kernels = KernelCache()
        _ask_kvm(self.machine)


def _ask_kvm(machine: str) -> None:
    """What every child would ask KVM and get the same answer to, asked
    here once through a throw-away VM and vCPU (each child then opens its
    own): /dev/kvm's API version and extensions (cached by pyvmm.kvm.system),
    the CPUID KVM supports (pyvmm.arch.x86_64.cpu) and the layout of a
    vCPU's statistics (pyvmm.kvm.stats). Without KVM the child says what is
    wrong."""
    from pyvmm._native import lib
    from pyvmm.common.errors import HostError
    from pyvmm.kvm import System
    from pyvmm.kvm.stats import KvmStats

    try:
        with System() as system, system.create_vm() as vm:
            system.check_extension(lib.KVM_CAP_IOEVENTFD)
            if machine == "x86_64":
                from pyvmm.arch.x86_64 import cpu

                cpu.supported_cpuid(system)
            stats = KvmStats.open(vm.create_vcpu(0).fd)
            if stats is not None:
                stats.read()  # its layout, kept for every child
                stats.close()
    except HostError:
        pass


def import_all(machine: str) -> None:
    import pkgutil

    for name in MODULES:
        importlib.import_module(name)
    packages = PACKAGES + ((HOST_PACKAGES[machine],) if machine in HOST_PACKAGES else ())
    for name in packages:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, name + "."):
            importlib.import_module(module.name)


#: Page-table images the launcher keeps (one per image and mode in use).
BOOT_TABLES_KEPT = 64


#: Every kernel a cache of this process loaded, while anything still holds
#: it (a cache, a pool's prepared VM, a plan), and every cache: what a VM's
#: child forgets (``forget_other_images``).
_loaded: weakref.WeakSet = weakref.WeakSet()
_caches: weakref.WeakSet = weakref.WeakSet()


class KernelCache:
    """``load_kernel`` remembered: a unikernel read and checked once is not
    read again while its file is the same (device, inode, size, times:
    ``FileIdentity``, what the loader itself trusts before mapping it)."""

    SIZE = 32

    def __init__(self) -> None:
        self._kernels: OrderedDict[tuple, Any] = OrderedDict()
        _caches.add(self)

    def keep_only(self, kernel: Any) -> None:
        """Drop every entry but ``kernel``'s (a VM's child, for its own)."""
        for key in [k for k, v in self._kernels.items() if v is not kernel]:
            del self._kernels[key]

    def load(self, path: str, host_machine: str, *, legacy_abi: bool = False) -> Any:
        from pyvmm.loader import load_kernel
        from pyvmm.loader.sharing import FileIdentity

        try:
            identity = FileIdentity.of(os.stat(path))
        except OSError:
            identity = None  # the loader says what is wrong, in its words
        key = (path, os.path.abspath(path), host_machine, legacy_abi)
        kernel = self._kernels.get(key)
        if kernel is not None and identity is not None and kernel.file == identity:
            self._kernels.move_to_end(key)
            return kernel
        kernel = load_kernel(path, host_machine, legacy_abi=legacy_abi, mapped=False)
        _loaded.add(kernel)
        if identity is not None and kernel.file == identity:
            self._kernels[key] = kernel
            if len(self._kernels) > self.SIZE:
                self._kernels.popitem(last=False)
        return kernel


def _buffers(kernel: Any) -> dict[int, Any]:
    """The objects holding ``kernel``'s file bytes (the loader's segments are
    views of the whole file, or copies), by id."""
    out = {}
    for seg in kernel.segments:
        data = seg.data
        obj = data.obj if isinstance(data, memoryview) else data
        out[id(obj)] = obj
    return out


def forget_other_images(own: Any) -> None:
    """In a VM's child, before it runs its guest: nothing of the unikernels
    the launcher read for other VMs stays readable here. An image read into
    memory has its pages dropped (they read as zeros; none is copied from
    the launcher for it) and the bytes at its ends zeroed; a mapped one (an
    mmap, a lease's view) is replaced by inaccessible pages. Then every cache keeps only ``own``
    (this VM's kernel, whose bytes place() still needs). The objects stay:
    nothing in this process reads them again."""
    import mmap

    from pyvmm._native import ffi, lib
    from pyvmm.common.errors import HostError

    keep = _buffers(own) if own is not None else {}
    for kernel in list(_loaded):
        if kernel is own:
            continue
        for key, obj in _buffers(kernel).items():
            if key in keep or not len(obj):
                continue
            if isinstance(obj, bytes) and len(obj) > 1:  # (not a 1-byte singleton)
                mapping = 0
            elif isinstance(obj, (mmap.mmap, ffi.buffer)):  # a file mapping (a lease's view)
                if isinstance(obj, mmap.mmap) and obj.closed:
                    continue
                mapping = 1
            else:
                continue
            view = ffi.from_buffer(obj)
            address = int(ffi.cast("uintptr_t", view))
            del view
            if mapping and address % mmap.PAGESIZE:
                continue  # not a mapping of its own
            err = lib.pyvmm_sandbox_forget(address, len(obj), mapping)
            if err:
                raise HostError(f"cannot forget another VM's image: {os.strerror(-err)}")
        _loaded.discard(kernel)
    for cache in list(_caches):
        cache.keep_only(own)


def precompute(plan: Any) -> None:
    """Before the fork: what ``Vmm`` would compute from the plan alone (the
    page tables, kept by the architecture since ``warm_up``)."""
    from pyvmm.loader import page_regions

    plan.arch.boot_tables(page_regions(plan.kernel), plan.mode)


def _keep_boot_tables(machine: str) -> None:
    """Ask the architecture to keep the page tables it computes (precompute
    fills them before each fork). An architecture this host cannot run is
    left to the children, which say so as the command would."""
    from pyvmm.arch import host_arch
    from pyvmm.common.errors import HostError

    try:
        host_arch(machine).keep_boot_tables(BOOT_TABLES_KEPT)
    except HostError:
        pass


def _compile_sandbox() -> None:
    """The sandbox's BPF program, compiled here once (about 2 ms of
    libseccomp): each child only loads it. A failure is left to the
    children, which try again and report it as the command would."""
    from pyvmm.common.errors import HostError
    from pyvmm.host import sandbox

    try:
        sandbox.program()
    except HostError:
        pass


def warm_up() -> HostFacts:
    """Import, read the host, set up the caches, then freeze the heap."""
    facts = HostFacts()
    import_all(facts.machine)
    _keep_boot_tables(facts.machine)
    _compile_sandbox()
    gc.collect()
    gc.freeze()
    return facts
