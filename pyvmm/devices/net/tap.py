"""Tap backend: the host end of a guest NIC, one Ethernet frame per read/write.

pyvmm only ever attaches to a tap that already exists (as ``solo5-hvt``
does): ``TUNSETIFF`` on a missing name would silently create a fresh,
unconfigured interface, so a typo would boot a guest on a dead link.

Every interface lookup here goes through ioctls on a socket or on the tap
fd, never through ``/sys/class/net``: sysfs shows the network namespace it
was mounted in, which is not the one a process entered with ``setns``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pyvmm._native import ffi, lib
from pyvmm.errors import DeviceError
from pyvmm.fd import OwnedFd
from pyvmm.netns import THREAD_NETNS, setns

_T = TypeVar("_T")

TUN_PATH = "/dev/net/tun"
IFNAMSIZ = 16
ETH_HLEN = lib.HVT_ETH_HLEN

# Generic Linux ioctl encoding, identical on x86_64 and aarch64.
_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction: int, kind: str, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (ord(kind) << 8) | nr


TUNSETIFF = _ioc(_IOC_WRITE, "T", 202, 4)
TUNGETIFF = _ioc(_IOC_READ, "T", 210, 4)
TUNGETDEVNETNS = _ioc(0, "T", 227, 0)  # Linux 5.2+

SIOCGIFMTU = 0x8921
SIOCGIFINDEX = 0x8933
SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x3

IFF_TUN = 0x0001
IFF_TAP = 0x0002
IFF_MULTI_QUEUE = 0x0100
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000

# rtnetlink, for the one fact no ioctl reports (see _tun_link_data).
RTM_NEWLINK = 16
RTM_GETLINK = 18
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 0x2
NLA_TYPE_MASK = 0x3FFF
IFLA_LINKINFO = 18
IFLA_INFO_DATA = 2
IFLA_TUN_PI = 4
_NLMSGHDR = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")
_RTATTR = struct.Struct("=HH")

# struct ifreq is 40 bytes on 64-bit Linux: a 16-byte name and a 24-byte union.
_IFREQ_FLAGS = struct.Struct("16sH22x")
_IFREQ_INT = struct.Struct("16si20x")
_IFREQ_PTR = struct.Struct("16sQ16x")
# struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32],
# bus_info[32], erom_version[32], reserved2[12], five u32 counters.
_DRVINFO_SIZE = 196
_DRVINFO_DRIVER = slice(4, 36)
_DRVINFO_BUS = slice(100, 132)

# A NIC drops a frame when its queue is full (EAGAIN, ENOBUFS), its link is
# down (EIO) or the frame is a runt shorter than an Ethernet header (EINVAL);
# so do we, so that no guest-supplied frame can fail the hypercall.
_DROP_ERRNOS = frozenset({errno.EAGAIN, errno.ENOBUFS, errno.EIO, errno.EINVAL})


class TapBackend(OwnedFd):
    """An attached, non-blocking tap fd (``IFF_TAP | IFF_NO_PI``) and its facts.

    ``mtu`` is read once at attach time: the guest learns it from the
    manifest at boot and cannot be told about a later change anyway.
    """

    def __init__(self, fd: int, ifname: str, mtu: int) -> None:
        self.fd = fd
        self.ifname = ifname
        self.mtu = mtu
        self.tx_dropped = 0
        self.rx_dropped = 0
        # Catches the first byte past the caller's buffer: the kernel
        # truncates a long frame silently, this makes truncation visible.
        self._overflow = bytearray(1)

    @classmethod
    def open(cls, iface: str) -> TapBackend:
        """Attach to tap ``iface``, or adopt an open tap fd given as ``"@N"``.

        With ``"@N"`` the backend owns fd N once this returns (``close()``
        closes it); if it raises, the fd is left open for the caller.
        """
        if iface.startswith("@"):
            return cls._adopt(iface)
        return cls._attach(iface)

    @classmethod
    def _attach(cls, name: str) -> TapBackend:
        def fail(cause: str) -> DeviceError:
            # solo5-hvt's words first, then what exactly is wrong.
            return DeviceError(f"Could not attach interface: {name}: tap device '{name}' {cause}")

        raw = _ifname_bytes(name)
        if raw is None:
            raise fail("is not a valid interface name")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                ifindex = _ifindex(sock, raw)
            except OSError as err:
                if err.errno == errno.ENODEV:
                    raise fail(_missing_hint(name, raw)) from None
                raise fail(f"cannot be looked up: {_reason(err)}") from None
            driver, bus = _driver_info(sock, raw)
            if driver != "tun":
                raise fail(
                    f"is not a tap device (it is a {driver} interface)"
                    if driver
                    else "is not a tap device"
                )
            if bus != "tap":
                raise fail("is a tun device, not a tap device")

            try:
                fd = os.open(TUN_PATH, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as err:
                raise fail(f"cannot be attached: cannot open {TUN_PATH}: {_reason(err)}") from None
            try:
                try:
                    fcntl.ioctl(fd, TUNSETIFF, _IFREQ_FLAGS.pack(raw, IFF_TAP | IFF_NO_PI))
                except OSError as err:
                    raise fail(_attach_failure(err)) from None
                # If the tap vanished after the lookup, TUNSETIFF made a new
                # one; closing our fd (below) deletes it again.
                try:
                    still_there = _ifindex(sock, raw) == ifindex
                except OSError:
                    still_there = False
                if not still_there:
                    raise fail("does not exist")
                # TUNSETIFF applied our IFF_NO_PI to the device, whatever it
                # was created with, and the tap is in this thread's netns.
                try:
                    mtu = _query_mtu(raw)
                except OSError as err:
                    raise fail(f"cannot be queried: {_reason(err)}") from None
            except BaseException:
                os.close(fd)
                raise
        return cls(fd, name, mtu)

    @classmethod
    def _adopt(cls, iface: str) -> TapBackend:
        def fail(cause: str) -> DeviceError:
            return DeviceError(f"Could not attach interface: {iface}: {cause}")

        text = iface[1:]
        if not text.isdecimal() or not text.isascii() or len(text) > 10 or int(text) >= 1 << 31:
            raise fail(f"'{text}' is not a file descriptor number")
        fd = int(text)
        try:
            os.fstat(fd)
        except OSError as err:
            raise fail(f"fd {fd} is not open ({_reason(err)})") from None
        try:
            raw, flags = _tun_getiff(fd)
        except OSError as err:
            if err.errno == errno.EBADFD:
                raise fail(f"fd {fd} is a {TUN_PATH} fd not attached to any interface") from None
            raise fail(f"fd {fd} is not a tap file descriptor") from None
        ifname = raw.decode(errors="replace")
        if not flags & IFF_TAP:
            raise fail(f"fd {fd} is attached to tun device '{ifname}', not a tap")
        if flags & IFF_VNET_HDR:
            raise fail(f"fd {fd} (tap '{ifname}') has IFF_VNET_HDR set")
        # The fd may come from another network namespace, where our name
        # lookup could find a different interface: ask in the tap's own.
        try:
            mtu, tun_data = _in_device_netns(fd, lambda: (_query_mtu(raw), _tun_link_data(raw)))
        except OSError as err:
            raise fail(f"cannot query tap '{ifname}': {_reason(err)}") from None
        # TUNGETIFF cannot say whether IFF_NO_PI is set (it reuses that bit
        # for IFF_NOFILTER), so ask netlink; old kernels do not tell.
        if tun_data.get(IFLA_TUN_PI, b"\0") != b"\0":
            raise fail(
                f"fd {fd} (tap '{ifname}') was opened without IFF_NO_PI "
                "(frames would carry a packet information header)"
            )
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)
        return cls(fd, ifname, mtu)

    def read_into(self, buf: Any) -> int | None:
        """Read one frame into ``buf``; its length, or None if none is waiting.

        A frame longer than ``buf`` is dropped (and counted in
        ``rx_dropped``), as a NIC drops what exceeds its buffer, rather than
        handed over cut short; pass at least ``mtu + 14`` bytes.
        """
        size = memoryview(buf).nbytes
        while True:
            try:
                n = os.readv(self.fd, [buf, self._overflow])
            except BlockingIOError:
                return None
            if n <= size:
                return n
            self.rx_dropped += 1

    def write(self, buf: Any) -> bool:
        """Send one frame; False if it was dropped (queue full, link down, runt).

        Dropping instead of raising is what a NIC does: the guest's stack
        retransmits, and a busy host never stalls the vCPU.
        """
        try:
            # writev() of nothing succeeds without reaching the tap driver.
            if memoryview(buf).nbytes < ETH_HLEN:
                raise OSError(errno.EINVAL, "runt frame")
            os.writev(self.fd, [buf])
        except OSError as err:
            if err.errno in _DROP_ERRNOS:
                self.tx_dropped += 1
                return False
            raise
        return True

    def __repr__(self) -> str:
        return f"TapBackend(fd={self.fd}, ifname={self.ifname!r}, mtu={self.mtu})"


class InvalidMacError(DeviceError, ValueError):
    """A MAC address given by the user cannot be a NIC's address."""


