"""The low area [0, PYVMM_LOW_AREA_END) (boot info, manifest copy, command
line, GDT, page tables, TSS) is never written by the host on a guest's
behalf: a hypercall that asks for it ends the run with the bad-pointer
fault, on the C fast path (which hands it to Python) and on the Python path
alike. Before the fix, walltime at 0x10000 overwrote boot_info.mem_size and
a block_read into 0x8000 installed a page-table entry of the guest's choice.
Reads from the low area (a frame to send, a block to write) stay allowed.
"""

from __future__ import annotations

import pytest

from conftest import engine_env, guest, run_pyvmm
from testkit.helpers import check_bad_call
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.parametrize("engine", ["c", "python"])]

LOW = {
    # guest, case: (exit status, what stderr's one line or stdout must say)
    ("badcall", "walltime_low"): (
        1,
        "bad pointer in walltime hypercall: 0x10000+0x8 is read-only memory",
    ),
    ("badcall", "read_low"): (
        1,
        "bad pointer in net_read hypercall: 0x8000+0x800 is read-only memory",
    ),
    ("badcall", "write_low"): (0, "ret: 0"),
    ("badblock", "read_low"): (
        1,
        "bad pointer in block_read hypercall: 0x8000+0x200 is read-only memory",
    ),
    ("badblock", "read_ro"): (
        1,
        "bad pointer in block_read hypercall: 0x100000+0x200 is read-only memory",
    ),
    ("badblock", "write_low"): (0, "ret: 0"),
}


@pytest.mark.netns
@pytest.mark.parametrize("case", sorted(c for g, c in LOW if g == "badcall"))
def test_net_and_clock_hypercalls_into_the_low_area(case, engine):
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        result = ns.run_pyvmm(
            "--shm=off", "--net=tap100", guest("badcall"), case, env=engine_env(engine)
        )
    check_bad_call(result, *LOW["badcall", case])


@pytest.mark.parametrize("case", sorted(c for g, c in LOW if g == "badblock"))
def test_block_hypercalls_into_the_low_area(case, engine, tmp_path):
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"\xcc" * 4096)
    result = run_pyvmm(f"--block:storage={disk}", guest("badblock"), case, env=engine_env(engine))
    check_bad_call(result, *LOW["badblock", case])
    if case == "write_low":
        assert disk.read_bytes()[:512] != b"\xcc" * 512  # the boot info went out
