"""Tap backend: the host end of a guest NIC, one Ethernet frame per read/write.

pyvmm only ever attaches to a tap that already exists (as ``solo5-hvt``
does): ``TUNSETIFF`` on a missing name would silently create a fresh,
unconfigured interface, so a typo would boot a guest on a dead link.

Every interface lookup here goes through ioctls on a socket or on the tap
fd, never through ``/sys/class/net``: sysfs shows the network namespace it
was mounted in, which is not the one a process entered with ``setns``. The
tap's own counters (frames the kernel handed to pyvmm or dropped because
nobody read them in time) come the same way, over rtnetlink in the tap's
namespace (``link_stats``, ``TapCounters``).
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
from pyvmm.common.errors import DeviceError
from pyvmm.common.fd import OwnedFd
from pyvmm.host.netns import THREAD_NETNS, setns

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
# RTM_GETSTATS (Linux 4.7+): one interface's struct rtnl_link_stats64.
RTM_NEWSTATS = 92
RTM_GETSTATS = 94
IFLA_STATS_LINK_64 = 1
_IF_STATS_MSG = struct.Struct("=BBHII")  # family, pad, pad, ifindex, filter_mask
#: struct rtnl_link_stats64 (<linux/if_link.h>) in order; newer kernels
#: append fields, which are read when present.
LINK_STATS_FIELDS = (
    "rx_packets",
    "tx_packets",
    "rx_bytes",
    "tx_bytes",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "multicast",
    "collisions",
    "rx_length_errors",
    "rx_over_errors",
    "rx_crc_errors",
    "rx_frame_errors",
    "rx_fifo_errors",
    "rx_missed_errors",
    "tx_aborted_errors",
    "tx_carrier_errors",
    "tx_fifo_errors",
    "tx_heartbeat_errors",
    "tx_window_errors",
    "rx_compressed",
    "tx_compressed",
    "rx_nohandler",
    "rx_otherhost_dropped",
)
#: What --stats reports of a tap (a tap's "tx" is towards its reader: the guest).
TAP_COUNTERS = ("tx_packets", "tx_bytes", "tx_dropped", "rx_packets", "rx_bytes", "rx_dropped")

# struct ifreq is 40 bytes on 64-bit Linux: a 16-byte name and a 24-byte union.
_IFREQ_FLAGS = struct.Struct("16sH22x")
_IFREQ_INT = struct.Struct("16si20x")
_IFREQ_PTR = struct.Struct("16sQ16x")
# struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32],
# bus_info[32], erom_version[32], reserved2[12], five u32 counters.
_DRVINFO_SIZE = 196
_DRVINFO_DRIVER = slice(4, 36)
_DRVINFO_BUS = slice(100, 132)


def _errno_error() -> OSError:
    """The OSError of the failed C call just made on this thread."""
    code = ffi.errno
    return OSError(code, os.strerror(code))


class TapBackend(OwnedFd):
    """An attached, non-blocking tap fd (``IFF_TAP | IFF_NO_PI``) and its facts.

    ``mtu`` is read once at attach time: the guest learns it from the
    manifest at boot and cannot be told about a later change anyway.
    """

    def __init__(self, fd: int, ifname: str, mtu: int, kernel: TapCounters | None = None) -> None:
        self.fd = fd
        self.ifname = ifname
        self.mtu = mtu
        #: The kernel's own counters of the tap (None: not readable).
        self.kernel = kernel
        # Frame I/O is csrc/tap_io.c's, the fast path's own: it counts the
        # drops into these two cells (rx_dropped, tx_dropped).
        self._dropped = ffi.new("uint64_t[2]")
        self._rx_tally = ffi.new("struct tap_io_tally *", {"oversize": self._dropped + 0})
        self._tx_tally = ffi.new("struct tap_io_tally *", {"failed": self._dropped + 1})
        self._length = ffi.new("uint32_t *")

    @property
    def rx_dropped(self) -> int:
        """Frames read_into dropped for being longer than its buffer."""
        return int(self._dropped[0])

    @property
    def tx_dropped(self) -> int:
        """Frames write dropped (queue full, link down, runt)."""
        return int(self._dropped[1])

    def kernel_counters(self) -> dict[str, int]:
        """The tap's kernel counters since pyvmm attached it (TAP_COUNTERS),
        or nothing if they cannot be read."""
        return self.kernel.read() if self.kernel is not None else {}

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
        super().close()

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
                # From now on the tap's drops are pyvmm's to report.
                return cls(fd, name, mtu, TapCounters.open(ifindex))
            except BaseException:
                os.close(fd)
                raise

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
            mtu, tun_data, kernel = _in_device_netns(
                fd, lambda: (_query_mtu(raw), _tun_link_data(raw), TapCounters.open_named(raw))
            )
        except OSError as err:
            raise fail(f"cannot query tap '{ifname}': {_reason(err)}") from None
        # TUNGETIFF cannot say whether IFF_NO_PI is set (it reuses that bit
        # for IFF_NOFILTER), so ask netlink; old kernels do not tell.
        if tun_data.get(IFLA_TUN_PI, b"\0") != b"\0":
            if kernel is not None:
                kernel.close()
            raise fail(
                f"fd {fd} (tap '{ifname}') was opened without IFF_NO_PI "
                "(frames would carry a packet information header)"
            )
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)
        return cls(fd, ifname, mtu, kernel)

    def read_into(self, buf: Any) -> int | None:
        """Read one frame into ``buf``; its length, or None if none is waiting.

        A frame longer than ``buf`` is dropped (and counted in
        ``rx_dropped``), as a NIC drops what exceeds its buffer, rather than
        handed over cut short; pass at least ``mtu + 14`` bytes. After
        lib.TAP_IO_TURN such drops in a row it answers None, as the fast
        path does.
        """
        view = ffi.from_buffer(buf, require_writable=True)
        result = lib.tap_io_read(self.fd, view, len(view), self._length, self._rx_tally)
        if result == lib.TAP_IO_FRAME:
            return int(self._length[0])
        if result == lib.TAP_IO_AGAIN:
            return None
        raise _errno_error()

    def write(self, buf: Any) -> bool:
        """Send one frame; False if it was dropped (queue full, link down, runt).

        Dropping instead of raising is what a NIC does: the guest's stack
        retransmits, and a busy host never stalls the vCPU.
        """
        view = ffi.from_buffer(buf)
        result = lib.tap_io_write(self.fd, view, len(view), ETH_HLEN, self._tx_tally)
        if result == lib.TAP_IO_FAILED:
            raise _errno_error()
        return result == lib.TAP_IO_FRAME

    def __repr__(self) -> str:
        return f"TapBackend(fd={self.fd}, ifname={self.ifname!r}, mtu={self.mtu})"


class TapCounters:
    """A tap's kernel counters, as differences from when pyvmm attached it.

    The kernel counts what pyvmm cannot see: frames for the guest it dropped
    because its queue was full (the tap's ``tx_dropped``: the guest, or
    pyvmm, fell behind). They are read over a netlink socket opened during
    set-up in the tap's namespace and then only written and read, which the
    sandbox allows; the sampling threads share it under a lock.
    """

    def __init__(self, ifindex: int, fd: int) -> None:
        self.ifindex = ifindex
        self.fd = fd
        self._lock = threading.Lock()
        self._seq = 0
        self.base = self._raw()
        self.last = dict.fromkeys(TAP_COUNTERS, 0)

    @classmethod
    def open(cls, ifindex: int) -> TapCounters | None:
        """For interface ``ifindex`` of the calling thread's namespace; None
        if the kernel will not tell (counters are not worth failing a run)."""
        try:
            fd = open_netlink()
        except OSError:
            return None
        try:
            return cls(ifindex, fd)
        except OSError:
            os.close(fd)
            return None

    @classmethod
    def open_named(cls, raw: bytes) -> TapCounters | None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            return cls.open(_ifindex(sock, raw))

    def _raw(self) -> dict[str, int]:
        with self._lock:
            if self.fd < 0:
                raise OSError(errno.EBADF, "closed")
            self._seq += 1
            return link_stats(self.ifindex, self.fd, self._seq)

    def read(self) -> dict[str, int]:
        """TAP_COUNTERS since the attach; the last known values if the
        kernel does not answer now."""
        try:
            now = self._raw()
        except OSError:
            return dict(self.last)
        self.last = {k: now.get(k, 0) - self.base.get(k, 0) for k in TAP_COUNTERS}
        return dict(self.last)

    def close(self) -> None:
        with self._lock:
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def open_netlink() -> int:
    """A NETLINK_ROUTE socket in the calling thread's network namespace, as a
    plain fd (link_stats only writes and reads it), with a receive timeout
    so that a reader never waits on the kernel for long."""
    sock = socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
    )
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 1, 0))
    except BaseException:
        sock.close()
        raise
    return sock.detach()


def link_stats(ifindex: int, fd: int | None = None, seq: int = 1) -> dict[str, int]:
    """The kernel's counters of interface ``ifindex`` (LINK_STATS_FIELDS), one
    RTM_GETSTATS on netlink socket ``fd`` (by default a new one in the calling
    thread's namespace). What ``--stats`` reports of a tap and what the
    benchmarks and tests read of theirs (testkit/netns.py). OSError if the
    kernel refuses (no such interface, a kernel before 4.7)."""
    if fd is None:
        fd = open_netlink()
        try:
            return link_stats(ifindex, fd, seq)
        finally:
            os.close(fd)
    body = _IF_STATS_MSG.pack(socket.AF_UNSPEC, 0, 0, ifindex, 1 << (IFLA_STATS_LINK_64 - 1))
    os.write(
        fd, _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_GETSTATS, NLM_F_REQUEST, seq, 0) + body
    )
    for _ in range(16):
        reply = os.read(fd, 1 << 16)
        if len(reply) >= _NLMSGHDR.size and _NLMSGHDR.unpack_from(reply)[3] != seq:
            continue  # a late answer to an earlier request
        attrs = _netlink_attrs(reply, RTM_NEWSTATS, _IF_STATS_MSG)
        data = attrs.get(IFLA_STATS_LINK_64)
        if data is None:
            raise OSError(errno.EPROTO, "no IFLA_STATS_LINK_64 in the reply")
        count = min(len(data) // 8, len(LINK_STATS_FIELDS))
        return dict(zip(LINK_STATS_FIELDS, struct.unpack_from(f"={count}Q", data), strict=False))
    raise OSError(errno.EPROTO, "no netlink reply to this request")


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
    attrs = _netlink_attrs(reply, RTM_NEWLINK, _IFINFOMSG)
    linkinfo = _rtattrs(attrs.get(IFLA_LINKINFO, b""))
    return _rtattrs(linkinfo.get(IFLA_INFO_DATA, b""))


def _netlink_attrs(reply: bytes, wanted: int, fixed: struct.Struct) -> dict[int, bytes]:
    """The top-level attributes of one netlink answer, a ``wanted`` message
    whose fixed part is ``fixed``; the kernel's refusal as its OSError."""
    if len(reply) < _NLMSGHDR.size:
        raise OSError(errno.EPROTO, "short netlink reply")
    length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(reply)
    if kind == NLMSG_ERROR:
        code = -struct.unpack_from("i", reply, _NLMSGHDR.size)[0]
        raise OSError(code, os.strerror(code))
    if kind != wanted:
        raise OSError(errno.EPROTO, f"unexpected netlink message type {kind}")
    return _rtattrs(reply[_NLMSGHDR.size + fixed.size : length])


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
