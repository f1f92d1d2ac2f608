"""TapBackend against real taps, each test in its own network namespace.

Every interface and frame here lives in a namespace the test creates and
removes (testkit/netns.py); nothing is created in, or sent to, the host's
namespace.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyroute2 import netns as pyroute2_netns

from pyvmm.common.errors import DeviceError
from pyvmm.devices.net.tap import (
    IFF_NO_PI,
    IFF_TAP,
    IFF_TUN,
    TUNSETIFF,
    InvalidMacError,
    TapBackend,
    parse_mac,
    random_mac,
)
from testkit.netns import NetNamespace

ROOT = Path(__file__).resolve().parents[1]
ETH_P_ALL = 0x0003
ETHERTYPE = 0x88B5  # IEEE 802 local experimental: no stack in the kernel answers it

F = TypeVar("F", bound=Callable[..., Any])


def netns_test(fn: F) -> F:
    """Tests that need root and /dev/net/tun to build their own namespace
    (conftest skips them elsewhere, and fails a root run that skipped one)."""
    return pytest.mark.netns(fn)


@pytest.fixture
def ns() -> Iterator[NetNamespace]:
    """A namespace with tap100 (up, 10.0.0.1/24) and no IPv6 chatter on it."""
    with NetNamespace() as space:
        space.add_quiet_tap("tap100")
        yield space


@pytest.fixture
def tap(ns: NetNamespace) -> Iterator[TapBackend]:
    with ns.inside():
        backend = TapBackend.open("tap100")
    with backend:
        wait_until_frames_pass(ns, backend, "tap100")
        yield backend


def wait_until_frames_pass(ns: NetNamespace, tap: TapBackend, ifname: str) -> None:
    """Return once a frame sent on the link reaches ``tap``, the probes read.

    The kernel turns a tap's carrier on when a reader attaches, but starts
    its transmit queue later, from a work item (linkwatch) that a loaded
    machine runs tens of milliseconds late; a frame sent meanwhile is
    dropped. So a probe is sent until one arrives, and every frame read
    (probes, anything else) is discarded before the test starts.
    """
    probe = make_frame(b"probe: the queue runs")
    buf = bytearray(tap.mtu + 14)
    deadline = time.monotonic() + 30  # a hang bound
    with packet_socket(ns, ifname) as sender:
        while time.monotonic() < deadline:
            sender.send(probe)
            select.select([tap.fileno()], [], [], 0.05)
            n = tap.read_into(memoryview(buf))
            if n is not None and bytes(buf[:n]) == probe:
                break
        else:
            raise AssertionError(f"no frame sent on {ifname} reached its tap in 30 s")
    time.sleep(0.05)  # probes still on their way
    while tap.read_into(memoryview(buf)) is not None:
        pass


def make_frame(payload: bytes = b"pyvmm tap test") -> bytes:
    dst = b"\xff" * 6
    src = b"\x02\x00\x00\x00\x00\x01"
    frame = dst + src + ETHERTYPE.to_bytes(2, "big") + payload
    return frame.ljust(60, b"\0")


def packet_socket(ns: NetNamespace, ifname: str = "tap100") -> socket.socket:
    """A raw socket on ``ifname`` inside ``ns``: sees every frame on that link."""
    with ns.inside():
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind((ifname, 0))
    sock.settimeout(0.2)
    return sock


def attach_fd(ns: NetNamespace, ifname: str, flags: int) -> int:
    """A /dev/net/tun fd attached to ``ifname`` the raw way, as a caller of @N would."""
    with ns.inside():
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    fcntl.ioctl(
        fd, TUNSETIFF, ifname.encode().ljust(16, b"\0") + flags.to_bytes(2, "little") + bytes(22)
    )
    return fd


def receive(tap: TapBackend, wanted: bytes, timeout: float = 30.0) -> bytes | None:
    """Read frames from ``tap`` until ``wanted`` arrives; the last frame read."""
    buf = bytearray(tap.mtu + 14)
    deadline = time.monotonic() + timeout
    got = None
    while got != wanted and time.monotonic() < deadline:
        select.select([tap.fileno()], [], [], 0.2)
        n = tap.read_into(memoryview(buf))
        if n is not None:
            got = bytes(buf[:n])
    return got


def host_has_interface(ifname: str) -> bool:
    try:
        socket.if_nametoindex(ifname)
    except OSError:
        return False
    return True


def is_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for init counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# -- attaching by name -----------------------------------------------------


@netns_test
def test_open_attaches_to_an_existing_tap(ns: NetNamespace) -> None:
    with ns.inside():
        backend = TapBackend.open("tap100")
    with backend:
        assert backend.ifname == "tap100"
        assert backend.fileno() == backend.fd >= 0
        assert not os.get_blocking(backend.fd)
        assert backend.mtu == 1500


@netns_test
@pytest.mark.parametrize("mtu", [1400, 9000])
def test_open_reports_the_real_mtu(ns: NetNamespace, mtu: int) -> None:
    ns.set_mtu("tap100", mtu)
    with ns.inside():
        backend = TapBackend.open("tap100")
    with backend:
        assert backend.mtu == mtu == ns.link("tap100")["mtu"]


@netns_test
def test_open_does_not_depend_on_sysfs(ns: NetNamespace) -> None:
    # sysfs still shows the host namespace to a thread that only called setns.
    ns.set_mtu("tap100", 1400)
    with ns.inside():
        sysfs_sees_it = os.path.exists("/sys/class/net/tap100")
        backend = TapBackend.open("tap100")
    with backend:
        assert sysfs_sees_it == host_has_interface("tap100")
        assert backend.mtu == 1400


@netns_test
def test_open_works_in_a_process_started_inside_the_namespace(ns: NetNamespace) -> None:
    ns.set_mtu("tap100", 1400)
    code = (
        "from pyvmm.devices.net.tap import TapBackend\n"
        "with TapBackend.open('tap100') as t: print(t.ifname, t.mtu)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = ns.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tap100", "1400"]


@netns_test
def test_open_rejects_missing_tap(ns: NetNamespace) -> None:
    with ns.inside(), pytest.raises(DeviceError) as info:
        TapBackend.open("tap999")
    assert str(info.value) == (
        "Could not attach interface: tap999: tap device 'tap999' does not exist "
        "(create it: ip tuntap add tap999 mode tap)"
    )
    assert "tap999" not in ns.links()  # TUNSETIFF would have created it


@netns_test
def test_open_rejects_interface_that_is_not_a_tap(ns: NetNamespace) -> None:
    with ns.inside(), pytest.raises(DeviceError) as info:
        TapBackend.open("lo")
    assert str(info.value) == "Could not attach interface: lo: tap device 'lo' is not a tap device"


@netns_test
def test_open_rejects_tun_device(ns: NetNamespace) -> None:
    with ns.iproute() as ipr:
        ipr.link("add", ifname="tun101", kind="tuntap", mode="tun")
    with ns.inside(), pytest.raises(DeviceError) as info:
        TapBackend.open("tun101")
    assert str(info.value) == (
        "Could not attach interface: tun101: tap device 'tun101' is a tun device, not a tap device"
    )


@netns_test
def test_open_rejects_tap_already_attached(ns: NetNamespace, tap: TapBackend) -> None:
    with ns.inside(), pytest.raises(DeviceError) as info:
        TapBackend.open("tap100")
    assert str(info.value) == (
        "Could not attach interface: tap100: tap device 'tap100' is already in use by another "
        "process"
    )


@netns_test
@pytest.mark.parametrize("name", ["", "x" * 16, "a/b", "a b", "a:1", ".."])
def test_open_rejects_invalid_interface_name(ns: NetNamespace, name: str) -> None:
    with ns.inside(), pytest.raises(DeviceError) as info:
        TapBackend.open(name)
    assert str(info.value) == (
        f"Could not attach interface: {name}: tap device '{name}' is not a valid interface name"
    )


@netns_test
def test_open_gives_bare_frames_even_if_tap_was_created_with_packet_info(
    ns: NetNamespace,
) -> None:
    # Attaching applies our IFF_NO_PI to the device, whatever it was created with.
    with ns.iproute() as ipr:  # no ifr flags: pyroute2 creates it with packet info
        ipr.link("add", ifname="tap101", kind="tuntap", mode="tap")
        ipr.link("set", index=ipr.link_lookup(ifname="tap101")[0], state="up")
    with ns.inside():
        backend = TapBackend.open("tap101")
    frame = make_frame(b"no header please")
    with backend, packet_socket(ns, "tap101") as sender:
        wait_until_frames_pass(ns, backend, "tap101")
        sender.send(frame)
        assert receive(backend, frame) == frame


@netns_test
def test_close_is_idempotent_and_releases_the_tap(ns: NetNamespace) -> None:
    with ns.inside():
        first = TapBackend.open("tap100")
        first.close()
        first.close()
        assert first.closed
        with TapBackend.open("tap100") as second:  # not EBUSY any more
            assert second.fd >= 0
        assert second.closed


# -- adopting an fd ("@N") -------------------------------------------------


@netns_test
def test_open_adopts_an_attached_tap_fd(ns: NetNamespace) -> None:
    ns.set_mtu("tap100", 1400)
    fd = attach_fd(ns, "tap100", IFF_TAP | IFF_NO_PI)
    with ns.inside():
        backend = TapBackend.open(f"@{fd}")
    assert (backend.fd, backend.ifname, backend.mtu) == (fd, "tap100", 1400)
    assert not os.get_blocking(fd)
    backend.close()
    with pytest.raises(OSError):  # ownership was taken: close() closed it
        os.fstat(fd)


@netns_test
def test_open_adopts_tap_fd_from_another_namespace(ns: NetNamespace) -> None:
    # The caller (this thread) is in the host namespace, the tap is not:
    # the MTU must come from the tap's namespace, not from a name lookup here.
    ns.set_mtu("tap100", 1400)
    fd = attach_fd(ns, "tap100", IFF_TAP | IFF_NO_PI)
    with TapBackend.open(f"@{fd}") as backend:
        assert (backend.ifname, backend.mtu) == ("tap100", 1400)


def _closed_fd(ns: NetNamespace) -> tuple[str, int | None]:
    fd = os.open("/dev/null", os.O_RDONLY)
    os.close(fd)
    return f"@{fd}", None


def _regular_file_fd(ns: NetNamespace) -> tuple[str, int | None]:
    fd = os.open(__file__, os.O_RDONLY | os.O_CLOEXEC)
    return f"@{fd}", fd


def _unattached_tun_fd(ns: NetNamespace) -> tuple[str, int | None]:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    return f"@{fd}", fd


def _tun_device_fd(ns: NetNamespace) -> tuple[str, int | None]:
    with ns.iproute() as ipr:
        ipr.link("add", ifname="tun101", kind="tuntap", mode="tun")
    fd = attach_fd(ns, "tun101", IFF_TUN | IFF_NO_PI)
    return f"@{fd}", fd


def _tap_with_packet_info_fd(ns: NetNamespace) -> tuple[str, int | None]:
    with ns.iproute() as ipr:  # no ifr flags: pyroute2 leaves packet info on
        ipr.link("add", ifname="tap101", kind="tuntap", mode="tap")
    fd = attach_fd(ns, "tap101", IFF_TAP)
    return f"@{fd}", fd


@netns_test
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_closed_fd, r"fd \d+ is not open \(Bad file descriptor\)"),
        (lambda ns: ("@abc", None), r"'abc' is not a file descriptor number"),
        (lambda ns: ("@", None), r"'' is not a file descriptor number"),
        (_regular_file_fd, r"fd \d+ is not a tap file descriptor"),
        (_unattached_tun_fd, r"fd \d+ is a /dev/net/tun fd not attached to any interface"),
        (_tun_device_fd, r"fd \d+ is attached to tun device 'tun101', not a tap"),
        (_tap_with_packet_info_fd, r"fd \d+ \(tap 'tap101'\) was opened without IFF_NO_PI \(.*\)"),
    ],
    ids=["closed", "not-a-number", "empty", "regular-file", "unattached", "tun", "with-pi"],
)
def test_open_rejects_bad_fd(
    ns: NetNamespace,
    make: Callable[[NetNamespace], tuple[str, int | None]],
    message: str,
) -> None:
    iface, fd = make(ns)
    try:
        with pytest.raises(DeviceError) as info:
            TapBackend.open(iface)
        assert re.fullmatch(
            f"Could not attach interface: {re.escape(iface)}: {message}", str(info.value)
        )
        if fd is not None:
            os.fstat(fd)  # a refused fd still belongs to the caller: still open
    finally:
        if fd is not None:
            os.close(fd)


# -- frames ----------------------------------------------------------------


@netns_test
def test_write_sends_frame_into_the_interface(ns: NetNamespace, tap: TapBackend) -> None:
    sniffer = packet_socket(ns)
    with sniffer:
        frame = make_frame()
        assert tap.write(memoryview(frame)) is True
        seen = []
        deadline = time.monotonic() + 30  # a hang bound
        while frame not in seen and time.monotonic() < deadline:
            try:
                seen.append(sniffer.recv(4096))
            except TimeoutError:
                pass
        assert frame in seen
    assert ns.link("tap100")["stats"]["rx_packets"] >= 1
    assert tap.tx_dropped == 0


@netns_test
def test_read_into_returns_a_frame_sent_on_the_interface(ns: NetNamespace, tap: TapBackend) -> None:
    frame = make_frame(b"from the host side")
    with packet_socket(ns) as sender:
        sender.send(frame)
    assert receive(tap, frame) == frame
    assert ns.link("tap100")["stats"]["tx_packets"] >= 1


@netns_test
def test_read_into_drops_frame_longer_than_buffer(ns: NetNamespace, tap: TapBackend) -> None:
    long_frame = make_frame(b"L" * 200)
    short_frame = make_frame(b"short")
    with packet_socket(ns) as sender:
        sender.send(long_frame)
        sender.send(short_frame)
    buf = bytearray(100)  # room for short_frame only
    deadline = time.monotonic() + 30  # a hang bound
    got = None
    while got != short_frame and time.monotonic() < deadline:
        select.select([tap.fileno()], [], [], 0.2)
        n = tap.read_into(buf)
        if n is not None:
            got = bytes(buf[:n])
            assert got != long_frame[:100]  # never a frame cut short
    assert got == short_frame
    assert tap.rx_dropped >= 1


@netns_test
def test_read_into_returns_none_when_no_frame_waits(tap: TapBackend) -> None:
    buf = bytearray(2048)
    for _ in range(100):  # drain anything the kernel sent when the link came up
        if tap.read_into(buf) is None:
            break
    assert fcntl.fcntl(tap.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
    # A blocking read would wait forever here (no frame comes): the bound
    # only catches that, never a slow machine.
    result: list[Any] = []
    reader = threading.Thread(target=lambda: result.append(tap.read_into(buf)), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "read_into blocked with no frame waiting"
    assert result == [None]


@netns_test
def test_write_drops_frame_when_interface_is_down(ns: NetNamespace, tap: TapBackend) -> None:
    with ns.iproute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="tap100")[0], state="down")
    assert tap.write(make_frame()) is False
    assert tap.tx_dropped == 1


@netns_test
@pytest.mark.parametrize("length", [0, 5, 13])
def test_write_drops_runt_frame(tap: TapBackend, length: int) -> None:
    assert tap.write(b"\xff" * length) is False
    assert tap.tx_dropped == 1


# -- the namespace helper itself -------------------------------------------


@netns_test
def test_namespace_runs_commands_inside_itself() -> None:
    with NetNamespace() as space:
        inside = space.run(["readlink", "/proc/self/ns/net"], capture_output=True, text=True)
        assert inside.returncode == 0
        ns_ino = os.stat(space.path).st_ino
        assert inside.stdout.strip() == f"net:[{ns_ino}]"
        assert os.readlink("/proc/self/ns/net") != f"net:[{ns_ino}]"


@netns_test
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_namespace_is_removed_even_when_body_raises(error: type[BaseException]) -> None:
    host_had_tap = host_has_interface("tap100")
    with pytest.raises(error):
        with NetNamespace() as space:
            space.add_tap("tap100", mtu=1400)
            sleeper = space.popen(["sleep", "60"])
            raise error("boom")
    assert not space.exists()
    assert space.name not in pyroute2_netns.listnetns()
    assert not os.path.exists(space.path)
    assert sleeper.poll() is not None
    assert host_has_interface("tap100") == host_had_tap


ORPHAN = """
import os, sys, time
child = os.fork()
if child:
    print(child, flush=True)
    sys.exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
