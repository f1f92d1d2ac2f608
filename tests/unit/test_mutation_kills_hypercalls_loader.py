"""Edges that the mutation run found untested in the hypercall handlers,
the guest-memory accessor's Python side and the loader: a poll that times
out with nothing ready, the stop eventfd in the fast path's poll set, a tap
error on net_write and net_read, addresses at 2**64, an ELF file that is
only its identification bytes, the largest MTU the manifest holds."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def _net_calls(memory, handles):
    """Hypercalls with a net device per handle, each tap a socketpair's
    end: yields them and the host's end of each, by handle."""
    import socket

    from pyvmm.devices import kinds
    from pyvmm.devices.net.device import NetDevice
    from pyvmm.devices.net.tap import TapBackend

    with contextlib.ExitStack() as stack:
        net_kind = next(k for k in kinds() if k.type.name == "NET")
        hosts, devices = {}, []
        for h in handles:
            host, guest = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            stack.callback(host.close)
            stack.callback(guest.close)
            guest.setblocking(False)  # as a tap's descriptor is
            tap = TapBackend(os.dup(guest.fileno()), f"t{h}", 1500)
            device = NetDevice(f"n{h}", h, tap, b"\2" * 6)
            stack.callback(device.close)
            hosts[h], devices = host, [*devices, device]
        stop_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        stack.callback(os.close, stop_fd)
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        stack.callback(os.close, null)
        yield Hypercalls(memory, Console(null), [(net_kind, d) for d in devices], stop_fd), hosts


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
    with _net_calls(memory, [1]) as (calls, hosts):
        arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
        arg.timeout_nsecs = 0
        calls.poll(ARG)
        assert memory.struct("struct hvt_hc_poll", ARG, what="test").ready_set == 0
        hosts[1].send(b"x" * 60)  # a frame waits: the tap's fd is readable
        calls.poll(ARG)
        arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
        assert (arg.ret, arg.ready_set) == (lib.HVT_RET_OK, 1 << 1)


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


def test_net_write_takes_a_frame_of_exactly_the_largest_size(memory):
    """max_frame bytes are a frame; one more is EINVAL."""

    class _Tap:
        max_frame = 1514
        frames: list[bytes] = []

        def write(self, frame) -> None:
            self.frames.append(bytes(frame))

    tap = _Tap()
    net = NetHypercalls(memory, {0: tap})
    for length, ret in ((1514, lib.HVT_RET_OK), (1515, lib.HVT_RET_EINVAL)):
        arg = memory.struct("struct hvt_hc_net_write", ARG, what="test")
        arg.handle, arg.data, arg.len, arg.ret = 0, ARG + 0x1000, length, -1
        net.table()[lib.HVT_HYPERCALL_NET_WRITE](ARG)
        assert memory.struct("struct hvt_hc_net_write", ARG, what="test").ret == ret, length
    assert [len(f) for f in tap.frames] == [1514]


def test_a_poll_interrupted_by_a_signal_is_no_guest_fault(memory, calls):
    """A signal ends the wait with EINTR: the run loop looks at it (a stop
    signal), and the guest's poll answers OK with nothing ready."""
    import signal
    import time

    old = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
        arg.timeout_nsecs, arg.ready_set, arg.ret = 10 * 10**9, 0xFF, -1
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        start = time.monotonic()
        calls.poll(ARG)
        assert time.monotonic() - start < 5  # the signal ended it, not the timeout
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
    assert (arg.ret, arg.ready_set) == (lib.HVT_RET_OK, 0)


def test_a_file_of_exactly_the_size_limit_is_not_refused_for_its_size(tmp_path):
    """The limit is the largest size taken (mapped here, so nothing is read)."""
    from pyvmm.loader.kernel import MAX_FILE_SIZE, _read_image

    edge = tmp_path / "edge.hvt"
    with open(edge, "wb") as f:
        f.truncate(MAX_FILE_SIZE)  # sparse
    data, _, lease = _read_image(str(edge), mapped=True)
    try:
        assert isinstance(data, memoryview) and len(data) == MAX_FILE_SIZE
    finally:
        if isinstance(data, memoryview):
            data.release()
        if lease is not None:
            lease.release()


