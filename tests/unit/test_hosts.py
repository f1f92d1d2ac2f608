"""Hosts pyvmm cannot run guests on say so in one line, before touching KVM."""

from __future__ import annotations

import platform
import struct

import pytest

from conftest import guest
from pyvmm.config import VmConfig
from pyvmm.errors import HostError
from pyvmm.vmm import Vmm


def test_aarch64_host_is_refused_clearly(tmp_path, monkeypatch):
    blob = bytearray(guest("hello").read_bytes())
    blob[18:20] = struct.pack("<H", 183)  # EM_AARCH64: a guest built for that host
    path = tmp_path / "hello-arm.hvt"
    path.write_bytes(bytes(blob))
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    with pytest.raises(HostError, match=r"^aarch64 hosts are not supported yet"):
        Vmm(VmConfig(kernel=str(path)))
