"""The C fast path (csrc/hcfast.c) answered directly, on a real KVM vCPU.

A few real-mode instructions write each hypercall's argument address to its
port (`out dx, eax`, as a Solo5 guest does) and halt; the vCPU runs through
pyvmm_vcpu_run_fast with a struct pyvmm_fastpath filled in by the test. So
each test sees exactly what the fast path promises: which requests it
answers itself (the run goes on to the HLT) and which it hands to Python
(the run stops at the port write), the result fields it stores and the
counters it keeps. The guest tests reach the same code, but only through
whole guests, whose requests never sit at the edges these tests pick (the
last block of a disk, the 64th poll handle, a handle with no device).
"""

from __future__ import annotations

import errno
import faulthandler
import os
import signal
import socket
import struct
import time

import pytest

from pyvmm._native import ffi, lib
from pyvmm.arch.x86_64 import cpu
from pyvmm.hvt import fastpath
from pyvmm.kvm import exits
from pyvmm.kvm.memory import GuestMemory
from pyvmm.kvm.system import System

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/kvm"), reason="needs /dev/kvm")

CODE = 0x1000  # the guest's instructions (real mode, CS base 0)
ARG = 0x200000  # argument structs, above the low area
DATA = 0x300000  # buffers
BLOCK = 512
BLOCKS = 8


def _call(nr: int, gpa: int) -> bytes:
    """mov eax, gpa; mov dx, port; out dx, eax (16-bit code, 32-bit operands)."""
    port = lib.HVT_HYPERCALL_PIO_BASE + nr
    return b"\x66\xb8" + struct.pack("<I", gpa) + b"\xba" + struct.pack("<H", port) + b"\x66\xef"


class Rig:
    """One VM, its memory and a fast-path struct the test fills in."""

    def __init__(self, size: int = 4 << 20) -> None:
        self.mem = GuestMemory(size)
        self.fp = fastpath.build(self.mem, [], [])
        for h in range(lib.MFT_MAX_ENTRIES):
            self.fp.net_fd[h] = -1
            self.fp.blk_fd[h] = -1
        self.fp.n_poll = 0

    def struct(self, ctype: str, gpa: int = ARG, **fields):
        arg = ffi.cast(f"struct {ctype} *", self.mem.host_addr + gpa)
        ffi.memmove(arg, b"\0" * ffi.sizeof(f"struct {ctype}"), ffi.sizeof(f"struct {ctype}"))
        for name, value in fields.items():
            setattr(arg, name, value)
        return arg

    def poke(self, gpa: int, data: bytes) -> None:
        ffi.memmove(ffi.cast("char *", self.mem.host_addr + gpa), data, len(data))

    def peek(self, gpa: int, length: int) -> bytes:
        return bytes(ffi.buffer(ffi.cast("char *", self.mem.host_addr + gpa), length))

    def run(self, *calls: tuple[int, int], code: bytes | None = None):
        """Run the calls (or the instructions ``code``), then HLT: the exit
        pyvmm_vcpu_run_fast returned."""
        if code is None:
            code = b"".join(_call(nr, gpa) for nr, gpa in calls)
        self.poke(CODE, code + b"\xf4")
        with System() as system, system.create_vm() as vm:
            vm.set_memory(0, 0, self.mem.size, self.mem.host_addr)
            vcpu = vm.create_vcpu(0)
            try:
                sregs = cpu.get_sregs(vcpu)
                sregs.cs.base = sregs.cs.selector = 0
                cpu.set_sregs(vcpu, sregs)
                regs = cpu.get_regs(vcpu)
                regs.rip, regs.rflags = CODE, 2
                cpu.set_regs(vcpu, regs)
                # As a run does (Vmm.run): its own stop handlers, which also
                # clear a stop an earlier run in this process took (an
                # in-process Guest stopped by an earlier test).
                assert lib.pyvmm_signals_install(-1, vcpu.run_area) == 0
                try:
                    return vcpu.run(fast_path=self.fp)
                finally:
                    lib.pyvmm_signals_restore()
            finally:
                vcpu.close()

    def close(self) -> None:
        self.mem.close()


