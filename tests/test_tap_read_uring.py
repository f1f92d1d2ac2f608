"""--tap-read=uring end to end, in every IO thread mode, inside a network
namespace the test creates: a flood whose every payload the guest checks
arrives intact and in order, with the host's counts exact, and the run is
sandboxed (the command's default), so the filter lets the ring's calls
through; ping; where io_uring is absent (a seccomp filter the test puts
on the child makes io_uring_setup fail), auto falls back to readv and says
so at -v, and uring is a one-line error; and the option's checks.
docs/modes.md, "Batched tap reads"."""

from __future__ import annotations

import ctypes
import json
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from conftest import guest, run_pyvmm
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

MODES = ["poll", "event", "hybrid"]
GUEST_IP, GUEST_MAC = "10.0.0.2", "02:00:00:00:00:02"


@contextmanager
def namespace(txqlen: int | None = None) -> Iterator[NetNamespace]:
    """A namespace with tap100 and no IPv6: the only frames are the test's."""
    with NetNamespace() as ns:
        ns.add_quiet_tap("tap100", txqlen=txqlen)
        yield ns


def start(ns: NetNamespace, mode: str, name: str, *args: str, reader: str = "uring"):
    proc, head = ns.start_pyvmm(
        helpers.STATS,
        "-v",
        f"--shm={mode}",
        f"--tap-read={reader}",
        "--net:service0=tap100",
        f"--net-mac:service0={GUEST_MAC}",
        guest(name),
        *args,
    )
    return proc, head


def finish(proc, head: str) -> tuple[dict, dict, str]:
    out, err = proc.communicate(timeout=120)
    out = head + out
    assert proc.returncode == 0, out + err
    assert "SUCCESS" in out
    return helpers.guest_report(out), helpers.parse_stats(err), err


@pytest.mark.parametrize("mode", MODES)
def test_flood_through_uring_reads_arrives_intact_in_order_and_counted(mode):
    """Every payload checked by the guest, in order; each frame the tap
    handed over went into the ring or was counted as a drop."""
    count, rate = 20000, 10000
    with namespace(txqlen=count) as ns:
        ns.run(
            ["ip", "neigh", "replace", GUEST_IP, "lladdr", GUEST_MAC, "dev", "tap100"], check=True
        )
        proc, head = start(ns, mode, "udpsink", GUEST_IP, "5000", "0", "1000")
        sent = ns.run(
            [sys.executable, "-m", "testkit.traffic", GUEST_IP, "5000"]
            + ["--count", str(count), "--rate", str(rate), "--size", "1300"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert json.loads(sent.stdout)["sent"] == count, sent.stdout + sent.stderr
        lines, stats, err = finish(proc, head)
        tap = ns.link("tap100")["stats"]
    assert "tap reads: io_uring" in err, err
    shm = stats["shmstream"]
    assert shm["tap_read"] == "uring"
    dev = shm["devices"]["service0"]
    frames = int(lines["frames"])
    assert int(lines["pattern_errors"]) == 0
    assert int(lines["out_of_order"]) == 0
    assert int(lines["bytes"]) == frames * 1300
    assert frames >= count * 0.9, lines
    assert tap["tx_packets"] + tap["tx_dropped"] == count, tap
    assert dev["rx_frames"] + dev["rx_drops_full"] == tap["tx_packets"], (dev, tap)
    assert dev["rx_frames"] == frames, (dev, lines)


@pytest.mark.parametrize("mode", MODES)
def test_ping_through_uring_reads(mode):
    with namespace() as ns:
        proc, head = start(ns, mode, "ping", GUEST_IP, "5")
        helpers.ping(ns, GUEST_IP, 5)
        _, stats, _ = finish(proc, head)
    dev = stats["shmstream"]["devices"]["service0"]
    assert stats["shmstream"]["tap_read"] == "uring"
    assert dev["rx_frames"] >= 5 and dev["tx_frames"] >= 5


# A classic BPF seccomp program, installed in the child before exec:
# io_uring_setup fails with ENOSYS, as on a kernel built without io_uring;
# every other call is allowed (pyvmm's own sandbox stacks on top of it).
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[platform.machine()]
_NR_IO_URING_SETUP = 425  # the same on both
_ERRNO_ENOSYS = 0x00050000 | 38
_ALLOW = 0x7FFF0000


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def without_io_uring() -> None:
    """preexec_fn: this process and what it execs get no io_uring."""
    program = (_SockFilter * 6)(
        (0x20, 0, 0, 4),  # load the architecture
        (0x15, 0, 3, _AUDIT_ARCH),  # another one: allow
        (0x20, 0, 0, 0),  # load the call's number
        (0x15, 0, 1, _NR_IO_URING_SETUP),
        (0x06, 0, 0, _ERRNO_ENOSYS),
        (0x06, 0, 0, _ALLOW),
    )
    prog = _SockFprog(len(program), program)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(prog), 0, 0):
        raise OSError(ctypes.get_errno(), "seccomp")


def test_auto_falls_back_to_readv_where_io_uring_is_absent_and_says_so():
    with namespace() as ns:
        proc, head = ns.start_pyvmm(
            helpers.STATS,
            "-v",
            "--shm=event",
            "--tap-read=auto",
            "--net:service0=tap100",
            f"--net-mac:service0={GUEST_MAC}",
            guest("ping"),
            GUEST_IP,
            "2",
            preexec_fn=without_io_uring,
        )
        helpers.ping(ns, GUEST_IP, 2)
        _, stats, err = finish(proc, head)
    assert "net: tap reads: readv (io_uring is not available: Function not implemented)" in err
    assert stats["shmstream"]["tap_read"] == "readv"
    assert stats["shmstream"]["devices"]["service0"]["rx_frames"] >= 2


def test_uring_asked_for_where_io_uring_is_absent_is_one_line_error():
    with namespace() as ns:
        result = ns.run(
            [sys.executable, "-m", "pyvmm", "--shm=event", "--tap-read=uring"]
            + ["--net:service0=tap100", guest("ping"), GUEST_IP, "1"],
            capture_output=True,
            text=True,
            preexec_fn=without_io_uring,
        )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "pyvmm: --tap-read=uring: io_uring is not available here: Function not implemented "
        "(--tap-read=auto falls back to readv)"
    ], result.stderr


def test_readv_stays_the_default_reader():
    with namespace() as ns:
        proc, head = ns.start_pyvmm(
            helpers.STATS,
            "--shm=event",
            "--net:service0=tap100",
            f"--net-mac:service0={GUEST_MAC}",
            guest("ping"),
            GUEST_IP,
            "2",
        )
        helpers.ping(ns, GUEST_IP, 2)
        _, stats, _ = finish(proc, head)
    assert stats["shmstream"]["tap_read"] == "readv"


def test_tap_read_without_a_shmstream_region_is_refused():
    with namespace() as ns:
        result = ns.run_pyvmm(
            "--shm=off", "--tap-read=uring", "--net:service0=tap100", guest("ping"), GUEST_IP, "1"
        )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"pyvmm: --tap-read: {guest('ping')} gets no shmstream region (--shm=off)"
    ], result.stderr


def test_tap_read_value_is_checked():
    result = run_pyvmm("--tap-read=io_uring", guest("ping"))
    assert result.returncode != 0
    assert "--tap-read: 'io_uring' is not one of readv, uring, auto" in result.stderr
    assert "Traceback" not in result.stderr
