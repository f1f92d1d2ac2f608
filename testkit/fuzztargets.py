"""Fuzz targets: every parser of untrusted input, driven with raw bytes.

Each target takes one ``bytes`` and must end either cleanly or with the
exception its layer promises (``LoaderError`` for a file, ``PyvmmError``
for a command line, ``GuestFault`` or ``Halt`` for a hypercall); anything
else (an IndexError, a struct.error, a crash of the cffi extension) is a
bug. ``tests/unit/test_fuzz.py`` runs them under hypothesis (bounded, in
CI) and ``bench/fuzz.py`` under atheris (coverage-guided, long runs); a
crash either finds goes to ``tests/fuzz_regressions/`` as a file the suite
replays.
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile

from pyvmm._native import ffi, lib
from pyvmm.errors import GuestFault, LoaderError, PyvmmError

TARGETS = ("elf", "manifest", "cli", "hypercall", "http")


# -- files --------------------------------------------------------------------------


def elf(data: bytes) -> str:
    """The loader's whole file path short of guest memory."""
    from pyvmm.loader import load_kernel, page_protections  # noqa: F401
    from pyvmm.loader.elf import parse_elf
    from pyvmm.loader.manifest import Manifest
    from pyvmm.loader.notes import read_abi, read_capabilities

    try:
        image = parse_elf(data, "fuzz.hvt")
        for legacy in (False, True):
            try:
                read_abi(image, legacy=legacy)
            except LoaderError:
                pass
        try:
            read_capabilities(image)
        except LoaderError:
            pass
        _guest_copy(Manifest.from_image(image))
    except LoaderError:
        return "refused"
    return "accepted"


def _guest_copy(parsed) -> None:
    """The copy the guest gets: with nothing attached, a declared device is
    the user's mistake (UsageError), never anything else."""
    try:
        parsed.guest_copy({})
    except PyvmmError:
        assert parsed.devices()


def manifest(data: bytes) -> str:
    from pyvmm.loader.manifest import Manifest

    try:
        parsed = Manifest.parse(data, "fuzz.hvt")
    except LoaderError:
        return "refused"
    _guest_copy(parsed)
    for entry in parsed.devices():
        assert parsed.by_name(entry.name) is not None
    return "accepted"


def cli(data: bytes) -> str:
    """argv as NUL-separated strings (as the kernel hands them over)."""
    from pyvmm.cli import parse_args

    argv = [a.decode("utf-8", "surrogateescape") for a in data.split(b"\0")] if data else []
    try:
        parse_args(argv)
    except PyvmmError:
        return "refused"
    return "accepted"


# -- hypercalls ----------------------------------------------------------------------

MEM_SIZE = 4 << 20
_rig = None


class _Rig:
    """Guest memory, a block image, a net device over a socketpair (the
    'tap'), and every hypercall table, built once per process."""

    def __init__(self) -> None:
        from pyvmm.devices.block.backend import BlockDevice
        from pyvmm.devices.console import Console
        from pyvmm.devices.net.device import NetDevice
        from pyvmm.devices.net.tap import TapBackend
        from pyvmm.hvt.hypercalls import Hypercalls
        from pyvmm.memory import GuestMemory, Protection

        self.memory = GuestMemory(MEM_SIZE)
        # A read-only range as the loader would leave one.
        self.memory.protect(0x100000, 0x2000, Protection(read=True, write=False, execute=True))
        self.tmp = tempfile.TemporaryDirectory()
        path = os.path.join(self.tmp.name, "disk.img")
        with open(path, "wb") as f:
            f.write(bytes(64 * 1024))
        self.disk = BlockDevice.open("storage", path, handle=1, lock=False)
        self.host_end, guest_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        guest_end.setblocking(False)
        self.host_end.setblocking(False)
        tap = TapBackend(guest_end.detach(), "fuzz0", 1500)
        self.net = NetDevice("service0", 0, tap, b"\x02\x00\x00\x00\x00\x02")
        self.stop_fd = os.eventfd(1, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # poll never waits
        self.null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        from pyvmm.devices import kinds

        by_type = {k.type.name: k for k in kinds()}
        attached = [(by_type["NET"], self.net), (by_type["BLOCK"], self.disk)]
        self.calls = Hypercalls(self.memory, Console(self.null), attached, self.stop_fd)
        self.numbers = sorted(self.calls.table)


def _get_rig() -> _Rig:
    global _rig
    if _rig is None:
        _rig = _Rig()
    return _rig


def hypercall(data: bytes) -> str:
    """data: number selector (1 byte), GPA (8), where to copy the rest (4),
    a frame for the 'tap' (1 byte length class), then guest memory bytes.

    The argument struct gets the bytes as they fall, so every field (handle,
    pointer, length, offset, timeout) takes random and edge values."""
    from pyvmm.hvt.hypercalls import Halt

    rig = _get_rig()
    if len(data) < 14:
        return "short"
    number = rig.numbers[data[0] % len(rig.numbers)]
    (gpa,) = struct.unpack_from("<Q", data, 1)
    (at,) = struct.unpack_from("<I", data, 9)
    frame_len = data[13] * 8
    body = data[14:]
    # Half the time a GPA that lands in memory, near the interesting places.
    if gpa & 1:
        gpa = (gpa >> 1) % MEM_SIZE
    at %= MEM_SIZE
    room = min(len(body), MEM_SIZE - at)
    if room and not (at < 0x102000 and at + room > 0x100000):  # not the read-only range
        ffi.memmove(ffi.cast("uint8_t *", rig.memory.host_addr + at), body[:room], room)
    if frame_len:
        try:
            rig.host_end.send(bytes(frame_len))
        except OSError:
            pass
    outcome = "answered"
    try:
        rig.calls.table[number](gpa)
    except GuestFault:
        outcome = "guest fault"
    except Halt:
        outcome = "halt"
    # Whatever the guest did, the host's side is intact.
    assert rig.memory.view.size == MEM_SIZE
    while True:
        try:
            rig.host_end.recv(65536)
        except OSError:
            break
    return outcome


# -- the launcher's API socket -------------------------------------------------------


def http(data: bytes) -> str:
    """A request as a client of ``pyvmm serve`` sends it: the first byte
    says where the bytes are cut into the pieces the launcher reads (so a
    head or body split anywhere is read as one in a piece); then its route
    and its body's JSON. Only ``HttpError`` may refuse it, with a status
    the launcher knows and a body of the usual fields."""
    from pyvmm.serve import http as wire
    from pyvmm.serve.routes import route

    if not data:
        return "short"
    step, data = data[0] * 97 + 1, data[1:]
    reader = wire.RequestReader()
    try:
        request = None
        for at in range(0, max(len(data), 1), step):
            request = reader.feed(data[at : at + step])
            if request is not None:
                break
        if request is None:
            # Waiting for more, within the limits.
            assert reader.head is not None or len(reader.buffer) < wire.MAX_HEAD
            return "incomplete"
        assert len(request.body) == int(request.headers.get("content-length", "0"))
        assert len(request.body) <= wire.MAX_BODY
        route(request.method, request.path)
        body = request.json()
        assert isinstance(body, dict) and wire.nesting_ok(body)
    except wire.HttpError as err:
        assert err.status in wire.REASONS and 400 <= err.status < 600, err.status
        status, answer = wire.parse_response(wire.response(err.status, err.body()))
        assert status == err.status and answer == err.body() and "\n" not in answer["error"]
        return "refused"
    return "accepted"


def run(target: str, data: bytes) -> str:
    return globals()[target](data)


__all__ = ["TARGETS", "cli", "elf", "http", "hypercall", "lib", "manifest", "run"]
