"""x86_64's x87/SSE state for the debugger and cores (pyvmm/arch/x86_64/
fpu.py): the full tag word derived from FXSAVE's abridged one as FSTENV
gives it, writes that keep the other registers, the FXSAVE image (a
core's NT_PRFPREG) and its conversion from and to struct kvm_fpu, all on
images made here."""

from __future__ import annotations

import struct

from pyvmm.arch.x86_64 import fpu

ONE = (1 << 63 | 0x3FFF << 64).to_bytes(10, "little")  # 1.0, extended precision
ZERO = bytes(10)
DENORMAL = (1).to_bytes(10, "little")


def kvm_fpu(st: list[bytes], *, fsw: int, ftwx: int, xmm0: int = 0, fip: int = 0) -> bytes:
    """A struct kvm_fpu (<linux/kvm.h>), the KVM_GET_FPU form."""
    fpr = b"".join(reg + bytes(6) for reg in st)
    xmm = xmm0.to_bytes(16, "little") + bytes(240)
    return struct.pack("<128sHHBxHQQ256sI4x", fpr, 0x37F, fsw, ftwx, 0x1D9, fip, 0, xmm, 0x1F80)


def image(st: list[bytes], **kwargs) -> bytes:
    return fpu.from_kvm_fpu(kvm_fpu(st, **kwargs))


def test_full_tag_classifies_each_physical_register_from_top():
    # TOP = 5: ST(0) is physical 5, ST(1) physical 6, ST(2) physical 7.
    st = [ONE, ZERO, DENORMAL] + [ZERO] * 5
    values = fpu.values(image(st, fsw=5 << 11, ftwx=0b11100000))
    assert values["ftag"] == 0b10_01_00 << 10 | 0x3FF  # 7 special, 6 zero, 5 valid, 0-4 empty
    assert fpu.abridged_tag(values["ftag"]) == 0b11100000


def test_values_split_the_instruction_pointer_as_gdb_reads_it():
    values = fpu.values(image([ZERO] * 8, fsw=0, ftwx=0, xmm0=1 << 127 | 5, fip=0x1234_0010_0080))
    assert (values["fioff"], values["fiseg"]) == (0x0010_0080, 0x1234)
    assert values["xmm0"] == 1 << 127 | 5 and values["xmm1"] == 0
    assert (values["fctrl"], values["fop"], values["mxcsr"]) == (0x37F, 0x1D9, 0x1F80)


def test_a_write_changes_only_its_register():
    raw = image([ONE] + [ZERO] * 7, fsw=0, ftwx=1, xmm0=7, fip=0xABC)
    new = fpu.values(fpu.with_values(raw, {"xmm3": 0xFEED, "st1": 0x4000_8000_0000_0000_0000}))
    old = fpu.values(raw)
    changed = {name for name in fpu.NAMES if new[name] != old[name]}
    assert changed == {"xmm3", "st1"}
    assert new["xmm3"] == 0xFEED and new["st1"] == 0x4000_8000_0000_0000_0000


def test_fxsave_image_is_linux_user_i387_struct_and_converts_back():
    raw = kvm_fpu([ONE] + [ZERO] * 7, fsw=7 << 11, ftwx=0x80, xmm0=0x1122, fip=0x100080)
    fx = fpu.from_kvm_fpu(raw)
    assert len(fx) == 512
    cwd, swd, twd, fop, rip, rdp, mxcsr, mask = struct.unpack_from("<HHHHQQII", fx)
    assert (cwd, swd, twd, fop, rip, mxcsr) == (0x37F, 7 << 11, 0x80, 0x1D9, 0x100080, 0x1F80)
    assert fx[32:42] == ONE  # st_space[0]
    assert fx[160:176] == (0x1122).to_bytes(16, "little")  # xmm_space[0]
    assert fpu.to_kvm_fpu(fx) == raw


def test_mxcsr_is_written_within_its_mask():
    fx = image([ZERO] * 8, fsw=0, ftwx=0)
    assert fpu.values(fpu.with_values(fx, {"mxcsr": 0x9FC0}))["mxcsr"] == 0x9FC0
    assert fpu.values(fpu.with_values(fx, {"mxcsr": 0x1_0000_1F80}))["mxcsr"] == 0x1F80


def test_the_names_are_the_gdb_target_descriptions():
    from pyvmm.vm.debug import gdbregs

    numbers = [gdbregs.X86_64.by_name[name] for name in fpu.NAMES]
    assert numbers == list(range(numbers[0], numbers[0] + len(fpu.NAMES)))
