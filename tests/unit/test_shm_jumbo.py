"""A net device whose frames do not fit a shmstream slot (a jumbo-frame tap)
is left to the hvt hypercalls instead of refusing the guest; the others keep
their rings."""

from __future__ import annotations

from types import SimpleNamespace

from pyvmm._native import lib
from pyvmm.devices.net.shmstream import MAX_FRAME, ShmLayout

MIB = 1 << 20


def device(name: str, mtu: int) -> SimpleNamespace:
    return SimpleNamespace(name=name, mtu=mtu, max_frame=mtu + lib.HVT_ETH_HLEN)


def test_devices_that_fit_keep_the_layout():
    layout = ShmLayout.plan(512 * MIB, (1, 2))
    nets = {1: device("service0", 1500), 2: device("service1", MAX_FRAME - lib.HVT_ETH_HLEN)}
    assert layout.serving(nets) is layout


def test_a_jumbo_tap_is_left_out_and_the_rest_keep_their_rings():
    layout = ShmLayout.plan(512 * MIB, (1, 2))
    served = layout.serving({1: device("service0", 9000), 2: device("service1", 1500)})
    assert served is not None
    assert served.handles == (2,)
    assert (served.gpa, served.size, served.slots) == (layout.gpa, layout.size, layout.slots)


def test_no_region_when_no_device_fits():
    layout = ShmLayout.plan(512 * MIB, (1,))
    assert layout.serving({1: device("service0", 9000)}) is None