def test_guest_memory_holds_an_entry_point_on_a_2_mib_boundary(tmp_path):
    """The entry's own byte must fit: an entry at 4 MiB needs 6 MiB."""
    from elfbuild import good_elf

    from pyvmm.loader.kernel import load_kernel

    path = tmp_path / "app.hvt"
    path.write_bytes(good_elf(entry=4 * MIB).build())
    kernel = load_kernel(str(path), "x86_64")
    assert kernel.min_mem_size == 6 * MIB
    kernel.check_fits(kernel.min_mem_size)
    with pytest.raises(LoaderError, match="needs at least 6 MiB of guest memory, --mem gives 4"):
        kernel.check_fits(4 * MIB)


def test_a_kind_answering_a_number_past_solo5s_makes_it_a_hypercall_slot(memory):
    """The table's numbers past Solo5's reach the transport (and leave it
    with the table's next build)."""
    from testkit.devkind import registered

    n = lib.HVT_HYPERCALL_PYVMM_TEST
    stop_fd = os.eventfd(0, os.EFD_CLOEXEC)
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        with registered():  # its kind answers n in every table built meanwhile
            Hypercalls(memory, Console(null), [], stop_fd)
            assert lib.pyvmm_hypercall_pio_slot(4, 1, 0x500 + n) == n
        Hypercalls(memory, Console(null), [], stop_fd)
        assert lib.pyvmm_hypercall_pio_slot(4, 1, 0x500 + n) == -1
    finally:
        lib.pyvmm_hypercall_set_extra(0)
        os.close(null)
        os.close(stop_fd)


def test_a_poll_with_nothing_ready_waits_its_timeout(memory, calls):
    """The clamp keeps a timeout a timeout (a negative one would not wait)."""
    import time

    arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
    arg.timeout_nsecs, arg.ret = 50_000_000, -1
    start = time.monotonic()
    calls.poll(ARG)
    assert time.monotonic() - start >= 0.05
    assert memory.struct("struct hvt_hc_poll", ARG, what="test").ret == lib.HVT_RET_OK


def test_poll_reports_the_last_handle_from_the_ready_masks_second_word(memory):
    """64 devices and the stop eventfd: the 64th device's fd is bit 64 of
    the poll set, in the mask's second word, and handle 63 for the guest."""
    with _net_calls(memory, range(64)) as (calls, hosts):
        for handle in (63, 62):
            hosts[handle].send(b"x" * 60)
            arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
            arg.timeout_nsecs = 0
            calls.poll(ARG)
            assert memory.struct("struct hvt_hc_poll", ARG, what="test").ready_set == (
                1 << 63 | (1 << 62 if handle == 62 else 0)
            ), handle


def test_elf_notes_may_hold_exactly_the_limit_and_the_refusal_says_it_in_kib():
    """The limit counts every note's name and descriptor bytes from 0."""
    import struct

    from elfbuild import NoteSpec, abi_note, devices, good_elf, manifest_desc, manifest_note

    from pyvmm.loader.elf import MAX_NOTE_BYTES

    fixed = [abi_note(), manifest_note(manifest_desc(devices((b"service", 1))))]
    used = sum(sum(struct.unpack_from("<II", n.encode())) for n in fixed)
    filler = MAX_NOTE_BYTES - used - len(b"X\0")
    fits = good_elf(notes=[*fixed, NoteSpec(b"X", 1, bytes(filler))]).build()
    assert parse_elf(fits, "edge").notes
    over = good_elf(notes=[*fixed, NoteSpec(b"X", 1, bytes(filler + 1))]).build()
    with pytest.raises(LoaderError, match=r"ELF notes too large \(more than 1024 KiB\)$"):
        parse_elf(over, "edge")


def test_page_adjacent_segments_of_different_rights_get_no_empty_range_between(tmp_path):
    from elfbuild import PF_R, PF_W, PF_X, Seg, good_elf

    from pyvmm.loader.kernel import load_kernel, page_protections

    base = 0x100000
    path = tmp_path / "app.hvt"
    segments = [Seg(base, b"t" * 0x1000, PF_R | PF_X), Seg(base + 0x1000, b"d" * 0x10, PF_R | PF_W)]
    path.write_bytes(good_elf(segments=segments).build())
    ranges = page_protections(load_kernel(str(path), "x86_64"))
    assert [(r.start, r.length, r.protection.write, r.protection.execute) for r in ranges] == [
        (base, 0x1000, False, True),
        (base + 0x1000, 0x1000, True, False),
    ]