def to_python(exit, nr: int) -> bool:
    """Whether the run stopped at hypercall ``nr``'s port write (Python's)."""
    return isinstance(exit, exits.IoOut) and exit.port == lib.HVT_HYPERCALL_PIO_BASE + nr


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


def test_an_answered_call_runs_on_to_the_next_exit(rig):
    wall = rig.struct("hvt_hc_walltime")
    exit = rig.run((lib.HVT_HYPERCALL_WALLTIME, ARG), (lib.HVT_HYPERCALL_WALLTIME, ARG))
    assert isinstance(exit, exits.Hlt), exit
    assert (rig.fp.answered, rig.fp.walltimes) == (2, 2)
    assert abs(wall.nsecs - time.time_ns()) < 60 * 10**9


# --- block -----------------------------------------------------------------------------


@pytest.fixture
def disk(rig, tmp_path):
    path = tmp_path / "disk"
    path.write_bytes(b"".join(bytes([i + 1]) * BLOCK for i in range(BLOCKS)))
    fd = os.open(path, os.O_RDWR)
    rig.fp.blk_fd[3] = fd
    rig.fp.blk_capacity[3] = BLOCKS * BLOCK
    rig.fp.blk_block_size[3] = BLOCK
    yield fd
    os.close(fd)


READ, WRITE = lib.HVT_HYPERCALL_BLOCK_READ, lib.HVT_HYPERCALL_BLOCK_WRITE


@pytest.mark.parametrize("offset,length", [((BLOCKS - 1) * BLOCK, BLOCK), (0, BLOCKS * BLOCK)])
@pytest.mark.parametrize("stale_errno", [0, errno.EINTR])
def test_a_read_up_to_the_disks_last_byte_is_answered_in_c(rig, disk, offset, length, stale_errno):
    """Also with errno left at EINTR by an earlier call (cffi hands
    ffi.errno to the next C call): a read that succeeded is no retry."""
    ffi.errno = stale_errno
    arg = rig.struct("hvt_hc_block_read", handle=3, offset=offset, data=DATA, len=length, ret=-9)
    assert isinstance(rig.run((READ, ARG)), exits.Hlt)
    assert arg.ret == lib.HVT_RET_OK
    assert rig.fp.block_reads == 1 and rig.fp.block_writes == 0
    assert rig.peek(DATA, length) == os.pread(disk, length, offset)


def test_a_write_of_the_last_block_is_answered_in_c(rig, disk):
    rig.poke(DATA, b"\xee" * BLOCK)
    offset = (BLOCKS - 1) * BLOCK
    arg = rig.struct("hvt_hc_block_write", handle=3, offset=offset, data=DATA, len=BLOCK, ret=-9)
    assert isinstance(rig.run((WRITE, ARG)), exits.Hlt)
    assert arg.ret == lib.HVT_RET_OK
    assert rig.fp.block_writes == 1 and rig.fp.block_reads == 0
    assert os.pread(disk, BLOCK, offset) == b"\xee" * BLOCK
    assert os.pread(disk, BLOCK, offset - BLOCK) == bytes([BLOCKS - 1]) * BLOCK


@pytest.mark.parametrize(
    "handle,offset,length",
    [
        (3, (BLOCKS - 1) * BLOCK, 2 * BLOCK),  # past the end by one block
        (3, BLOCKS * BLOCK, BLOCK),  # starts at the end
        (3, (BLOCKS + 1) * BLOCK, 0),  # starts past the end
        (3, 2**64 - BLOCK, 2 * BLOCK),  # wraps around
        (3, 1, BLOCK),  # unaligned offset
        (3, 0, BLOCK + 1),  # partial block
        (3, 0, 0),  # nothing
        (2, 0, BLOCK),  # no disk at this handle
        (64, 0, BLOCK),  # past the manifest's handles
    ],
)
def test_a_request_that_is_not_whole_blocks_inside_the_disk_goes_to_python(
    rig, disk, handle, offset, length
):
    arg = rig.struct("hvt_hc_block_read", handle=handle, offset=offset, data=DATA, len=length)
    arg.ret = -9
    assert to_python(rig.run((READ, ARG)), READ)
    assert arg.ret == -9 and rig.fp.block_reads == 0 and rig.fp.answered == 0


