"""Edges that the mutation run found untested in the hypercall handlers,
the guest-memory accessor's Python side and the loader: a poll that times
out with nothing ready, the stop eventfd in the fast path's poll set, a tap
error on net_write and net_read, addresses at 2**64, an ELF file that is
only its identification bytes, the largest MTU the manifest holds."""

from __future__ import annotations

import os

import pytest

from pyvmm._native import lib
from pyvmm.common.errors import GuestFault, LoaderError
from pyvmm.devices.console import Console
from pyvmm.devices.net.hypercalls import NetHypercalls
from pyvmm.hvt.hypercalls import Hypercalls
from pyvmm.kvm.memory import GuestMemory
from pyvmm.loader.elf import parse_elf
from pyvmm.loader.manifest import NetAttachment

MIB = 1 << 20
ARG = 0x100000  # a hypercall's argument struct, above the low area


@pytest.fixture
def memory():
    with GuestMemory(4 * MIB) as mem:
        yield mem


@pytest.fixture
def calls(memory):
    stop_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # not signalled
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        yield Hypercalls(memory, Console(null), [], stop_fd)
    finally:
        os.close(null)
        os.close(stop_fd)


def test_a_poll_that_times_out_with_nothing_ready_answers_ok_and_no_fault(memory, calls):
    arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
    arg.timeout_nsecs = 0
    arg.ready_set = 0xFF
    arg.ret = -1
    calls.poll(ARG)  # pyvmm_poll_until returns 0: a timeout, not a failure
    arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
    assert (arg.ret, arg.ready_set) == (lib.HVT_RET_OK, 0)


def test_the_stop_eventfd_is_no_device_in_the_fast_paths_poll_set(calls):
    fp = calls.fast_path()
    assert fp.n_poll == 1
    assert fp.poll_fd[0] == calls.stop_fd
    # A handle >= 0 would report the stop signal to the guest as that device.
    assert fp.poll_handle[0] == -1


class _BrokenTap:
    max_frame = 1514

    def write(self, frame) -> None:
        raise OSError(5, "Input/output error")

    def read_into(self, buf) -> int:
        raise OSError(5, "Input/output error")


def test_a_tap_error_is_eunspec_for_net_write_and_net_read(memory):
    net = NetHypercalls(memory, {0: _BrokenTap()})
    data = ARG + 0x1000
    for name, number in (("net_write", lib.HVT_HYPERCALL_NET_WRITE), ("net_read", None)):
        arg = memory.struct(f"struct hvt_hc_{name}", ARG, what="test")
        arg.handle, arg.data, arg.len, arg.ret = 0, data, 64, -1
        net.table()[number or lib.HVT_HYPERCALL_NET_READ](ARG)
        arg = memory.struct(f"struct hvt_hc_{name}", ARG, what="test")
        assert arg.ret == lib.HVT_RET_EUNSPEC, name


@pytest.mark.parametrize(
    "gpa, length", [(1 << 64, 1), ((1 << 64) + 8, 1), (0, 1 << 64), (0, (1 << 64) + 1)]
)
def test_addresses_and_lengths_from_2_to_the_64_are_outside_guest_memory(memory, gpa, length):
    with pytest.raises(GuestFault, match="is outside guest memory"):
        memory.check(gpa, length)


def test_an_elf_file_of_only_its_16_identification_bytes_is_named_by_its_class():
    ident = b"\x7fELF" + bytes([1, 1, 1]) + bytes(9)  # ELFCLASS32, 16 bytes in all
    with pytest.raises(LoaderError, match="32-bit ELF file, need ELF64"):
        parse_elf(ident, "tiny")
    with pytest.raises(LoaderError, match="truncated ELF"):
        parse_elf(ident[:15], "tiny")


def test_the_manifest_holds_an_mtu_up_to_65535_and_no_more():
    mac = b"\x02\x00\x00\x00\x00\x01"
    assert NetAttachment(mac, 0xFFFF).mtu == 0xFFFF
    assert NetAttachment(mac, 1).mtu == 1
    for bad in (0, 0x10000):
        with pytest.raises(ValueError, match="does not fit the manifest's u16"):
            NetAttachment(mac, bad)


def test_net_read_into_read_only_memory_is_a_guest_fault(memory):
    from pyvmm.kvm.memory import Protection

    memory.protect(0x200000, 0x1000, Protection(read=True, write=False, execute=True))

    class _Tap:
        max_frame = 1514

        def read_into(self, buf) -> int:
            buf[:4] = b"\x01\x02\x03\x04"
            return 4

    net = NetHypercalls(memory, {0: _Tap()})
    arg = memory.struct("struct hvt_hc_net_read", ARG, what="test")
    arg.handle, arg.data, arg.len = 0, 0x200000, 64
    with pytest.raises(GuestFault, match="read-only memory"):
        net.table()[lib.HVT_HYPERCALL_NET_READ](ARG)
    assert memory.read(0x200000, 4) == bytes(4)