def test_a_service_without_a_wake_eventfd_is_not_in_the_poll_set(memory):
    """Only services that can wake the guest's poll are waited for and
    looked at (Solo5's ring has none: its guest spins for commits)."""
    from pyvmm._native import ffi

    class _Quiet:
        wake_fd = -1
        owned: frozenset[int] = frozenset()
        kicks_at_exit = ffi.NULL
        poll_view = ffi.NULL

        def drain_wake(self) -> None:
            raise AssertionError("no wake eventfd to drain")

        def ready_set(self) -> int:
            raise AssertionError("not looked at")

    stop_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        calls = Hypercalls(memory, Console(null), [], stop_fd, [_Quiet()])
        assert calls.fast_path().n_poll == 1  # the stop eventfd alone
        arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
        arg.timeout_nsecs = 0
        calls.poll(ARG)
        assert memory.struct("struct hvt_hc_poll", ARG, what="test").ret == lib.HVT_RET_OK
    finally:
        os.close(null)
        os.close(stop_fd)


def test_each_segment_flag_is_its_own_bit():
    """Execute-only and write-only segments are not readable (p_flags' bits
    are PF_X 1, PF_W 2, PF_R 4)."""
    from elfbuild import PF_W, PF_X, Seg, good_elf

    base = 0x100000
    image = parse_elf(
        good_elf(
            segments=[Seg(base, b"t" * 16, PF_X), Seg(base + 0x1000, b"d" * 16, PF_W)]
        ).build(),
        "flags",
    )
    text, data = image.segments
    assert (text.readable, text.writable, text.executable) == (False, False, True)
    assert (data.readable, data.writable, data.executable) == (False, True, False)


def test_a_unikernel_without_a_capability_note_declares_nothing():
    from elfbuild import good_elf

    from pyvmm.loader.notes import read_capabilities

    caps = read_capabilities(parse_elf(good_elf().build(), "plain"))
    assert (caps.flags, caps.user_mode, caps.shmstream) == (0, False, False)


def test_a_note_descriptor_of_only_its_alignment_padding_is_refused():
    """As Solo5's elf_load_note: nothing past the padding is no descriptor."""
    from elfbuild import abi_note, good_elf, manifest_note

    from pyvmm.loader.manifest import read_manifest

    elf = good_elf(notes=[abi_note(), manifest_note(b"")])
    with pytest.raises(LoaderError, match=r"note does not fall within valid size \(Solo5 manifest"):
        read_manifest(parse_elf(elf.build(), "padded"))


class _Service:
    """An IO service as the poll hypercall sees it: a wake eventfd and the
    handles with work ready (``sets``: what each look answers, in turn)."""

    owned: frozenset[int] = frozenset()

    def __init__(self, wake_fd: int, sets: list[int]) -> None:
        from pyvmm._native import ffi

        self.wake_fd, self.sets, self.looks, self.drained = wake_fd, sets, 0, 0
        self.kicks_at_exit = self.poll_view = ffi.NULL

    def drain_wake(self) -> None:
        self.drained += 1

    def ready_set(self) -> int:
        self.looks += 1
        return self.sets.pop(0) if self.sets else 0


def _polled(memory, service, timeout_ns: int) -> tuple[int, float]:
    import time

    stop_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        calls = Hypercalls(memory, Console(null), [], stop_fd, [service])
        arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
        arg.timeout_nsecs, arg.ready_set = timeout_ns, 0
        start = time.monotonic()
        calls.poll(ARG)
        took = time.monotonic() - start
        arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
        assert arg.ret == lib.HVT_RET_OK
        return arg.ready_set, took
    finally:
        os.close(null)
        os.close(stop_fd)


def test_a_services_work_ready_before_the_wait_is_answered_at_once(memory):
    wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        service = _Service(wake, [1 << 3])
        ready, took = _polled(memory, service, 5 * 10**9)
        assert ready == 1 << 3 and took < 2.5 and service.drained == 1
    finally:
        os.close(wake)


