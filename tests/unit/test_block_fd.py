"""--block:NAME=@FD: a disk image the caller opened (pyvmm-oci opens an
image's file inside its rootfs and hands pyvmm the descriptor, so no name
is looked up again between its checks and pyvmm's use)."""

from __future__ import annotations

import fcntl
import os

import pytest

from pyvmm.common.errors import DeviceError
from pyvmm.devices.block.backend import BlockDevice


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "disk.img"
    path.write_bytes(bytes(8192))
    return path


def test_an_open_descriptor_is_adopted(image):
    fd = os.open(image, os.O_RDWR)
    os.unlink(image)  # the name is gone: the descriptor is what counts
    with BlockDevice.open("storage", f"@{fd}") as disk:
        assert disk.fd == fd and disk.capacity == 8192
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        disk.write_from(512, b"x" * 512)
        assert os.pread(fd, 512, 512) == b"x" * 512
    with pytest.raises(OSError):
        os.fstat(fd)  # the device owned it and closed it


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("@x", "'x' is not a file descriptor number"),
        ("@", "'' is not a file descriptor number"),
        ("@99999999999", "is not a file descriptor number"),
        ("@1000000", "fd 1000000 is not open"),
    ],
)
def test_what_is_no_descriptor_gets_one_line(spec, message):
    with pytest.raises(DeviceError, match=message) as info:
        BlockDevice.open("storage", spec)
    assert str(info.value).startswith("block device 'storage': ")


def test_a_descriptor_must_be_a_disk_open_read_write(image, tmp_path):
    read_only = os.open(image, os.O_RDONLY)
    directory = os.open(tmp_path, os.O_RDONLY)
    reader, writer = os.pipe()
    try:
        for fd, message in (
            (read_only, "is not open for reading and writing"),
            (directory, "is not a regular file or block device"),
            (reader, "is not a regular file or block device"),
        ):
            with pytest.raises(DeviceError, match=f"fd {fd} {message}"):
                BlockDevice.open("storage", f"@{fd}")
            os.fstat(fd)  # refused: still the caller's, still open
    finally:
        for fd in (read_only, directory, reader, writer):
            os.close(fd)


def test_an_adopted_descriptor_is_locked_like_a_path(image):
    first = BlockDevice.open("storage", str(image))
    fd = os.open(image, os.O_RDWR)
    try:
        with pytest.raises(DeviceError, match="is locked by another process"):
            BlockDevice.open("storage", f"@{fd}")
    finally:
        first.close()
        os.close(fd)