def test_a_disk_without_a_block_size_goes_to_python(rig, disk):
    rig.fp.blk_block_size[3] = 0
    rig.struct("hvt_hc_block_read", handle=3, offset=0, data=DATA, len=BLOCK)
    assert to_python(rig.run((READ, ARG)), READ)


def test_a_read_into_the_low_area_goes_to_python(rig, disk):
    rig.struct("hvt_hc_block_read", handle=3, offset=0, data=CODE, len=BLOCK)
    assert to_python(rig.run((READ, ARG)), READ)
    assert rig.peek(CODE, 2) == b"\x66\xb8"


@pytest.mark.parametrize("stale_errno", [0, errno.EINTR])
def test_a_file_that_shrank_is_eunspec(rig, disk, stale_errno):
    """The end of the file (pread answers 0) ends the request, also when
    errno still says EINTR from an earlier call (cffi hands ffi.errno to
    the next C call): only a failed call's EINTR is a retry."""
    os.ftruncate(disk, 2 * BLOCK)
    ffi.errno = stale_errno
    arg = rig.struct("hvt_hc_block_read", handle=3, offset=4 * BLOCK, data=DATA, len=BLOCK)
    assert isinstance(rig.run((READ, ARG)), exits.Hlt)
    assert arg.ret == lib.HVT_RET_EUNSPEC and rig.fp.block_reads == 1


@pytest.mark.parametrize("nr,mode", [(READ, os.O_WRONLY), (WRITE, os.O_RDONLY)])
def test_a_disk_that_refuses_the_io_is_eunspec(rig, disk, tmp_path, nr, mode):
    fd = os.open(tmp_path / "disk", mode)
    try:
        rig.fp.blk_fd[3] = fd
        arg = rig.struct("hvt_hc_block_read", handle=3, offset=0, data=DATA, len=BLOCK, ret=-9)
        assert isinstance(rig.run((nr, ARG)), exits.Hlt)
        assert arg.ret == lib.HVT_RET_EUNSPEC
    finally:
        os.close(fd)


def test_a_handle_past_the_table_goes_to_python_whatever_the_struct_holds(rig, disk):
    """Handle 64 is one past the arrays: nothing after them is read as its
    disk, even when the fields there would pass for one (the next array's
    first entries, the poll set's count, as laid out in the struct)."""
    rig.fp.blk_capacity[0] = 3
    rig.fp.n_poll = BLOCK
    rig.fp.blk_block_size[0] = rig.fp.blk_block_size[1] = BLOCKS * BLOCK
    rig.struct("hvt_hc_block_read", handle=64, offset=0, data=DATA, len=BLOCK)
    assert to_python(rig.run((READ, ARG)), READ)
    rig.fp.n_poll = 0


# --- net -------------------------------------------------------------------------------

NREAD, NWRITE = lib.HVT_HYPERCALL_NET_READ, lib.HVT_HYPERCALL_NET_WRITE
MAX_FRAME = 1514