def test_a_services_work_found_by_its_wake_up_is_answered(memory):
    """Nothing ready at the first look; the wake eventfd signalled, the look
    after the wait finds the work."""
    wake = os.eventfd(1, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        ready, took = _polled(memory, _Service(wake, [0, 1 << 5]), 5 * 10**9)
        assert ready == 1 << 5 and took < 2.5
    finally:
        os.close(wake)


def test_a_service_whose_wake_eventfd_is_fd_0_is_waited_for(memory):
    """A launcher started with stdin closed hands out fd 0 too."""
    wake = os.eventfd(1, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    saved = os.dup(0)
    try:
        os.dup2(wake, 0)
        ready, took = _polled(memory, _Service(0, [0, 1 << 2]), 5 * 10**9)
        assert ready == 1 << 2 and took < 2.5
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(wake)


def test_a_failed_wait_is_a_guest_fault_naming_its_errno(memory):
    """ppoll refuses more fds than RLIMIT_NOFILE allows (EINVAL): in a
    forked child, whose limit is lowered under a 65-fd poll set."""
    import resource

    with _net_calls(memory, range(64)) as (calls, _):
        arg = memory.struct("struct hvt_hc_poll", ARG, what="test")
        arg.timeout_nsecs = 0
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            said = "no fault"
            try:
                hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
                resource.setrlimit(resource.RLIMIT_NOFILE, (16, hard))
                calls.poll(ARG)
            except GuestFault as err:
                said = str(err)
            finally:
                os.write(write, said.encode())
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            said = pipe.read().decode()
        os.waitpid(pid, 0)
    assert said == "poll hypercall: wait failed: Invalid argument"


def test_an_attached_devices_hypercalls_reach_it_through_its_own_kind(memory):
    """The table's net_write goes to the net device attached (a device is
    its own kind's, not another's)."""
    with _net_calls(memory, [0]) as (calls, hosts):
        memory.write(ARG + 0x1000, b"f" * 60)
        arg = memory.struct("struct hvt_hc_net_write", ARG, what="test")
        arg.handle, arg.data, arg.len, arg.ret = 0, ARG + 0x1000, 60, -1
        calls.table[lib.HVT_HYPERCALL_NET_WRITE](ARG)
        assert memory.struct("struct hvt_hc_net_write", ARG, what="test").ret == lib.HVT_RET_OK
        assert hosts[0].recv(100) == b"f" * 60


def test_program_header_counts_of_pn_xnum_and_one_less_are_refused_each_in_its_words():
    from elfbuild import good_elf

    with pytest.raises(LoaderError, match=r"too many program headers \(PN_XNUM is not supported\)"):
        parse_elf(good_elf(phnum=0xFFFF).build(), "x")
    with pytest.raises(LoaderError) as err:
        parse_elf(good_elf(phnum=0xFFFE).build(), "x")
    assert "PN_XNUM" not in str(err.value)


def test_a_core_dumps_header_says_et_core_and_its_memory_rwx():
    import struct

    from pyvmm.loader.elf import EHDR, PHDR, PT_LOAD
    from pyvmm.vm.debug.core import headers

    data = headers(0x1000, b"")
    assert struct.unpack_from("<H", data, 16) == (4,)  # e_type ET_CORE, ELF's value
    loads = [
        PHDR.unpack_from(data, EHDR.size + i * PHDR.size)
        for i in range(2)
        if PHDR.unpack_from(data, EHDR.size + i * PHDR.size)[0] == PT_LOAD
    ]
    assert [p[1] for p in loads] == [7]  # PF_R | PF_W | PF_X


def test_two_segments_in_one_page_get_one_range_with_both_rights(tmp_path):
    from elfbuild import PF_R, PF_W, PF_X, Seg, good_elf

    from pyvmm.loader.kernel import load_kernel, page_protections

    base = 0x100000
    path = tmp_path / "app.hvt"
    segments = [Seg(base, b"t" * 0x100, PF_R | PF_X), Seg(base + 0x800, b"d" * 0x10, PF_R | PF_W)]
    path.write_bytes(good_elf(segments=segments).build())
    ranges = page_protections(load_kernel(str(path), "x86_64"))
    assert [(r.start, r.length, r.protection.write, r.protection.execute) for r in ranges] == [
        (base, 0x1000, True, True)
    ]


def test_an_abi_version_1_image_is_refused_unless_legacy_is_asked_for():
    from elfbuild import abi_note, devices, good_elf, manifest_desc, manifest_note

    from pyvmm.loader.notes import read_abi

    notes = [abi_note(version=1), manifest_note(manifest_desc(devices((b"service", 1))))]
    image = parse_elf(good_elf(notes=notes).build(), "old")
    with pytest.raises(LoaderError, match="unsupported ABI version 1"):
        read_abi(image)
    assert read_abi(image, legacy=True).version == 1


@pytest.mark.parametrize(
    "e_type, name",
    [
        (0, "ET_NONE \\(no file type\\)"),
        (1, "ET_REL \\(an object file\\)"),
        (4, "ET_CORE \\(a core dump\\)"),
    ],
)
def test_each_elf_type_is_named_in_the_refusal(e_type, name):
    from elfbuild import good_elf

    with pytest.raises(LoaderError, match=f"ELF type is {name}, need ET_EXEC"):
        parse_elf(good_elf(e_type=e_type).build(), "typed")


@pytest.mark.parametrize("entry, need", [(4 * MIB - 1, 4 * MIB), (4 * MIB, 6 * MIB)])
def test_the_memory_an_entry_needs_holds_its_byte_and_no_more(tmp_path, entry, need):
    from elfbuild import good_elf

    from pyvmm.loader.kernel import load_kernel

    path = tmp_path / "app.hvt"
    path.write_bytes(good_elf(entry=entry).build())
    assert load_kernel(str(path), "x86_64").min_mem_size == need


def test_page_regions_are_start_end_and_rights(tmp_path):
    """[start, end) ranges, as the page tables take them."""
    from elfbuild import good_elf

    from pyvmm.loader.kernel import load_kernel, page_regions

    path = tmp_path / "app.hvt"
    path.write_bytes(good_elf().build())
    regions = page_regions(load_kernel(str(path), "x86_64"))
    base = 0x100000
    assert [(lo, hi, p.write, p.execute) for lo, hi, p in regions] == [
        (base, base + 0x2000, False, True),
        (base + 0x2000, base + 0x3000, False, False),
        (base + 0x3000, base + 0x5000, True, False),
    ]


def test_a_file_read_whole_is_bytes(tmp_path):
    from elfbuild import good_elf

    from pyvmm.loader.kernel import _read_file

    path = tmp_path / "app.hvt"
    data = good_elf().build()
    path.write_bytes(data)
    path.chmod(0o755)
    got = _read_file(str(path))
    assert type(got) is bytes and got == data


def test_a_file_of_just_the_elf_magic_is_a_truncated_elf():
    with pytest.raises(LoaderError, match="truncated ELF"):
        parse_elf(b"\x7fELF", "magic")
    with pytest.raises(LoaderError, match="not an ELF file"):
        parse_elf(b"\x7fEL", "short")


def _kernel_with(tmp_path, segments, entry):
    from elfbuild import good_elf

    from pyvmm.loader.kernel import load_kernel

    path = tmp_path / "app.hvt"
    path.write_bytes(good_elf(segments=segments, entry=entry).build())
    return load_kernel(str(path), "x86_64")


def test_an_entry_point_at_4_gib_is_outside_guest_memory(tmp_path):
    from elfbuild import PF_R, PF_X, Seg

    kernel = _kernel_with(tmp_path, [Seg(0x100000, b"t" * 16, PF_R | PF_X)], 4 << 30)
    with pytest.raises(LoaderError, match=r"entry point 0x100000000 is outside"):
        kernel.check_fits(4 << 30)


def test_a_segment_ending_at_4_gib_fits_4_gib_of_memory(tmp_path):
    """It ends at the limit, not beyond it: only more --mem would hold it."""
    from elfbuild import PF_R, PF_X, Seg

    top = (4 << 30) - 0x1000
    kernel = _kernel_with(tmp_path, [Seg(top, b"t" * 0x1000, PF_R | PF_X)], top)
    kernel.check_fits(4 << 30)
    with pytest.raises(LoaderError, match="needs at least 4096 MiB of guest memory"):
        kernel.check_fits(2 << 20)


@pytest.mark.parametrize("end", [1 << 63, 1 << 64])
def test_a_segment_may_end_anywhere_up_to_the_end_of_the_address_space(end):
    """Only one that wraps past 2**64 is refused by the parser (the memory
    check refuses what lies past 4 GiB)."""
    from elfbuild import PF_R, PF_X, Seg, good_elf

    seg = Seg(end - 0x1000, b"t" * 16, PF_R | PF_X, memsz=0x1000)
    image = parse_elf(good_elf(segments=[seg], entry=end - 0x1000).build(), "high")
    assert image.segments[0].end == end
    wrap = Seg(end - 0x1000, b"t" * 16, PF_R | PF_X, memsz=0x1001)
    if end == 1 << 64:
        with pytest.raises(LoaderError, match="wraps around the end of the address space"):
            parse_elf(good_elf(segments=[wrap], entry=0x100000).build(), "wrap")


def test_at_most_256_notes_are_read():
    from elfbuild import NoteSpec, good_elf

    from pyvmm.loader.elf import MAX_NOTES

    assert MAX_NOTES == 256
    fits = [NoteSpec(b"X", 1, b"")] * 256
    assert len(parse_elf(good_elf(notes=fits, notes_in_one_segment=True).build(), "n").notes) == 256
    with pytest.raises(LoaderError, match="too many ELF notes"):
        parse_elf(good_elf(notes=[*fits, fits[0]], notes_in_one_segment=True).build(), "n")


def test_a_note_with_an_empty_owner_is_skipped_to_the_next_one():
    """namesz 1 (the NUL alone) pads to 4 bytes: the ABI note after it is
    found where it is."""
    from elfbuild import NoteSpec, abi_note, devices, good_elf, manifest_desc, manifest_note

    from pyvmm.loader.notes import read_abi

    notes = [NoteSpec(b"", 5, b"abcd"), abi_note(), manifest_note(manifest_desc(devices()))]
    image = parse_elf(good_elf(notes=notes, notes_in_one_segment=True).build(), "empty owner")
    assert image.notes[0].name == b"" and image.notes[0].desc == b"abcd"
    assert read_abi(image).version == 2


def test_a_note_that_is_only_its_header_is_read():
    """namesz 0, descsz 0: 12 bytes, the last of its segment, still a note."""
    import struct

    from elfbuild import NoteSpec, abi_note, devices, good_elf, manifest_desc, manifest_note

    class _HeaderOnly(NoteSpec):
        def encode(self) -> bytes:
            return struct.pack("<III", 0, 0, self.type)

    notes = [abi_note(), manifest_note(manifest_desc(devices())), _HeaderOnly(b"", 9, b"")]
    image = parse_elf(good_elf(notes=notes, notes_in_one_segment=True).build(), "header only")
    assert [(n.name, n.type, n.desc) for n in image.notes][-1] == (b"", 9, b"")


def test_program_headers_ending_at_the_files_last_byte_are_read():
    import struct

    from elfbuild import good_elf

    from pyvmm.loader.elf import EHDR, PHDR

    data = bytearray(good_elf().build())
    phnum = struct.unpack_from("<H", data, 56)[0]
    table = bytes(data[EHDR.size : EHDR.size + phnum * PHDR.size])
    struct.pack_into("<Q", data, 32, len(data))  # e_phoff: the copy at the end
    image = parse_elf(bytes(data) + table, "headers last")
    assert len(image.segments) == 3
    with pytest.raises(LoaderError, match="truncated ELF"):
        parse_elf(bytes(data) + table[:-1], "one byte short")


def test_a_file_of_just_the_elf_header_reads_past_it_for_its_program_headers():
    from elfbuild import good_elf

    from pyvmm.loader.elf import EHDR

    with pytest.raises(LoaderError) as err:
        parse_elf(good_elf().build()[: EHDR.size], "header only")
    assert "file header is" not in str(err.value) and "program header" in str(err.value)
    with pytest.raises(LoaderError, match="file header is 63 bytes, need 64"):
        parse_elf(good_elf().build()[: EHDR.size - 1], "short")
