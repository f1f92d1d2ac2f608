"""Which network path a guest gets, and where the shmstream region goes."""

from __future__ import annotations

import pytest

from conftest import guest
from pyvmm.common.errors import UsageError
from pyvmm.common.record import replace
from pyvmm.devices.net.shmstream import ShmLayout
from pyvmm.devices.net.transport import choose_shm, choose_solo5_ring
from pyvmm.loader import load_kernel
from pyvmm.loader.notes import AbiInfo, Capabilities
from pyvmm.vm.config import VmConfig

MIB = 1 << 20


@pytest.fixture
def shm_guest():
    return load_kernel(str(guest("ping")), "x86_64")


@pytest.fixture
def solo5_guest(shm_guest):
    return replace(shm_guest, capabilities=Capabilities(flags=1))  # user mode only


def test_shmstream_only_for_guests_that_ask(shm_guest, solo5_guest):
    assert shm_guest.capabilities.shmstream
    assert choose_shm(None, shm_guest, True) == "event"
    assert choose_shm("poll", shm_guest, True) == "poll"
    assert choose_shm("off", shm_guest, True) == "off"
    assert choose_shm("poll", shm_guest, False) == "off"
    assert choose_shm("poll", solo5_guest, True) == "off"


def test_solo5_ring_offered_as_solo5_hvt_does(solo5_guest):
    config = VmConfig(kernel="k")
    assert choose_solo5_ring(config, solo5_guest, True, "off")
    assert not choose_solo5_ring(config, solo5_guest, False, "off")
    assert not choose_solo5_ring(
        VmConfig(kernel="k", devices={"no-net-ring": {None: True}}), solo5_guest, True, "off"
    )
    assert not choose_solo5_ring(
        VmConfig(kernel="k", devices={"shm": {None: "off"}}), solo5_guest, True, "off"
    )
    assert not choose_solo5_ring(config, solo5_guest, True, "event")  # shmstream instead


def test_legacy_abi_guest_gets_no_ring(shm_guest, solo5_guest):
    """An ABI version 1 unikernel never reads host_features: offer nothing."""
    old_shm = replace(shm_guest, abi=AbiInfo(target=1, version=1))
    old_solo5 = replace(solo5_guest, abi=AbiInfo(target=1, version=1))
    assert choose_shm(None, old_shm, True) == "off"
    assert not choose_solo5_ring(VmConfig(kernel="k"), old_solo5, True, "off")
    with pytest.raises(UsageError, match="ABI version 1, which knows no rings"):
        choose_solo5_ring(
            VmConfig(kernel="k", devices={"shm": {None: "poll"}}), old_shm, True, "off"
        )


def test_explicit_mode_with_nothing_to_serve_is_refused(solo5_guest):
    config = VmConfig(kernel="k", devices={"shm": {None: "poll"}, "no-net-ring": {None: True}})
    with pytest.raises(UsageError, match="nothing to serve"):
        choose_solo5_ring(config, solo5_guest, True, "off")


def test_region_sits_at_the_top_of_memory_in_2_mib_units():
    layout = ShmLayout.plan(64 * MIB, (1, 2), 256)
    assert layout.gpa + layout.size == 64 * MIB
    assert layout.size % (2 * MIB) == 0
    rx0, tx0 = layout.rings(0)
    rx1, _ = layout.rings(1)
    assert layout.gpa + 4096 == rx0 < tx0 < rx1
    assert rx1 + 2 * layout.ring_size <= layout.gpa + layout.size


def test_default_ring_depth_fits_an_eighth_of_memory():
    assert ShmLayout.auto_slots(512 * MIB, 1) == 4096
    assert ShmLayout.auto_slots(32 * MIB, 1) == 1024
    assert ShmLayout.auto_slots(8 * MIB, 4) == 64
    assert ShmLayout.plan(512 * MIB, (1,)).slots == 4096


def test_region_too_big_for_memory_is_refused():
    with pytest.raises(UsageError, match="too small for the shmstream region"):
        ShmLayout.plan(2 * MIB, (1,), 4096)