@pytest.fixture
def tap(rig):
    """A datagram socket pair standing in for a tap: one frame per read."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    theirs.setblocking(False)
    rig.fp.net_fd[5] = theirs.fileno()
    rig.fp.max_frame[5] = MAX_FRAME
    yield ours
    ours.close()
    theirs.close()


def test_a_frame_is_read_whole_and_an_empty_tap_is_again(rig, tap):
    tap.send(b"\xab" * 60)
    first = rig.struct("hvt_hc_net_read", handle=5, data=DATA, len=MAX_FRAME, ret=-9)
    second = rig.struct("hvt_hc_net_read", ARG + 64, handle=5, data=DATA, len=MAX_FRAME, ret=-9)
    assert isinstance(rig.run((NREAD, ARG), (NREAD, ARG + 64)), exits.Hlt)
    assert (first.ret, first.len) == (lib.HVT_RET_OK, 60)
    assert rig.peek(DATA, 61) == b"\xab" * 60 + b"\0"
    assert (second.ret, second.len) == (lib.HVT_RET_AGAIN, MAX_FRAME)
    assert (rig.fp.net_reads, rig.fp.net_reads_again, rig.fp.rx_dropped) == (1, 1, 0)


def test_a_frame_longer_than_the_buffer_is_dropped_not_cut(rig, tap):
    tap.send(b"\x01" * 101)
    tap.send(b"\x02" * 100)
    arg = rig.struct("hvt_hc_net_read", handle=5, data=DATA, len=100, ret=-9)
    assert isinstance(rig.run((NREAD, ARG)), exits.Hlt)
    assert (arg.ret, arg.len) == (lib.HVT_RET_OK, 100)
    assert rig.peek(DATA, 100) == b"\x02" * 100
    assert (rig.fp.net_reads, rig.fp.rx_dropped) == (1, 1)


@pytest.mark.parametrize("nr", [NREAD, NWRITE])
@pytest.mark.parametrize("handle", [4, 64])
def test_a_handle_without_a_tap_goes_to_python(rig, tap, nr, handle):
    rig.struct("hvt_hc_net_read", handle=handle, data=DATA, len=60)
    assert to_python(rig.run((nr, ARG)), nr)


def test_a_frame_of_the_largest_size_is_written_and_one_byte_more_goes_to_python(rig, tap):
    rig.poke(DATA, bytes(range(256)) * 6)
    arg = rig.struct("hvt_hc_net_write", handle=5, data=DATA, len=MAX_FRAME, ret=-9)
    assert isinstance(rig.run((NWRITE, ARG)), exits.Hlt)
    assert arg.ret == lib.HVT_RET_OK and rig.fp.net_writes == 1
    assert tap.recv(4096) == (bytes(range(256)) * 6)[:MAX_FRAME]
    arg.len = MAX_FRAME + 1
    assert to_python(rig.run((NWRITE, ARG)), NWRITE)
    assert rig.fp.net_writes == 1


@pytest.mark.parametrize("nr", [NREAD, NWRITE])
def test_a_tap_that_fails_is_eunspec(rig, tmp_path, nr):
    """A read or write that fails for another reason than a full or down
    tap (here a directory's descriptor: EISDIR, EBADF) is EUNSPEC."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        rig.fp.net_fd[5], rig.fp.max_frame[5] = fd, MAX_FRAME
        arg = rig.struct("hvt_hc_net_read", handle=5, data=DATA, len=60, ret=-9)
        assert isinstance(rig.run((nr, ARG)), exits.Hlt)
        assert arg.ret == lib.HVT_RET_EUNSPEC
    finally:
        os.close(fd)


def test_a_runt_is_dropped_and_counted(rig, tap):
    tap.setblocking(False)
    arg = rig.struct("hvt_hc_net_write", handle=5, data=DATA, len=lib.HVT_ETH_HLEN - 1, ret=-9)
    assert isinstance(rig.run((NWRITE, ARG)), exits.Hlt)
    assert arg.ret == lib.HVT_RET_OK
    assert (rig.fp.net_writes, rig.fp.tx_dropped) == (0, 1)
    with pytest.raises(BlockingIOError):
        tap.recv(4096)


# --- poll ------------------------------------------------------------------------------

POLL = lib.HVT_HYPERCALL_POLL


@pytest.fixture
def fds():
    made: list[int] = []
    yield lambda n: made.extend(os.eventfd(0, os.EFD_NONBLOCK) for _ in range(n)) or made
    for fd in made:
        os.close(fd)


def set_poll(rig, entries: list[tuple[int, int]]) -> None:
    rig.fp.n_poll = len(entries)
    for i, (fd, handle) in enumerate(entries):
        rig.fp.poll_fd[i], rig.fp.poll_handle[i] = fd, handle


@pytest.mark.parametrize("readable", [[0], [1], [0, 1], []])
def test_poll_reports_exactly_the_readable_handles(rig, fds, readable):
    stop, a, b = fds(3)
    set_poll(rig, [(stop, -1), (a, 0), (b, 1)])
    for h in readable:
        os.eventfd_write((a, b)[h], 1)
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=0, ready_set=0xFFFF, ret=-9)
    assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    assert arg.ret == lib.HVT_RET_OK
    assert arg.ready_set == sum(1 << h for h in readable)
    assert rig.fp.polls == 1