time.sleep(60)
"""


@netns_test
def test_close_kills_processes_that_left_their_process_group() -> None:
    with NetNamespace() as space:
        # The child forks an orphan in its own session, out of reach of the
        # process-group kill: only the sweep of the namespace can find it.
        done = space.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True)
        orphan = int(done.stdout)
        assert not is_gone(orphan)
    deadline = time.monotonic() + 30  # a hang bound
    while not is_gone(orphan) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert is_gone(orphan)


@netns_test
def test_namespaces_one_after_another_do_not_collide() -> None:
    names = []
    for mtu in (1400, 1300):
        with NetNamespace() as space:
            space.add_tap("tap100", mtu=mtu)
            with space.inside(), TapBackend.open("tap100") as backend:
                assert backend.mtu == mtu
            names.append(space.name)
    assert names[0] != names[1]
    assert not set(names) & set(pyroute2_netns.listnetns())


# -- MAC addresses (no namespace needed) -------------------------------------


def test_parse_mac_accepts_unicast_in_either_case() -> None:
    assert parse_mac("02:00:0a:BB:cc:01") == bytes([2, 0, 0x0A, 0xBB, 0xCC, 1])


@pytest.mark.parametrize("text", ["01:00:5e:00:00:01", "ff:ff:ff:ff:ff:ff", "33:33:00:00:00:01"])
def test_parse_mac_rejects_multicast(text: str) -> None:
    with pytest.raises(DeviceError, match=f"^invalid MAC address '{text}': it is a multicast"):
        parse_mac(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "02:00:00:00:00",
        "02:00:00:00:00:00:00",
        "02-00-00-00-00-01",
        "02:00:00:00:00:0g",
        "2:0:0:0:0:1",
        " 02:00:00:00:00:01",
        "02:00:00:00:00:01\n",
        "0200.0000.0001",
    ],
)
def test_parse_mac_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="invalid MAC address"):
        parse_mac(text)


def test_parse_mac_rejects_all_zeros() -> None:
    with pytest.raises(InvalidMacError, match="all zeros"):
        parse_mac("00:00:00:00:00:00")


def test_random_mac_is_unicast_and_locally_administered() -> None:
    macs = {random_mac() for _ in range(200)}
    assert len(macs) > 190
    for mac in macs:
        assert len(mac) == 6
        assert mac[0] & 0x01 == 0  # unicast
        assert mac[0] & 0x02 == 0x02  # locally administered
