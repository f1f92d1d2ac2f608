"""A run's settings are a record: built by keyword, compared and shown by
value, each config with its own lists and dicts."""

from __future__ import annotations

import pytest

from pyvmm.common.record import MutableRecord
from pyvmm.vm.config import DEFAULT_MEM_MIB, VmConfig


def test_defaults_are_fresh_for_each_config():
    first, second = VmConfig("k"), VmConfig(kernel="k")
    assert first == second and isinstance(first, MutableRecord)
    first.guest_args.append("x")
    first.devices["net"] = {"service0": "tap0"}
    assert second.guest_args == [] and second.devices == {}
    assert first != second


def test_settings_by_keyword_and_their_defaults():
    config = VmConfig("k", mem_mib=64, cpl="3", devices={"shm": {None: "poll"}})
    assert (config.mem_mib, config.cpl, config.devices) == (64, "3", {"shm": {None: "poll"}})
    assert VmConfig("k").mem_mib == DEFAULT_MEM_MIB and VmConfig("k").cpl == "auto"
    assert not VmConfig("k").sandbox and VmConfig("k", sandbox=True).sandbox


def test_unknown_setting_is_refused_when_made_and_when_set():
    with pytest.raises(TypeError, match="'shm'"):
        VmConfig("k", shm="poll")
    config = VmConfig("k")
    with pytest.raises(AttributeError):
        config.shm = "poll"  # type: ignore[attr-defined]


def test_shown_with_every_setting_in_order_and_not_hashable():
    shown = repr(VmConfig("k"))
    assert shown.startswith("VmConfig(kernel='k', guest_args=[], mem_mib=512, devices={}, ")
    assert shown.endswith("gdb=False, gdb_port=None, gdb_socket=None)")
    with pytest.raises(TypeError):
        hash(VmConfig("k"))
