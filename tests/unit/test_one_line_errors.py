"""Failures that are nobody's input (an unsupported host, a pyvmm bug) still end
in one clear line, before touching KVM where possible."""

from __future__ import annotations

import os
import posix
import struct

import pytest

from conftest import guest
from pyvmm.common.errors import HostError
from pyvmm.vm.config import VmConfig
from pyvmm.vm.vmm import Vmm


def test_a_host_without_its_arch_is_refused_clearly(tmp_path, monkeypatch):
    from pyvmm import arch

    blob = bytearray(guest("hello").read_bytes())
    blob[18:20] = struct.pack("<H", 183)  # EM_AARCH64: a guest built for that host
    path = tmp_path / "hello-arm.hvt"
    path.write_bytes(bytes(blob))
    host = os.uname()
    monkeypatch.setattr(os, "uname", lambda: posix.uname_result((*host[:4], "aarch64")))
    monkeypatch.delitem(arch.ARCHES, "aarch64")  # as before pyvmm/arch/aarch64 existed
    with pytest.raises(HostError, match=r"^aarch64 hosts are not supported yet"):
        Vmm(VmConfig(kernel=str(path)))


def test_a_pyvmm_bug_is_still_one_line(monkeypatch, capsys):
    """The last net under every error path: an unexpected exception becomes
    one 'pyvmm: internal error' line and exit status 1, not a traceback."""
    from pyvmm.command import cli

    def broken(argv):
        raise RuntimeError("something pyvmm did not expect")

    monkeypatch.setattr(cli, "parse_command", broken)
    monkeypatch.delenv("PYVMM_DEBUG", raising=False)
    assert cli.main(["hello.hvt"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("pyvmm: internal error: RuntimeError: something pyvmm did not expect")
