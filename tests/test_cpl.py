"""The user-mode (CPL 3) profile: chosen automatically on PVM hosts for
guests that declare it (unmodified Solo5 unikernels run deprivileged there
instead: tests/test_deprivileged.py), and much faster than CPL 0 where KVM
emulates level-0 code."""

from __future__ import annotations

import os
import re

import pytest

from conftest import guest, run_pyvmm
from pyvmm.loader import load_kernel
from pyvmm.vm.plan import choose_mode
from testkit.helpers import BAD_CPL, BAD_CPL_MESSAGE, STATS, parse_stats

pytestmark = pytest.mark.kvm

# The host's KVM is kvm_pvm: asked of the kernel, not of pyvmm's own
# kvm_flavour(), which is under test here.
PVM = os.path.exists("/sys/module/kvm_pvm")


def test_auto_picks_user_mode_on_pvm_for_declaring_guest():
    """--cpl=auto: 3 on a PVM host for a guest that declares user mode, else
    0; the guest reports the level it really runs at (its CS selector)."""
    result = run_pyvmm(guest("hello"))
    assert result.returncode == 0, result.stdout + result.stderr
    expected = "3" if PVM else "0"
    assert f"cpl: {expected}" in result.stdout.splitlines()


def test_choose_mode_rules(tmp_path):
    declaring = load_kernel(str(guest("hello")), "x86_64")
    assert declaring.capabilities.user_mode
    assert choose_mode("auto", declaring, "pvm") == "user"
    assert choose_mode("auto", declaring, "intel-vmx") == "kernel"
    assert choose_mode("0", declaring, "pvm") == "kernel"
    assert choose_mode("3", declaring, "intel-vmx") == "user"
    assert choose_mode("deprivileged", declaring, "intel-vmx") == "deprivileged"


def test_guest_without_note_never_gets_user_mode(tmp_path):
    blob = bytearray(guest("hello").read_bytes())
    owner = blob.index(b"pyvmm\0\0\0")
    blob[owner : owner + 5] = b"other"  # the note is no longer pyvmm's
    path = tmp_path / "plain.hvt"
    path.write_bytes(bytes(blob))
    kernel = load_kernel(str(path), "x86_64")
    assert not kernel.capabilities.user_mode
    assert choose_mode("auto", kernel, "pvm") == "deprivileged"
    assert choose_mode("auto", kernel, "amd-svm") == "kernel"
    result = run_pyvmm("--cpl=0", path)
    assert result.returncode == 0 and "cpl: 0" in result.stdout.splitlines()
    refused = run_pyvmm("--cpl=3", path)
    assert refused.returncode == 1
    assert "does not declare" in refused.stderr


def test_bad_cpl_value():
    result = run_pyvmm(f"--cpl={BAD_CPL}", guest("hello"))
    assert result.returncode == 1
    assert result.stderr.strip() == BAD_CPL_MESSAGE


def compute(cpl: str) -> tuple[str, int, int]:
    """The checksum, the bytes it covers, and KVM's count of emulated instructions."""
    result = run_pyvmm(STATS, f"--cpl={cpl}", guest("compute"), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    checksum = re.search(r"^checksum: (0x[0-9a-f]+)$", result.stdout, re.M).group(1)
    size = int(re.search(r"^bytes: (\d+)$", result.stdout, re.M).group(1))
    return checksum, size, parse_stats(result.stderr)["kvm"]["insn_emulation"]


def test_user_mode_computes_the_same_and_natively_on_pvm():
    sum0, size, emulated0 = compute("0")
    sum3, _, emulated3 = compute("3")
    assert sum0 == sum3
    if PVM:
        # Counted, not timed (the speed is bench/cpl.py's): kvm_pvm sends
        # every CPL 0 instruction through KVM's emulator, at least one per
        # word of the loop, while CPL 3 code runs on the CPU.
        assert emulated0 >= size // 8, (emulated0, size)
        assert emulated3 < size // 8 // 100, (emulated3, size)
    # Elsewhere (hardware virtualisation) both levels run natively: there is
    # no speed promise to check, only the same result.