def test_poll_reports_a_ready_tap_by_its_handle(memory):
    import socket

    from pyvmm.devices import kinds
    from pyvmm.devices.net.device import NetDevice
    from pyvmm.devices.net.tap import TapBackend

    host_end, guest_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stop_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        guest_end.setblocking(False)
        nets = [
            NetDevice(
                f"net{h}", h, TapBackend(os.dup(guest_end.fileno()), f"t{h}", 1500), b"\2" * 6
            )
            for h in (1,)
        ]
        net_kind = next(k for k in kinds() if k.type.name == "NET")
        calls = Hypercalls(memory, Console(null), [(net_kind, n) for n in nets], stop_fd)
        arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
        arg.timeout_nsecs = 0
        calls.poll(ARG)
        assert memory.struct("struct hvt_hc_poll", ARG, what="test").ready_set == 0
        host_end.send(b"x" * 60)  # a frame waits: the tap's fd is readable
        calls.poll(ARG)
        arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
        assert (arg.ret, arg.ready_set) == (lib.HVT_RET_OK, 1 << 1)
    finally:
        os.close(null)
        os.close(stop_fd)
        host_end.close()
        guest_end.close()


def test_validated_manifest_records_cannot_be_changed_afterwards():
    """An MTU or an entry changed after its checks ran would skip them."""
    from pyvmm.loader import manifest
    from pyvmm.loader.manifest import DeviceType

    made = (
        manifest.ManifestEntry(1, "net0", DeviceType.NET),
        manifest.NetAttachment(b"\x02\x00\x00\x00\x00\x01", 1500),
        manifest.BlockAttachment(1 << 20, 512),
        manifest.Manifest(()),
    )
    for record in made:
        name = type(record).__slots__[0]
        with pytest.raises(AttributeError, match="cannot assign"):
            setattr(record, name, 0x10000)
        with pytest.raises(AttributeError, match="cannot delete"):
            delattr(record, name)
    attachment = NetAttachment(b"\x02\x00\x00\x00\x00\x01", 1500)
    with pytest.raises(AttributeError):
        attachment.mtu = 0x10000
    assert attachment.mtu == 1500


@pytest.mark.parametrize("past_end, missing", [(8, 0), (-56 - 8, 1)])
def test_a_program_header_table_past_the_end_names_the_first_missing_header(past_end, missing):
    from pathlib import Path

    data = bytearray((Path(__file__).resolve().parents[2] / "guests/bin/hello.hvt").read_bytes())
    data[0x20:0x28] = (len(data) + past_end).to_bytes(8, "little")  # e_phoff
    with pytest.raises(LoaderError, match=rf"program header {missing} past end of file"):
        parse_elf(bytes(data), "cut")


def test_a_manifest_name_is_shown_with_the_backslash_escaped_and_nothing_printable_else():
    from pyvmm.loader.manifest import _shown

    assert _shown(b"a\\b[c]~") == "a\\x5cb[c]~"
    assert _shown(b"\x1f\x7f ") == "\\x1f\\x7f "


def test_the_manifest_holds_a_block_size_up_to_65535_and_no_more():
    from pyvmm.loader.manifest import BlockAttachment

    assert BlockAttachment(0, 0xFFFF).block_size == 0xFFFF
    for bad in (0, 0x10000):
        with pytest.raises(ValueError, match="does not fit the manifest's u16"):
            BlockAttachment(0, bad)


def test_a_poll_timeout_past_int64_is_clamped_not_an_overflow(memory):
    stop_fd = os.eventfd(1, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # ready: no wait
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        calls = Hypercalls(memory, Console(null), [], stop_fd)
        for timeout in ((1 << 63) - 1, 1 << 63, (1 << 64) - 1):
            arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
            arg.timeout_nsecs, arg.ret = timeout, -1
            calls.poll(ARG)
            assert memory.struct("struct hvt_hc_poll", ARG, what="test").ret == lib.HVT_RET_OK
    finally:
        os.close(null)
        os.close(stop_fd)


def test_a_file_past_the_size_limit_is_named_with_its_size_in_mib(tmp_path):
    from pyvmm.loader.kernel import MAX_FILE_SIZE, MIB, _read_file

    big = tmp_path / "big.hvt"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_SIZE + 1)  # sparse: no disk used
    with pytest.raises(LoaderError, match=rf"file is {(MAX_FILE_SIZE + 1) // MIB} MiB, too large"):
        _read_file(str(big))