_MAC_RE = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}")


def parse_mac(text: str) -> bytes:
    """Parse ``"aa:bb:cc:dd:ee:ff"`` into 6 bytes fit for a guest NIC.

    Multicast (which includes broadcast) and all-zero addresses are refused:
    a guest with one would receive nothing addressed to it.
    """
    if not _MAC_RE.fullmatch(text):
        raise InvalidMacError(
            f"invalid MAC address '{text}': expected six hex pairs like 02:00:00:00:00:01"
        )
    mac = bytes.fromhex(text.replace(":", ""))
    if mac[0] & 0x01:
        raise InvalidMacError(f"invalid MAC address '{text}': it is a multicast address")
    if mac == bytes(6):
        raise InvalidMacError(f"invalid MAC address '{text}': it is all zeros")
    return mac


def random_mac() -> bytes:
    """A random unicast, locally administered MAC (cannot clash with a vendor's)."""
    mac = bytearray(os.urandom(6))
    mac[0] = (mac[0] & 0xFE) | 0x02
    return bytes(mac)


def format_mac(mac: bytes) -> str:
    """``b"\\x02\\x00..."`` -> ``"02:00:..."`` for messages and logs."""
    return ":".join(f"{b:02x}" for b in mac)


def _ifname_bytes(name: str) -> bytes | None:
    """The name as the kernel wants it, or None if the kernel would refuse it."""
    raw = name.encode(errors="surrogateescape")
    if not 0 < len(raw) < IFNAMSIZ or name in (".", ".."):
        return None
    if any(c in "/:" or c.isspace() or c == "\0" for c in name):
        return None
    return raw


