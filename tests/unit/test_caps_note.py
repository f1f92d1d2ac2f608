"""pyvmm's capability note (CAP1, owner "pyvmm", docs/abi.md): a malformed,
unsupported or duplicated one is refused with one line and exit status 1,
through the command line, before any guest runs."""

from __future__ import annotations

import struct

import pytest
from elfbuild import NoteSpec, abi_note, devices, good_elf, manifest_desc, manifest_note

from conftest import run_pyvmm
from pyvmm._native import lib

pytestmark = pytest.mark.kvm  # pyvmm opens /dev/kvm before it reads the kernel


def caps(version: int = 1, flags: int = 1, extra: bytes = b"") -> NoteSpec:
    return NoteSpec(b"pyvmm", lib.PYVMM_NOTE_CAPS, struct.pack("<II", version, flags) + extra)


def kernel(tmp_path, *cap_notes: NoteSpec):
    elf = good_elf(notes=[abi_note(), manifest_note(manifest_desc(devices())), *cap_notes])
    path = tmp_path / "caps.hvt"
    path.write_bytes(elf.build())
    return path


def refused(path) -> str:
    result = run_pyvmm(path)
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyvmm: "), result.stderr
    return lines[0]


def test_two_capability_notes_are_refused(tmp_path):
    line = refused(kernel(tmp_path, caps(), caps()))
    assert "more than one pyvmm capability note" in line, line


def test_a_long_capability_note_is_refused(tmp_path):
    line = refused(kernel(tmp_path, caps(extra=b"\0" * 4)))
    assert "malformed pyvmm capability note (12 bytes, need 8)" in line, line


def test_a_short_capability_note_is_refused(tmp_path):
    short = NoteSpec(b"pyvmm", lib.PYVMM_NOTE_CAPS, struct.pack("<I", 1))
    line = refused(kernel(tmp_path, short))
    assert "malformed pyvmm capability note (4 bytes, need 8)" in line, line


def test_an_unknown_capability_note_version_is_refused(tmp_path):
    line = refused(kernel(tmp_path, caps(version=2)))
    assert "pyvmm capability note version 2 is not supported" in line, line
