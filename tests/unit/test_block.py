"""BlockDevice: what a disk image must be, and whole-block I/O without copies."""

from __future__ import annotations

import array
import os
from pathlib import Path
from typing import Any

import pytest

from pyvmm.common.errors import DeviceError
from pyvmm.devices.block import BlockDevice


def make_image(tmp_path: Path, size: int, name: str = "disk.img") -> Path:
    """An image whose byte i is i % 251, so any misplaced byte shows."""
    path = tmp_path / name
    path.write_bytes(bytes(i % 251 for i in range(size)))
    return path


@pytest.fixture
def disk(tmp_path: Path) -> Any:
    with BlockDevice.open("storage", str(make_image(tmp_path, 8 * 512))) as dev:
        yield dev


# -- opening ---------------------------------------------------------------


def test_open_reports_capacity_and_block_size(tmp_path: Path) -> None:
    path = make_image(tmp_path, 16 * 4096)
    with BlockDevice.open("storage", str(path), block_size=4096) as dev:
        assert (dev.name, dev.path) == ("storage", str(path))
        assert dev.capacity == 16 * 4096
        assert dev.block_size == 4096


def test_open_rejects_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "disk.img"
    with pytest.raises(DeviceError) as info:
        BlockDevice.open("storage", str(path))
    assert str(info.value) == (
        f"block device 'storage': Could not open block device: {path}: No such file or directory"
    )


def test_open_rejects_directory(tmp_path: Path) -> None:
    with pytest.raises(
        DeviceError, match=r"^block device 'storage': .* is not a regular file or block device$"
    ):
        BlockDevice.open("storage", str(tmp_path))


def test_open_rejects_device_node() -> None:
    with pytest.raises(DeviceError, match="/dev/null is not a regular file or block device"):
        BlockDevice.open("storage", "/dev/null")


def test_open_rejects_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(DeviceError, match="is not a regular file"):
        BlockDevice.open("storage", str(fifo))


def test_open_rejects_file_that_cannot_be_opened_read_write(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # Root ignores file modes; this sysctl file refuses writers even so.
        path = Path("/proc/sys/kernel/osrelease")
    else:
        path = make_image(tmp_path, 512)
        path.chmod(0o444)
    with pytest.raises(DeviceError) as info:
        BlockDevice.open("storage", str(path))
    assert str(info.value) == (
        f"block device 'storage': Could not open block device: {path}: Permission denied"
    )


def test_open_rejects_empty_file(tmp_path: Path) -> None:
    path = make_image(tmp_path, 0)
    with pytest.raises(
        DeviceError,
        match=r"^block device 'storage': Backing storage must be at least 1 block "
        r"\(512 bytes\) in size: .*disk.img is empty$",
    ):
        BlockDevice.open("storage", str(path))


@pytest.mark.parametrize(("size", "block_size"), [(1000, 512), (512 * 3 + 1, 512), (512, 4096)])
def test_open_rejects_size_that_is_not_whole_blocks(
    tmp_path: Path, size: int, block_size: int
) -> None:
    path = make_image(tmp_path, size)
    with pytest.raises(
        DeviceError, match=f"Backing storage size must be block aligned \\({block_size} bytes\\)"
    ):
        BlockDevice.open("storage", str(path), block_size=block_size)


@pytest.mark.parametrize("block_size", [0, -512, 256, 511, 513, 768, 1000, 65536, True, 512.0])
def test_open_rejects_block_size_that_is_not_a_power_of_two_from_512(
    tmp_path: Path, block_size: Any
) -> None:
    path = make_image(tmp_path, 1 << 17)
    with pytest.raises(
        DeviceError,
        match=r"^block device 'storage': Block size must be a multiple of 2 greater than or "
        r"equal 512 \(.* is not a power of two",
    ):
        BlockDevice.open("storage", str(path), block_size=block_size)


@pytest.mark.parametrize("block_size", [512, 1024, 4096, 32768])
def test_open_accepts_power_of_two_block_sizes(tmp_path: Path, block_size: int) -> None:
    path = make_image(tmp_path, 1 << 17)
    with BlockDevice.open("storage", str(path), block_size=block_size) as dev:
        assert dev.capacity // dev.block_size == (1 << 17) // block_size


def test_open_error_leaves_no_file_descriptor_open(tmp_path: Path) -> None:
    path = make_image(tmp_path, 1000)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(DeviceError):
        BlockDevice.open("storage", str(path))
    assert set(os.listdir("/proc/self/fd")) == before


# -- valid() ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "length"), [(0, 512), (512, 512), (0, 8 * 512), (7 * 512, 512), (1024, 2048)]
)
def test_valid_accepts_whole_blocks_inside_capacity(
    disk: BlockDevice, offset: int, length: int
) -> None:
    assert disk.valid(offset, length)


