"""Network end to end, inside a network namespace the test creates and
removes: a tap in it, pyvmm running in it, the sender in it."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import engine_env, guest
from testkit import helpers
from testkit.netns import NetNamespace

pytestmark = [pytest.mark.kvm, pytest.mark.netns]

GUEST_IP = "10.0.0.2"


def start_guest(ns: NetNamespace, *args: str, **kwargs) -> tuple[subprocess.Popen, str]:
    """pyvmm in the namespace, once the guest listens."""
    return ns.start_pyvmm(*args, **kwargs)


def ping(ns: NetNamespace, count: int) -> subprocess.CompletedProcess:
    return helpers.ping(ns, GUEST_IP, count)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_guest_answers_ping_over_tap(engine):
    """Over the plain hypercall path, answered by the C fast path or (as the
    fast path does for anything unclean) by Python."""
    env = engine_env(engine)
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, head = start_guest(
            ns,
            helpers.STATS,
            "--shm=off",
            "--net:service0=tap100",
            guest("ping"),
            GUEST_IP,
            "3",
            env=env,
        )
        ping(ns, 3)
        out, err = vm.communicate(timeout=60)
        assert vm.returncode == 0, out + err
        assert "SUCCESS" in out
    # Which engine answered: every hypercall Python answers is a port-I/O
    # exit that reached pyvmm; the C fast path answers them inside KVM_RUN.
    stats = helpers.parse_stats(err)
    io_exits = stats["exits_to_pyvmm"].get("IoOut", 0)
    if engine == "python":
        assert "hypercalls_in_c" not in stats
        assert io_exits >= 6, stats  # at least 3 requests read, 3 replies written
    else:
        in_c = stats["hypercalls_in_c"]
        assert in_c["net_reads"] >= 3 and in_c["net_writes"] >= 3, in_c


def test_short_net_option_and_guest_sees_real_mtu():
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24", mtu=1400)
        vm, head = start_guest(
            ns,
            "--net=tap100",
            "--net-mac:service0=02:00:00:00:00:2a",
            guest("ping"),
            GUEST_IP,
            "1",
        )
        ping(ns, 1)
        out, err = vm.communicate(timeout=60)
        out = head + out
        assert vm.returncode == 0, out + err
        assert "MTU: 1400" in out
        assert "02:00:00:00:00:2a" in out.lower()


def test_tap_passed_as_open_file_descriptor():
    """--net:NAME=@FD, as orchestrators pass an already opened tap."""
    from pyvmm.devices.net.tap import TapBackend

    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        with ns.inside():
            tap = TapBackend.open("tap100")
        fd = tap.fileno()
        try:
            vm, head = start_guest(
                ns, f"--net:service0=@{fd}", guest("ping"), GUEST_IP, "2", pass_fds=(fd,)
            )
        finally:
            tap.close()  # pyvmm holds its own copy now
        ping(ns, 2)
        out, err = vm.communicate(timeout=60)
        assert vm.returncode == 0, head + out + err


def test_default_mac_is_random_locally_administered_unicast():
    """Without --net-mac the guest gets a random MAC: unicast, locally
    administered, different on each run; and it is the MAC the guest uses on
    the wire (the namespace's neighbour table learnt it from the replies)."""
    macs = []
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        for _ in range(2):
            vm, head = start_guest(ns, "--net=tap100", guest("ping"), GUEST_IP, "2")
            ping(ns, 1)
            # While the guest runs (the tap's neighbours go with its carrier).
            neigh = ns.run(["ip", "neigh", "show", GUEST_IP], capture_output=True, text=True)
            ping(ns, 1)
            out, err = vm.communicate(timeout=60)
            assert vm.returncode == 0, head + out + err
            mac = re.search(r"^MAC: ([0-9a-f:]{17})$", head + out, re.M).group(1)
            assert f"lladdr {mac} " in neigh.stdout, (mac, neigh.stdout)
            macs.append(mac)
    for mac in macs:
        first = int(mac[:2], 16)
        assert first & 0x01 == 0, f"{mac} is a multicast address"
        assert first & 0x02 == 0x02, f"{mac} is not locally administered"
    assert macs[0] != macs[1], "two runs got the same 'random' MAC"


def test_legacy_abi_guest_answers_ping_over_hypercalls(tmp_path):
    """An ABI version 1 unikernel (Solo5 0.9 and older) under --legacy-abi:
    no ring offered, frames go through the net hypercalls."""
    path = helpers.with_abi_version(guest("ping"), tmp_path / "ping-abi1.hvt", 1)
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, head = start_guest(ns, "--legacy-abi", "--net=tap100", str(path), GUEST_IP, "2")
        ping(ns, 2)
        out, err = vm.communicate(timeout=60)
    assert vm.returncode == 0, head + out + err
    assert "path: hypercall" in head


BAD_CALLS = {
    # case: (exit status, what stderr's one line or stdout must say)
    "walltime_ro": (1, "bad pointer in walltime hypercall"),
    "poll_out": (1, "bad pointer in poll hypercall"),
    "read_ro": (1, "is read-only memory"),
    "read_out": (1, "is outside guest memory"),
    "write_out": (1, "bad pointer in net_write hypercall"),
    "write_big": (0, "ret: 2"),
    "read_handle": (0, "ret: 2"),
}


@pytest.mark.parametrize("engine", ["c", "python"])
@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_per_frame_hypercalls_get_the_same_answer_from_c_and_python(case, engine):
    """The C fast path (csrc/hcfast.c) answers only clean hypercalls and
    hands the rest to Python: a bad pointer stops the guest with Python's
    one-line message, a bad handle or length gets EINVAL, either way."""
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        result = ns.run_pyvmm(
            "--shm=off", "--net=tap100", guest("badcall"), case, env=engine_env(engine)
        )
    helpers.check_bad_call(result, *BAD_CALLS[case])


@pytest.mark.parametrize("payload_check", [False, True], ids=["any", "pattern"])
def test_udpsink_takes_ordinary_udp_with_any_and_says_what_to_send_without(payload_check):
    """The README's udpsink example with what a person sends by hand (bash's
    /dev/udp): `any` counts it; without it, the failure names the pattern
    the sink checks and the word that turns the check off."""
    words = [] if payload_check else ["any"]
    with NetNamespace() as ns:
        ns.add_tap("tap100", address="10.0.0.1/24")
        vm, head = start_guest(
            ns, "--net=tap100", guest("udpsink"), GUEST_IP, "5000", *words, "3", "5000"
        )
        assert ("checking the test pattern" in head) == payload_check, head
        sent = ns.run(
            ["bash", "-c", f"for i in 1 2 3; do echo hello > /dev/udp/{GUEST_IP}/5000; done"],
            capture_output=True,
            text=True,
        )
        assert sent.returncode == 0, sent.stderr
        out, err = vm.communicate(timeout=60)
    report = helpers.guest_report(out)
    assert report["frames"] == "3", out + err
    if payload_check:
        assert vm.returncode == 1, out + err
        assert "FAILURE: 3 pattern errors (the test pattern:" in out
        assert "`any` after PORT counts any UDP" in out
    else:
        assert vm.returncode == 0, out + err
        assert report["pattern_errors"] == "0" and "SUCCESS" in out
