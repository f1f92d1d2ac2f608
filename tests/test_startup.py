"""A lean cold start: each action imports only what it
needs, so a module that creeps back onto the path shows here, not as a few
milliseconds nobody notices. docs/startup.md has the measurements."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, guest, run_pyvmm
from pyvmm._native import lib
from testkit.helpers import run_python

# Run pyvmm as the launcher does (-I -S, the checkout first on sys.path) and
# report the modules loaded by the time the process exits.
PROBE = """
import sys
sys.path.insert(0, sys.argv.pop(1))
sys.argv[0] = "pyvmm"
import os
from pyvmm import entry
out = open(os.environ["PYVMM_MODULES_OUT"], "w")  # before the sandbox
def report(status, _exit=os._exit):
    out.write("\\n".join(sorted(sys.modules)))
    out.close()
    _exit(status)
os._exit = report
entry.launched("0")
"""

# Never on the path of --version or of a guest without devices.
HEAVY = {"logging", "socket", "json", "argparse", "pathlib", "asyncio", "subprocess"}
DEVICE_KINDS = {"pyvmm.devices.net", "pyvmm.devices.block", "pyvmm.devices.net.tap"}


def modules(tmp_path, *args: str) -> set[str]:
    out = tmp_path / "modules"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, str(ROOT), *args],
        capture_output=True,
        text=True,
        env={"PYVMM_MODULES_OUT": str(out)},
        timeout=60,
    )
    assert out.stat().st_size, done.stderr
    return set(out.read_text().split())


def test_version_imports_no_device_kind_no_architecture_no_logging(tmp_path):
    loaded = modules(tmp_path, "--version")
    unwanted = HEAVY | DEVICE_KINDS | {"dataclasses", "inspect", "platform"}
    unwanted |= {"typing", "re", "enum", "functools"}  # typing and what it imports
    assert not loaded & unwanted, loaded & unwanted
    assert not any(m.startswith(("pyvmm.arch", "pyvmm.vm.statsview")) for m in loaded)


def test_help_needs_the_device_kinds_only_for_their_options(tmp_path):
    loaded = modules(tmp_path, "--help")
    assert "pyvmm.devices.net" in loaded and "logging" not in loaded


@pytest.mark.kvm
def test_a_guest_without_devices_loads_no_net_code_no_trap_emulator_no_logging(tmp_path):
    loaded = modules(tmp_path, str(guest("hello")))
    unwanted = HEAVY | {"pyvmm.devices.net.tap", "pyvmm.arch.x86_64.traps", "pyvmm.host.netns"}
    # No dataclasses on the start path, so neither it nor the inspect it
    # imports (with ast, dis and tokenize) is ever loaded.
    unwanted |= {"dataclasses", "inspect", "ast", "dis", "tokenize"}
    unwanted.add("signal")  # _signal does (signal.py's enums cost a millisecond)
    assert not loaded & unwanted, loaded & unwanted
    assert "pyvmm.vm.vmm" in loaded


@pytest.mark.kvm
def test_version_cycle_frequency_is_the_architectures():
    """host.cycle_freq reads the counter's frequency without importing the
    architecture: the same value as Arch.cycle_freq."""
    from pyvmm.arch import host_arch
    from pyvmm.command.hostinfo import cycle_freq
    from pyvmm.kvm import System

    with System() as kvm:
        direct = cycle_freq(kvm)
        with kvm.create_vm() as vm:
            assert direct == host_arch().cycle_freq(vm.create_vcpu(0))


@pytest.mark.kvm
@pytest.mark.parametrize("cpl", ["auto", "deprivileged"])
def test_the_null_kick_is_absorbed_once_the_guest_first_kicks(cpl):
    """The null-kick doorbell is registered at the guest's first write to it
    (a VM without an ioeventfd is destroyed 10-15 ms faster): hcbench's
    kicks after the first stay in the kernel, and the run ends well."""
    result = run_pyvmm(f"--cpl={cpl}", "--stats-json=-", guest("hcbench"), "200")
    assert result.returncode == 0, result.stderr
    assert "kick_ns: " in result.stdout and result.stdout.endswith("SUCCESS\n"), result.stdout
    (record,) = [json.loads(x) for x in result.stderr.splitlines() if x.startswith("{")]
    # Of the 200 kicks one reached pyvmm: every other port write that did
    # was a hypercall, answered in C or in Python.
    hypercalls = sum(record["hypercalls"].values())
    port_writes = record["exits_to_pyvmm"].get("IoOut", 0)
    assert port_writes <= hypercalls + 1, (port_writes, record["hypercalls"])


@pytest.mark.kvm
def test_a_kick_of_a_ring_the_guest_was_not_given_stops_it():
    """Solo5's ring doorbell in a VM without a ring is an unknown port
    write: one line and status 1, nothing registered in its place."""
    result = run_pyvmm(guest("hcbench"), "ringkick")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILURE" not in result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("pyvmm: guest fault: invalid hypercall: 4-byte write to port 0x600 ")


@pytest.mark.kvm
def test_without_ioeventfds_the_null_kick_is_an_unknown_port_write():
    """A host whose KVM has no ioeventfds gets no null-kick doorbell: the
    guest's first kick is refused like any unknown port, in one line."""
    result = run_python(
        f"""
        import sys
        from pyvmm.command.cli import main
        from pyvmm.kvm.system import System
        from pyvmm._native import lib

        asked = System.check_extension
        System.check_extension = lambda self, cap: (
            0 if cap == lib.KVM_CAP_IOEVENTFD else asked(self, cap))
        sys.exit(main([{str(guest("hcbench"))!r}, "3"]))
        """
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "hypercall_ns: " in result.stdout and "kick_ns" not in result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        f"pyvmm: guest fault: invalid hypercall: 4-byte write to port {lib.PYVMM_NULL_KICK_PIO:#x} "
    ), line
