"""The unikernel identity a snapshot records, and when a restore hashes.

A restore of the very file the snapshot read, unchanged, must not hash
the loaded bytes again (that hash was most of a cold restore's time); any
other file must be judged by the hash, whatever its stat says.
"""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import GUESTS
from pyvmm.loader import load_kernel
from pyvmm.vm.snapshot import identity


@pytest.fixture
def kernel(tmp_path):
    path = tmp_path / "hello.hvt"
    shutil.copy(GUESTS / "hello.hvt", path)
    return load_kernel(str(path), os.uname().machine)


@pytest.fixture
def hashes(monkeypatch):
    """How often the loaded bytes are hashed."""
    calls = []
    real = identity.loaded_sha256

    def counted(kernel):
        calls.append(kernel)
        return real(kernel)

    monkeypatch.setattr(identity, "loaded_sha256", counted)
    return calls


def test_the_identity_records_the_file_as_it_was_read(kernel):
    recorded = identity.kernel_identity(kernel)
    st = os.stat(kernel.path)
    assert recorded["file"] == {
        "dev": st.st_dev,
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }
    assert recorded["size"] == st.st_size
    assert recorded["path"] == os.path.abspath(kernel.path)
    assert len(recorded["sha256"]) == 64


def test_the_same_unchanged_file_is_not_hashed_again(kernel, hashes):
    recorded = identity.kernel_identity(kernel)
    identity._HASHES.clear()
    hashes.clear()
    # The hash does not decide here: even a wrong one passes.
    assert identity.same_kernel(kernel, "0" * 64, recorded["file"])
    assert hashes == []


@pytest.mark.parametrize("key", identity.FILE_KEYS)
def test_any_other_file_identity_is_judged_by_the_hash(kernel, hashes, key):
    recorded = identity.kernel_identity(kernel)
    other = {**recorded["file"], key: recorded["file"][key] + 1}
    hashes.clear()
    assert identity.same_kernel(kernel, recorded["sha256"], other)
    assert not identity.same_kernel(kernel, "0" * 64, other)
    assert len(hashes) == 2


def test_no_recorded_file_and_no_file_identity_leave_it_to_the_hash(kernel, hashes):
    recorded = identity.kernel_identity(kernel)
    assert not identity.same_kernel(kernel, "0" * 64, None)
    unvouched = kernel.replace(file=None)  # the loader could not vouch for what it read
    assert identity.file_identity(unvouched) is None
    assert "file" not in identity.kernel_identity(unvouched)
    assert not identity.same_kernel(unvouched, "0" * 64, recorded["file"])
    assert identity.same_kernel(unvouched, recorded["sha256"], recorded["file"])


def test_the_hash_is_made_once_per_loaded_kernel(kernel):
    first = identity.loaded_sha256(kernel)
    again = load_kernel(kernel.path, os.uname().machine)
    assert identity._HASHES[id(kernel)][1] == first
    assert identity.loaded_sha256(again) == first
    assert identity.loaded_sha256(kernel) is identity._HASHES[id(kernel)][1]