def _ifindex(sock: socket.socket, raw: bytes) -> int:
    reply = fcntl.ioctl(sock, SIOCGIFINDEX, _IFREQ_INT.pack(raw, 0))
    return _IFREQ_INT.unpack(reply)[1]


def _driver_info(sock: socket.socket, raw: bytes) -> tuple[str, str]:
    """``(driver, bus_info)``: a tap reports ("tun", "tap"), a tun ("tun", "tun")."""
    info = ffi.new("uint8_t[]", _DRVINFO_SIZE)
    struct.pack_into("I", ffi.buffer(info), 0, ETHTOOL_GDRVINFO)
    address = int(ffi.cast("uintptr_t", info))
    try:
        fcntl.ioctl(sock, SIOCETHTOOL, _IFREQ_PTR.pack(raw, address))
    except OSError:
        return "", ""  # lo and a few others have no driver info: not a tap.
    data = bytes(ffi.buffer(info))

    def text(field: slice) -> str:
        return data[field].split(b"\0", 1)[0].decode(errors="replace")

    return text(_DRVINFO_DRIVER), text(_DRVINFO_BUS)


def _tun_getiff(fd: int) -> tuple[bytes, int]:
    """``(ifname, flags)`` of the interface a /dev/net/tun fd is attached to."""
    raw, flags = _IFREQ_FLAGS.unpack(fcntl.ioctl(fd, TUNGETIFF, bytes(_IFREQ_FLAGS.size)))
    return raw.split(b"\0", 1)[0], flags


def _attach_failure(err: OSError) -> str:
    if err.errno == errno.EBUSY:
        return "is already in use by another process"
    if err.errno == errno.EPERM:
        return "cannot be attached: permission denied (need CAP_NET_ADMIN or to own the tap)"
    if err.errno == errno.EINVAL:
        # Type was checked already; what is left is a multi-queue tap.
        return "cannot be attached: it is a multi-queue tap (create it without multi_queue)"
    return f"cannot be attached: {_reason(err)}"


