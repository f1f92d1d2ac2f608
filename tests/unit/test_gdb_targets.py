"""Each architecture's target description (gdbregs.TARGETS): the XML gdb
parses, every register type it names defined in it or one of gdb's own,
gdb's numbering (aarch64: x0-x30 0-30, sp 31, pc 32, cpsr 33, v0 34,
fpsr 66, fpcr 67) and g/G packets of the size the layout says."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from pyvmm.vm.debug import gdbregs

#: Types gdb knows without a definition (gdb's target description docs).
PREDEFINED = {
    "int",
    "int8",
    "int16",
    "int32",
    "int64",
    "int128",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "uint128",
    "code_ptr",
    "data_ptr",
    "ieee_single",
    "ieee_double",
    "i387_ext",
}


@pytest.mark.parametrize("arch", sorted(gdbregs.TARGETS))
def test_description_parses_and_defines_its_types(arch):
    target = gdbregs.TARGETS[arch]
    root = ET.fromstring(target.xml.split(b"?>", 1)[1].split(b">", 1)[1])
    assert root.find("architecture").text == ("i386:x86-64" if arch == "x86_64" else "aarch64")
    regs = list(root.iter("reg"))
    assert [r.get("name") for r in regs] == [r.name for r in target.registers]
    assert [int(r.get("regnum")) for r in regs] == list(range(len(target.registers)))
    defined = {e.get("id") for tag in ("vector", "union", "flags") for e in root.iter(tag)}
    for reg in regs:
        assert reg.get("type") in PREDEFINED | defined, reg.get("name")
    for element in list(root.iter("vector")) + list(root.iter("field")):
        if element.get("type"):
            assert element.get("type") in PREDEFINED | defined


def test_aarch64_numbering_and_packet_size():
    a64 = gdbregs.AARCH64
    assert [a64.by_name[n] for n in ("x0", "x30", "sp", "pc", "cpsr", "v0", "fpsr", "fpcr")] == [
        0,
        30,
        31,
        32,
        33,
        34,
        66,
        67,
    ]
    assert a64.g_size == 31 * 8 + 8 + 8 + 4 + 32 * 16 + 4 + 4
    values = {"pc": 0x100040, "v5": 1 << 127 | 3, "fpcr": 0x3000000}
    encoded = a64.encode_all(values)
    assert len(encoded) == 2 * a64.g_size
    assert a64.encode(a64.by_name["x3"], values) == "xx" * 8  # not given: unavailable
    decoded = a64.decode_all(bytes.fromhex(encoded.replace("x", "0")))
    assert {k: decoded[k] for k in values} == values
    assert a64.decode(a64.by_name["v0"], bytes(8)) is None  # the wrong size