def test_poll_reports_the_handles_past_the_first_mask_word(rig, fds):
    """The stop eventfd and 64 taps: the last two taps' fds are the 64th
    and 65th of the wait, in the mask's second word."""
    made = fds(lib.MFT_MAX_ENTRIES + 1)
    set_poll(rig, [(made[0], -1)] + [(fd, h) for h, fd in enumerate(made[1:])])
    for fd in made[-3:]:
        os.eventfd_write(fd, 1)
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=0)
    assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    assert arg.ready_set == 0b111 << 61


def test_a_readable_stop_eventfd_is_no_handle(rig, fds):
    stop, a = fds(2)
    set_poll(rig, [(stop, -1), (a, 0)])
    os.eventfd_write(stop, 1)
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=0, ready_set=0xFFFF, ret=-9)
    assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    assert (arg.ret, arg.ready_set) == (lib.HVT_RET_OK, 0)


def test_a_set_larger_than_the_struct_is_cut_to_it(rig, fds):
    """n_poll past the arrays: the wait takes the first PYVMM_FAST_MAX_POLL."""
    made = fds(lib.PYVMM_FAST_MAX_POLL)
    taps = [(fd, h) for h, fd in enumerate(made[1 : lib.MFT_MAX_ENTRIES + 1])]
    set_poll(rig, [(made[0], -1)] + taps + [(made[-1], -1)])
    rig.fp.n_poll = 1000
    os.eventfd_write(taps[-1][0], 1)
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=0)
    assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    assert arg.ready_set == 1 << 63


def test_a_signal_in_the_wait_returns_to_python_with_the_answer(rig, fds):
    """A signal that ends the poll's wait (here SIGALRM, whose handler is
    Python's) comes back as Interrupted, the poll answered, so Python runs
    its handler now rather than at the guest's next exit."""
    (stop,) = fds(1)
    set_poll(rig, [(stop, -1)])
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=20 * 10**9, ready_set=0xFF, ret=-9)
    seen = []
    old = signal.signal(signal.SIGALRM, lambda *_: seen.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        exit = rig.run((POLL, ARG))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert isinstance(exit, exits.Interrupted), exit
    assert (arg.ret, arg.ready_set, rig.fp.polls) == (lib.HVT_RET_OK, 0, 1)
    assert seen == [1]


def test_a_wait_as_long_as_the_idle_mark_is_remembered(rig, fds):
    """poll_idle: whether the last wait blocked POLL_IDLE_NS (200 us) or more,
    which the next poll reads to skip the shmstream moderation."""
    (stop,) = fds(1)
    set_poll(rig, [(stop, -1)])
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=300_000)
    assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    assert rig.fp.poll_idle == 1 and arg.ret == lib.HVT_RET_OK
    arg.timeout_nsecs = 0
    assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    assert rig.fp.poll_idle == 0


@pytest.fixture
def shm(rig, fds):
    """A shmstream poll view: an IO thread's wake-up and one RX ring (handle 7)."""
    from testkit.iorig import IoRig

    io = IoRig(wake=True)
    ring = ffi.new("char[]", 4096)
    view = ffi.new("struct pyvmm_shm_poll *")
    view.io, view.wake_fd, view.n = io.io, io.wake, 1
    view.rx[0] = ffi.cast("struct shm_ring *", ring)
    view.handle[0] = 7
    rig.fp.shm = view
    (stop,) = fds(1)
    set_poll(rig, [(stop, -1), (io.wake, -1)])
    yield view.rx[0]
    rig.fp.shm = ffi.NULL
    io.close()


@pytest.mark.parametrize("timeout", [0, 60_000, 1_000_000])
def test_a_moderated_poll_with_a_region_answers_and_runs_on(rig, shm, timeout):
    """With a region the fast path sleeps the moderation window after a wait
    (a timeout of 50 us or more): that sleep is no signal, so the run goes on
    to the HLT instead of returning to Python as interrupted."""
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=timeout, ready_set=0xFF, ret=-9)
    assert isinstance(rig.run((POLL, ARG), (POLL, ARG)), exits.Hlt)
    assert (arg.ret, arg.ready_set, rig.fp.polls) == (lib.HVT_RET_OK, 0, 2)