@pytest.mark.parametrize(
    ("offset", "length"),
    [
        (1, 512),  # misaligned offset
        (511, 512),
        (0, 511),  # partial sector
        (0, 513),
        (0, 0),  # empty request
        (-512, 512),  # negative offset
        (0, -512),
        (8 * 512, 512),  # starts at the end
        (7 * 512, 1024),  # straddles the end
        (0, 9 * 512),
        (2**64 - 512, 512),  # would wrap in 64-bit arithmetic
    ],
)
def test_valid_rejects_partial_or_outside_blocks(
    disk: BlockDevice, offset: int, length: int
) -> None:
    assert not disk.valid(offset, length)


# -- I/O -------------------------------------------------------------------


def test_read_into_bytearray_reads_the_right_blocks(disk: BlockDevice) -> None:
    buf = bytearray(1024)
    disk.read_into(1024, buf)
    assert buf == bytes(i % 251 for i in range(1024, 2048))


def test_write_then_read_round_trips_through_memoryview(disk: BlockDevice) -> None:
    backing = bytearray(4096)
    view = memoryview(backing)[1024:2048]  # a window, as guest memory would be
    view[:] = os.urandom(1024)
    disk.write_from(2048, view)
    out = bytearray(1024)
    disk.read_into(2048, memoryview(out))
    assert out == view.tobytes()
    assert Path(disk.path).read_bytes()[2048:3072] == view.tobytes()


def test_write_then_read_round_trips_through_bytearray(disk: BlockDevice) -> None:
    data = bytearray(os.urandom(512))
    disk.write_from(0, data)
    out = bytearray(512)
    disk.read_into(0, out)
    assert out == data


def test_io_counts_bytes_for_buffers_with_wide_items(disk: BlockDevice) -> None:
    words = array.array("I", range(128))  # 512 bytes as 128 items
    disk.write_from(512, words)
    out = array.array("I", bytes(512))
    disk.read_into(512, out)
    assert out == words


def test_io_works_on_cffi_buffers(disk: BlockDevice) -> None:
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    mem = ffi.new("char[]", 1024)
    ffi.buffer(mem)[:] = b"\xab" * 1024
    disk.write_from(0, ffi.buffer(mem))
    back = ffi.new("char[]", 1024)
    disk.read_into(0, ffi.buffer(back))
    assert ffi.buffer(back)[:] == b"\xab" * 1024


def test_read_into_loops_on_short_reads(disk: BlockDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.preadv
    calls = []

    def short_preadv(fd: int, buffers: list[Any], offset: int) -> int:
        calls.append(offset)
        return real(fd, [memoryview(buffers[0])[:100]], offset)

    monkeypatch.setattr(os, "preadv", short_preadv)
    buf = bytearray(1024)
    disk.read_into(512, buf)
    assert buf == bytes(i % 251 for i in range(512, 1536))
    assert calls == list(range(512, 1536, 100))


def test_write_from_loops_on_short_writes(
    disk: BlockDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.pwritev
    calls = []

    def short_pwritev(fd: int, buffers: list[Any], offset: int) -> int:
        calls.append(offset)
        return real(fd, [memoryview(buffers[0])[:300]], offset)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    data = os.urandom(1024)
    disk.write_from(1024, data)
    assert Path(disk.path).read_bytes()[1024:2048] == data
    assert calls == [1024, 1324, 1624, 1924]


def test_read_into_raises_oserror_when_file_shrank(disk: BlockDevice) -> None:
    os.truncate(disk.path, 512)
    with pytest.raises(OSError):
        disk.read_into(0, bytearray(1024))


def test_io_outside_capacity_is_refused_and_never_grows_the_file(disk: BlockDevice) -> None:
    with pytest.raises(ValueError, match="block device 'storage'"):
        disk.write_from(disk.capacity, bytearray(512))
    with pytest.raises(ValueError):
        disk.read_into(100, bytearray(512))
    assert os.path.getsize(disk.path) == disk.capacity


# -- closing ---------------------------------------------------------------


def test_close_is_idempotent_and_io_after_close_raises_oserror(tmp_path: Path) -> None:
    dev = BlockDevice.open("storage", str(make_image(tmp_path, 512)))
    dev.close()
    dev.close()
    assert dev.closed
    with pytest.raises(OSError):
        dev.read_into(0, bytearray(512))


def test_context_manager_closes_the_file(tmp_path: Path) -> None:
    with BlockDevice.open("storage", str(make_image(tmp_path, 512))) as dev:
        fd = dev.fileno()
        os.fstat(fd)
    assert dev.closed
    with pytest.raises(OSError):
        os.fstat(fd)


def test_block_device_node_is_a_disk_too(loop_device) -> None:
    """As solo5-hvt: a loop or LVM volume works; its size comes from seeking."""
    device, image = loop_device
    with BlockDevice.open("storage", device, 4096) as disk:
        assert disk.capacity == 1 << 20
        disk.write_from(8192, b"\x5a" * 4096)
        back = bytearray(4096)
        disk.read_into(8192, back)
        assert bytes(back) == b"\x5a" * 4096
    os.sync()
    assert image.read_bytes()[8192 : 8192 + 4096] == b"\x5a" * 4096
