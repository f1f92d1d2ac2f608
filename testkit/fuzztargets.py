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
from pyvmm.common.errors import GuestFault, LoaderError, PyvmmError

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
    from pyvmm.command.cli import parse_args

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
        from pyvmm.kvm.memory import GuestMemory, Protection

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
        assert data.index(b"\r\n\r\n") + 4 <= wire.MAX_HEAD  # however it arrived
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


# -- a container's bundle and an image's annotations ---------------------------------

_GUESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "guests", "bin")
_oci_rig = None


class _OciRig:
    """A bundle whose rootfs holds two unikernels, a disk image, links out
    of it (absolute, by ``..``, a loop), a FIFO and a device node; beside
    it a "host" directory with a secret file the image must never reach
    and a disk file an operator could bind-mount. Built once per process."""

    def __init__(self) -> None:
        import shutil
        import stat

        self.tmp = tempfile.TemporaryDirectory(prefix="pyvmm-fuzz-oci-")
        self.bundle = os.path.join(self.tmp.name, "bundle")
        self.rootfs = os.path.join(self.bundle, "rootfs")
        self.host = os.path.join(self.tmp.name, "host")
        os.makedirs(os.path.join(self.rootfs, "unikernel"))
        os.makedirs(self.host)
        for name in ("blocktest", "ping"):
            src = os.path.join(_GUESTS, f"{name}.hvt")
            if os.path.exists(src):
                shutil.copy(src, os.path.join(self.rootfs, "unikernel", f"{name}.hvt"))
        if os.path.exists(os.path.join(self.rootfs, "unikernel", "blocktest.hvt")):
            os.symlink("blocktest.hvt", os.path.join(self.rootfs, "unikernel", "kernel.hvt"))
        self.secret = os.path.join(self.host, "secret.img")
        for path in (os.path.join(self.rootfs, "disk.img"), os.path.join(self.host, "disk.img")):
            with open(path, "wb") as f:
                f.write(bytes(4096))
        with open(self.secret, "wb") as f:
            f.write(b"s" * 4096)
        links = {
            "escape": self.secret,
            "up": "../" * 8 + self.secret.lstrip("/"),
            "dir": "/unikernel",
            "loop": "loop",
            "proc": "/proc/self/root" + self.secret,
        }
        for name, target in links.items():
            os.symlink(target, os.path.join(self.rootfs, name))
        os.mkfifo(os.path.join(self.rootfs, "fifo"))
        if os.geteuid() == 0:
            os.mknod(os.path.join(self.rootfs, "null"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
        self.inside = self._inodes(self.rootfs)
        self.operator = self._inodes(self.host) - {self._inode(self.secret)}

    @staticmethod
    def _inode(path: str) -> tuple[int, int]:
        st = os.stat(path)
        return st.st_dev, st.st_ino

    def _inodes(self, top: str) -> set[tuple[int, int]]:
        found = set()
        for where, _, files in os.walk(top):
            for name in files:
                st = os.lstat(os.path.join(where, name))
                found.add((st.st_dev, st.st_ino))
        return found

    def write(self, name: str, data: bytes | None) -> None:
        path = os.path.join(self.rootfs if name != "config.json" else self.bundle, name)
        if data is None:
            if os.path.lexists(path):
                os.unlink(path)
            return
        with open(path, "wb") as f:
            f.write(data)


def _get_oci_rig() -> _OciRig:
    global _oci_rig
    if _oci_rig is None:
        _oci_rig = _OciRig()
    return _oci_rig


def _operator_inputs(rig: _OciRig, config: bytes) -> bytes:
    """What the runtime's caller decides, kept on the rig: the rootfs path
    and bind mounts' sources are the operator's to choose (pyvmm-oci opens
    them as given), so a fuzzed one is pointed back at the rig's rootfs or
    its "host" directory. Everything the image decides is left as fuzzed."""
    import json

    try:
        spec = json.loads(config)
    except (ValueError, RecursionError):
        return config
    if not isinstance(spec, dict):
        return config
    if isinstance(spec.get("root"), dict) and spec["root"].get("path") not in (None, "rootfs"):
        spec["root"]["path"] = "rootfs"
    for mount in spec.get("mounts") if isinstance(spec.get("mounts"), list) else []:
        if isinstance(mount, dict) and isinstance(mount.get("source"), str):
            if not mount["source"].startswith("/proc") and mount["source"] != "tmpfs":
                mount["source"] = os.path.join(rig.host, "disk.img")
    return json.dumps(spec).encode()


NET_VALUES = {
    "ifname": "eth0",
    "mac": "02:00:00:00:00:01",
    "ip": "10.88.0.2",
    "prefix": "24",
    "gateway": "10.88.0.1",
    "mtu": "1500",
    "cidr": "10.88.0.2/24",
    "netmask": "255.255.255.0",
}


def oci(data: bytes) -> str:
    """data: NUL-separated config.json, /pyvmm-oci.json, /urunc.json (a
    part empty or left out: no such file in the image) and a net-args
    template.

    Only BundleError may refuse, in one line; what is accepted holds
    descriptors of files of the rootfs (or of an operator's mount) and
    never of the host's secret, pyvmm's argv carries no image path, the
    template fills in under its cap, and no descriptor is left open."""
    from pyvmm.oci import netargs
    from pyvmm.oci.bundle import BundleError, net_args, read_bundle
    from pyvmm.oci.runtime import pyvmm_argv

    rig = _get_oci_rig()
    parts = data.split(b"\0", 3)
    rig.write("config.json", _operator_inputs(rig, parts[0]))
    rig.write("pyvmm-oci.json", parts[1] if len(parts) > 1 and parts[1] else None)
    rig.write("urunc.json", parts[2] if len(parts) > 2 and parts[2] else None)
    template = parts[3].decode("utf-8", "surrogateescape") if len(parts) > 3 else None
    before = sorted(os.listdir("/proc/self/fd"))
    outcome = "accepted"
    try:
        with read_bundle(rig.bundle) as kernel:
            held = {(st.st_dev, st.st_ino) for st in map(os.fstat, kernel.fds())}
            assert rig._inode(rig.secret) not in held
            assert (os.fstat(kernel.fd).st_dev, os.fstat(kernel.fd).st_ino) in rig.inside
            for block in kernel.blocks.values():
                st = os.fstat(block.fd)
                assert (st.st_dev, st.st_ino) in rig.inside | rig.operator, block
            tap = "pvtap0" if kernel.net_devices else None
            argv = pyvmm_argv(kernel, tap, NET_VALUES["mac"] if tap else None)
            assert all(isinstance(a, str) and "\0" not in a for a in argv)
            assert not any(rig.tmp.name in a for a in argv), argv
            if kernel.net_template is not None:
                words = netargs.fill(kernel.net_template, NET_VALUES)
                assert sum(map(len, words)) <= netargs.WORDS_MAX
    except BundleError as err:
        assert "\n" not in str(err) and len(str(err)) < 1000, str(err)
        outcome = "refused"
    except netargs.TemplateError as err:
        assert "\n" not in str(err)  # the filled-in words over their cap
        outcome = "refused"
    if template is not None:
        try:
            words = net_args(template, NET_VALUES)
            assert all(isinstance(w, str) for w in words)
        except BundleError as err:
            assert "\n" not in str(err) and len(str(err)) < 1000, str(err)
    assert sorted(os.listdir("/proc/self/fd")) == before
    return outcome


def oci_seeds() -> list[bytes]:
    """Bundles as containerd writes them and images as pyvmm-oci pack does."""
    import json

    def spec(**extra) -> bytes:
        base = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": []}}
        return json.dumps({**base, **extra}).encode()

    block = "org.pyvmm.unikernel.block.storage"
    notes = json.dumps(
        {"org.pyvmm.unikernel.binary": "/unikernel/blocktest.hvt", block: "/disk.img"}
    ).encode()
    net = {"linux": {"namespaces": [{"type": "network", "path": "/var/run/netns/pod"}]}}
    return [
        spec(),
        spec(process={"args": ["/unikernel/kernel.hvt", "7", "x"]}),
        spec(linux={"resources": {"memory": {"limit": 64 << 20}}}) + b"\0" + notes,
        spec(annotations={block: "/escape"}) + b"\0" + notes,
        spec(mounts=[{"destination": "/data", "type": "bind", "source": "/srv/disk.img"}])
        + b"\0"
        + json.dumps({block: "/data"}).encode(),
        spec(**net)
        + b"\0"
        + json.dumps(
            {
                "org.pyvmm.unikernel.binary": "/unikernel/ping.hvt",
                "org.pyvmm.unikernel.net-args": "--ipv4={cidr} --ipv4-gateway={gateway}",
            }
        ).encode(),
        spec() + b"\0\0" + b'{"com.urunc.unikernel.binary": "L3VuaWtlcm5lbC9ibG9ja3Rlc3QuaHZ0"}',
        spec() + b"\0{}\0{}\0{ip} '{mac}' {{x}}",
    ]


TARGETS = (*TARGETS, "oci")
__all__ = [*__all__, "oci", "oci_seeds"]