def _query_mtu(raw: bytes) -> int:
    """SIOCGIFMTU, in the calling thread's network namespace."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        reply = fcntl.ioctl(sock, SIOCGIFMTU, _IFREQ_INT.pack(raw, 0))
    return _IFREQ_INT.unpack(reply)[1]


def _tun_link_data(raw: bytes) -> dict[int, bytes]:
    """The tun driver's netlink attributes (IFLA_TUN_*) for interface ``raw``.

    One RTM_GETLINK on NETLINK_ROUTE, in the calling thread's namespace;
    empty if the kernel does not report them.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        ifindex = _ifindex(sock, raw)
    request = _NLMSGHDR.pack(_NLMSGHDR.size + _IFINFOMSG.size, RTM_GETLINK, NLM_F_REQUEST, 1, 0)
    request += _IFINFOMSG.pack(socket.AF_UNSPEC, 0, ifindex, 0, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as nl:
        nl.send(request)
        reply = nl.recv(1 << 16)
    length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(reply)
    if kind == NLMSG_ERROR:
        code = -struct.unpack_from("i", reply, _NLMSGHDR.size)[0]
        raise OSError(code, os.strerror(code))
    if kind != RTM_NEWLINK:
        raise OSError(errno.EPROTO, f"unexpected netlink message type {kind}")
    attrs = _rtattrs(reply[_NLMSGHDR.size + _IFINFOMSG.size : length])
    linkinfo = _rtattrs(attrs.get(IFLA_LINKINFO, b""))
    return _rtattrs(linkinfo.get(IFLA_INFO_DATA, b""))


def _rtattrs(data: bytes) -> dict[int, bytes]:
    """Netlink attributes (type -> payload) of one level; nested ones stay raw."""
    attrs: dict[int, bytes] = {}
    offset = 0
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size or offset + length > len(data):
            break
        attrs[kind & NLA_TYPE_MASK] = data[offset + _RTATTR.size : offset + length]
        offset += (length + 3) & ~3
    return attrs


NETNS_DIRS = ("/run/netns", "/var/run/netns")


def _missing_hint(name: str, raw: bytes) -> str:
    """Why a tap is missing, with a hint: a named network namespace (ip
    netns) that has it, or how to create it."""
    found = []
    for ns_name, path in _named_namespaces():
        try:
            ns_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.fstat(ns_fd).st_ino == os.stat(THREAD_NETNS).st_ino:
                continue
            if _call_in_netns(ns_fd, lambda: _exists_here(raw)):
                found.append(ns_name)
        except OSError:
            continue
        finally:
            os.close(ns_fd)
    if found:
        where = ", ".join(f"'{n}'" for n in found[:3])
        if len(found) > 3:
            where += f" and {len(found) - 3} more"
        return (
            f"does not exist in pyvmm's network namespace but in network namespace "
            f"{where} (run pyvmm there: ip netns exec {found[0]} pyvmm ...; or pass an "
            f"open tap fd: --net=@FD)"
        )
    return f"does not exist (create it: ip tuntap add {name} mode tap)"


def _named_namespaces() -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for directory in NETNS_DIRS:
        try:
            for entry in sorted(os.listdir(directory)):
                seen.setdefault(entry, os.path.join(directory, entry))
        except OSError:
            continue
    return list(seen.items())


def _exists_here(raw: bytes) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            _ifindex(sock, raw)
        except OSError:
            return False
    return True


def _in_device_netns(tap_fd: int, fn: Callable[[], _T]) -> _T:
    """Run ``fn`` in the network namespace of the tap behind ``tap_fd``."""
    try:
        ns_fd = fcntl.ioctl(tap_fd, TUNGETDEVNETNS)
    except OSError:
        return fn()  # Kernel before 5.2: assume our own namespace.
    try:
        if os.fstat(ns_fd).st_ino == os.stat(THREAD_NETNS).st_ino:
            return fn()
        return _call_in_netns(ns_fd, fn)
    finally:
        os.close(ns_fd)


def _call_in_netns(ns_fd: int, fn: Callable[[], _T]) -> _T:
    """Run ``fn`` on a short-lived thread that joined netns ``ns_fd``.

    setns() moves only the calling thread, so the caller's threads stay
    where they are and the namespace is left when the helper thread ends.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            setns(ns_fd)
            box["value"] = fn()
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=target, name="pyvmm-netns-query")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _reason(err: OSError) -> str:
    return err.strerror or os.strerror(err.errno or errno.EIO)