def test_a_ring_with_frames_is_ready_without_a_wait(rig, shm):
    """A frame already in a ring answers at once: the wait's timeout becomes
    0, so it does not block the idle mark's 200 us (it would, at 300 us)."""
    shm.prod = 3
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=300_000)
    assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    assert arg.ready_set == 1 << 7
    assert rig.fp.poll_idle == 0


def test_a_stale_wake_up_is_cleared_before_the_wait(rig, shm):
    """A wake-up left from frames the guest has read since: drained before
    the look, so the poll waits its timeout (the idle mark is set) instead
    of returning at once with nothing ready."""
    wake = rig.fp.poll_fd[1]
    os.eventfd_write(wake, 1)
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=300_000, ready_set=0xFF)
    assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    assert arg.ready_set == 0 and rig.fp.poll_idle == 1
    with pytest.raises(BlockingIOError):
        os.eventfd_read(wake)


def test_a_frame_published_during_the_wait_is_reported(rig, shm):
    """The IO thread publishes while the vCPU waits and signals the wake
    eventfd, which ends the wait: the rings are looked at again after it."""
    import threading

    wake = rig.fp.poll_fd[1]

    def publish() -> None:
        time.sleep(0.1)  # the vCPU in its wait by then
        shm.prod = 1
        os.eventfd_write(wake, 1)

    publisher = threading.Thread(target=publish)
    publisher.start()
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=20 * 10**9, ready_set=0)
    try:
        assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    finally:
        publisher.join()
    assert arg.ready_set == 1 << 7


def test_the_last_entry_of_the_largest_set_reports_its_handle(rig, fds):
    """Entry 65 (the second mask word's bit 1) of a set of
    PYVMM_FAST_MAX_POLL: its own bit, not entry 64's."""
    made = fds(lib.PYVMM_FAST_MAX_POLL)
    taps = [(fd, h) for h, fd in enumerate(made[1 : lib.MFT_MAX_ENTRIES + 1])]
    set_poll(rig, [(made[0], -1)] + taps + [(made[-1], 5)])
    os.eventfd_write(made[-1], 1)
    arg = rig.struct("hvt_hc_poll", timeout_nsecs=0)
    assert isinstance(rig.run((POLL, ARG)), exits.Hlt)
    assert arg.ready_set == 1 << 5


def test_a_buffer_of_the_largest_length_is_answered_in_c(tmp_path):
    """net_read's length is a uint64_t the fast path takes up to UINT32_MAX
    (tap_io_read's size): with 5 GiB of guest memory (mapped, not touched)
    a buffer that long is answered here, one byte more goes to Python."""
    rig = Rig(5 << 30)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        theirs.setblocking(False)
        rig.fp.net_fd[5] = theirs.fileno()
        ours.send(b"\xcd" * 60)
        arg = rig.struct("hvt_hc_net_read", handle=5, data=DATA, len=2**32 - 1, ret=-9)
        assert isinstance(rig.run((NREAD, ARG)), exits.Hlt)
        assert (arg.ret, arg.len) == (lib.HVT_RET_OK, 60)
        arg.len = 2**32
        assert to_python(rig.run((NREAD, ARG)), NREAD)
    finally:
        ours.close()
        theirs.close()
        rig.close()


def test_no_guard_is_in_force_after_answers_or_a_guarded_copy(rig, disk):
    """Each answer leaves the guard it entered: after runs the fast path
    answered (and a guarded copy from Python), this thread has none in
    force, so no later SIGBUS can jump back into a finished answer."""
    assert lib.pyvmm_guard_in_force() == 0
    rig.struct("hvt_hc_walltime")
    assert isinstance(rig.run((lib.HVT_HYPERCALL_WALLTIME, ARG)), exits.Hlt)
    assert lib.pyvmm_guard_in_force() == 0
    blk = rig.struct("hvt_hc_block_read", handle=3, offset=0, data=DATA, len=BLOCK, ret=-9)
    assert isinstance(rig.run((READ, ARG)), exits.Hlt) and blk.ret == lib.HVT_RET_OK
    assert lib.pyvmm_guard_in_force() == 0
    rig.mem.write(DATA, b"guarded")
    assert rig.mem.read(DATA, 7) == b"guarded"
    assert lib.pyvmm_guard_in_force() == 0


