"""The page tables an architecture writes at entry, kept by the
architecture itself when a warm launcher asks (pyvmm/arch/boottables.py),
never by patching it from outside."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from pyvmm.arch.boottables import BootTables
from pyvmm.kvm.memory import GuestMemory, Protection

RX = Protection(read=True, write=False, execute=True)
RW = Protection(read=True, write=True, execute=False)
REGIONS = [(0x100000, 0x102000, RX), (0x102000, 0x104000, RW)]


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, regions, mode):
        self.calls += 1
        return {0x2000: bytes([len(regions)]) + mode.encode()}


def test_computed_each_time_until_asked_to_keep():
    compute = Counting()
    tables = BootTables(compute)
    assert tables.get(REGIONS, "kernel") == tables.get(REGIONS, "kernel")
    assert compute.calls == 2 and tables.kept == 0


def test_kept_by_regions_and_mode_and_read_only():
    compute = Counting()
    tables = BootTables(compute)
    tables.keep(2)
    first = tables.get(REGIONS, "kernel")
    assert tables.get(list(REGIONS), "kernel") is first
    assert tables.get(REGIONS, "user") is not first
    assert compute.calls == 2
    with pytest.raises(TypeError):
        first[0x3000] = b""  # shared between VMs: nobody may change it


def test_the_least_recently_used_goes_first():
    compute = Counting()
    tables = BootTables(compute)
    tables.keep(2)
    kernel = tables.get(REGIONS, "kernel")
    tables.get(REGIONS, "user")
    assert tables.get(REGIONS, "kernel") is kernel  # now the most recent
    tables.get(REGIONS, "deprivileged")  # evicts "user"
    assert tables.kept == 2 and compute.calls == 3
    tables.get(REGIONS, "user")
    assert compute.calls == 4
    tables.keep(0)
    assert tables.kept == 0


def _written(arch, mode: str) -> bytes:
    with GuestMemory(4 << 20) as memory:
        arch.prepare_memory(memory, REGIONS, mode)
        return bytes(memory.read(0, 0x100000))


@pytest.mark.parametrize("mode", ["kernel", "user", "deprivileged"])
def test_x86_64_writes_the_same_memory_from_kept_tables(mode):
    from pyvmm.arch.x86_64 import X86_64, mode_page_tables

    plain = X86_64()
    warm = X86_64()
    warm.keep_boot_tables(4)
    kept = warm.boot_tables(REGIONS, mode)
    assert warm.boot_tables(REGIONS, mode) is kept
    assert dict(kept) == mode_page_tables(REGIONS, mode)
    assert _written(warm, mode) == _written(plain, mode)


def test_aarch64_keeps_its_translation_tables_the_same_way():
    from pyvmm.arch.aarch64 import Aarch64, mmu

    arch = Aarch64()
    arch.keep_boot_tables(4)
    kept = arch.boot_tables(REGIONS, "kernel")
    assert arch.boot_tables(REGIONS, "kernel") is kept
    assert dict(kept) == mmu.translation_tables(REGIONS)
    assert _written(arch, "kernel") == _written(Aarch64(), "kernel")


# In a child: gc.freeze and the imports are for good.
WARM_UP = """
import sys, types
sys.path.insert(0, sys.argv[1])
from pyvmm.serve import warm
from pyvmm.arch import host_arch
from pyvmm.loader import load_kernel, page_regions
from pyvmm.vm.plan import make_plan

warm.import_all(warm.platform.machine())
before = {
    (name, attr): value
    for name, module in list(sys.modules.items())
    if name.startswith("pyvmm") and isinstance(module, types.ModuleType)
    for attr, value in vars(module).items()
    if callable(value)
}
warm.warm_up()
patched = sorted(
    f"{name}.{attr}" for (name, attr), value in before.items()
    if getattr(sys.modules[name], attr, None) is not value
)
print("patched:", " ".join(patched))
arch = host_arch()
kernel = load_kernel(sys.argv[2], arch.machine)
regions = page_regions(kernel)
first = arch.boot_tables(regions, "kernel")
print("kept:", arch.boot_tables(regions, "kernel") is first)
"""


def test_the_warm_launcher_patches_no_module_and_the_architecture_keeps_the_tables():
    from conftest import guest

    done = subprocess.run(
        [sys.executable, "-c", WARM_UP, str(ROOT), str(guest("hello"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "patched: \n" in done.stdout, done.stdout
    assert "kept: True" in done.stdout, done.stdout