def test_the_answers_guard_is_gone_once_the_run_returns(tmp_path):
    """Every answer is under a guard (guard.h) that must be left when the
    answer is done: a SIGBUS on guest memory after the run, outside any
    guard, is then the ordinary SIGBUS (the process dies of it) and never a
    jump back into a finished answer. Run in a child, which dies."""
    image = tmp_path / "image"
    image.write_bytes(b"\x5a" * 4096)
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        try:
            # The SIGBUS is expected: faulthandler's dump of it (which then
            # dies of it) goes nowhere. Disabling faulthandler instead would
            # put back the handler it found, which is not the guard's; an
            # enable while enabled only moves its output (pytest's own
            # faulthandler writes to a copy of stderr, not to fd 2).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            faulthandler.enable(file=os.fdopen(devnull, "w"))
            rig = Rig()
            fd = os.open(image, os.O_RDONLY)
            assert rig.mem.map_file(DATA, 4096, fd, 0) == 0
            rig.struct("hvt_hc_walltime")
            assert isinstance(rig.run((lib.HVT_HYPERCALL_WALLTIME, ARG)), exits.Hlt)
            os.truncate(image, 0)
            rig.peek(DATA, 1)  # the page is gone: SIGBUS, unguarded
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGBUS, status


def _out(port: int, value: int) -> bytes:
    """mov eax, value; mov dx, port; out dx, eax: a doorbell's write."""
    return b"\x66\xb8" + struct.pack("<I", value) + b"\xba" + struct.pack("<H", port) + b"\x66\xef"


def _kick_run(rig: Rig, port: int = lib.HVT_RING_KICK_PIO):
    """A guest that writes one doorbell, then halts."""
    return rig.run(code=_out(port, 0))


@pytest.fixture
def ring():
    from testkit.iorig import Solo5Rig

    made = Solo5Rig(size=64 * 1024, kick=True)
    yield made
    made.close()


def test_without_a_ring_served_here_a_kick_goes_to_python(rig):
    exit = _kick_run(rig)
    assert isinstance(exit, exits.IoOut) and exit.port == lib.HVT_RING_KICK_PIO, exit
    assert rig.fp.answered == 0


def test_a_kick_of_the_ring_served_here_is_answered_and_the_run_goes_on(rig, ring):
    rig.fp.ring_io = ring.io
    ring.peer.send(b"k" * 64)
    ring.submit(lib.SOLO5_RING_OP_READ, 0x1000, 2048, 9)
    assert isinstance(_kick_run(rig), exits.Hlt)
    assert rig.fp.answered == 1
    assert ring.counters.kicks_inline == 1 and ring.commit(0) == (9, lib.HVT_RET_OK, 64)


def test_a_kick_handed_to_the_io_thread_is_answered_too(rig, ring):
    """The IO thread holds the ring: the kick goes to it through the kick
    eventfd, and the guest resumes at once (Python has nothing to add)."""
    from testkit.native import lib as kit

    rig.fp.ring_io = ring.io
    kit.io_test_solo5_hold(ring.io, 1)
    try:
        assert isinstance(_kick_run(rig), exits.Hlt)
    finally:
        kit.io_test_solo5_hold(ring.io, 0)
    assert rig.fp.answered == 1
    assert ring.counters.kicks_passed == 1 and ring.counters.kicks_inline == 0
    assert int.from_bytes(os.read(ring.kick, 8), "little") == 1


def test_another_doorbell_is_no_kick_of_the_ring(rig, ring):
    rig.fp.ring_io = ring.io
    exit = _kick_run(rig, lib.SHM_KICK_PIO)
    assert isinstance(exit, exits.IoOut) and exit.port == lib.SHM_KICK_PIO, exit
    assert ring.counters.kicks_inline == 0
